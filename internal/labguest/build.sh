#!/bin/bash
# Builds the gpuaas lab test guest: a Debian kernel plus a busybox/dropbear initramfs whose
# /init is a minimal NoCloud consumer, packed as a unified kernel image on a GPT/FAT32 ESP
# and converted to qcow2. Everything comes from Debian packages (apt-get download; no
# install). Usage: build.sh OUTDIR. Writes OUTDIR/guest.qcow2 and OUTDIR/guest.sha256.
set -euo pipefail
out=${1:?usage: build.sh OUTDIR}
need=(apt-get apt-cache dpkg-deb objcopy objdump sfdisk mkfs.vfat mcopy mmd qemu-img sha256sum)
missing=()
for t in "${need[@]}"; do command -v "$t" >/dev/null || missing+=("$t"); done
if ((${#missing[@]})); then
  echo "labguest: missing tools: ${missing[*]} (apt-get install -y binutils fdisk dosfstools mtools qemu-utils)" >&2
  exit 3
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
kpkg=$(apt-cache depends linux-image-amd64 | sed -n 's/.*Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -1)
[ -n "$kpkg" ] || { echo "labguest: cannot resolve the kernel package" >&2; exit 1; }
apt-get download -q "$kpkg" busybox-static dropbear-bin libc6 libcrypt1 libtomcrypt1 libtommath1 libgmp10 zlib1g systemd-boot-efi >/dev/null 2>dl.err || { cat dl.err >&2; exit 1; }
mkdir pkg
for d in *.deb; do dpkg-deb -x "$d" pkg; done
kver=$(ls pkg/lib/modules | head -1)
r=root
mkdir -p $r/{bin,sbin,etc/dropbear,proc,sys,dev,run,tmp,mnt/seed,lib/modules,var/lib/gpuaas,home,root,usr/share/udhcpc}
cp pkg/bin/busybox $r/bin/busybox
for a in acpid wc stty uname id env true false sh mount umount insmod ip ifconfig route udhcpc dd cat grep sed mkdir chmod chown echo sleep ls head tail tr cut date test poweroff reboot sync hostname ps kill printf wget; do ln -s busybox $r/bin/$a; done
cp pkg/usr/sbin/dropbear $r/sbin/ && cp pkg/usr/bin/dropbearkey $r/bin/
mkdir -p $r/lib/x86_64-linux-gnu $r/lib64
# copy every shared library dropbear needs, resolved from the packages (not the host)
done_libs=" "
queue=("$r/sbin/dropbear" "$r/bin/dropbearkey")
while ((${#queue[@]})); do
  f=${queue[0]}; queue=("${queue[@]:1}")
  for l in $(objdump -p "$f" | awk '/NEEDED/{print $2}'); do
    case "$done_libs" in *" $l "*) continue ;; esac
    done_libs+="$l "
    src=$(find pkg -name "$l" | head -1)
    [ -n "$src" ] || { echo "labguest: $l not found in the downloaded packages" >&2; exit 1; }
    cp -L "$src" $r/lib/x86_64-linux-gnu/$l
    queue+=("$r/lib/x86_64-linux-gnu/$l")
  done
done
cp -L "$(find pkg -name libnss_files.so.2 | head -1)" $r/lib/x86_64-linux-gnu/ 2>/dev/null || true
cp -L pkg/lib64/ld-linux-x86-64.so.2 $r/lib64/ 2>/dev/null || cp -L "$(find pkg -name 'ld-linux-x86-64.so.2' | head -1)" $r/lib64/
mods="virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci failover net_failover virtio_net scsi_common scsi_mod virtio_scsi libata libahci ahci cdrom sr_mod isofs evdev button"
for m in $mods; do cp "$(find pkg/lib/modules/$kver -name "$m.ko" | head -1)" $r/lib/modules/; done
echo "$mods" > $r/etc/modules.order
printf 'root:x:0:0:root:/root:/bin/sh\n' > $r/etc/passwd
printf 'root:x:0:\n' > $r/etc/group
printf '/bin/sh\n' > $r/etc/shells
printf 'passwd: files\ngroup: files\n' > $r/etc/nsswitch.conf
cat > $r/usr/share/udhcpc/script <<'S'
#!/bin/sh
case "$1" in
  bound|renew)
    ifconfig "$interface" "$ip" netmask "${subnet:-255.255.255.0}" up
    for g in $router; do route add default gw "$g" dev "$interface" 2>/dev/null; break; done
    echo "$ip" > /run/dhcp-ip ;;
  deconfig) ifconfig "$interface" 0.0.0.0 up ;;
esac
S
chmod 755 $r/usr/share/udhcpc/script
# ACPI power button (virsh shutdown) -> clean poweroff, so release can stop the VM gracefully
mkdir -p $r/etc/acpi/PWRF
printf '#!/bin/sh\necho "gpuaas-guest: power button, powering off" > /dev/console\nsync\npoweroff -f\n' > $r/etc/acpi/PWRF/00000080
chmod 755 $r/etc/acpi/PWRF/00000080
cat > $r/init <<'S'
#!/bin/sh
# gpuaas lab guest: a minimal NoCloud consumer (not cloud-init). It reads the seed volume
# labelled cidata, installs the user-data's SSH keys for the default user, takes an address
# by DHCP, starts dropbear and writes the slice-ready marker. A validation VM's seed also
# holds the validation script ("validate"), which it then runs once.
export PATH=/bin:/sbin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /dev/pts; mount -t devpts devpts /dev/pts
for m in $(cat /etc/modules.order); do insmod /lib/modules/$m.ko 2>/dev/null; done
echo "gpuaas-guest: modules loaded"
acpid -c /etc/acpi -l /dev/null 2>/dev/null
seed=""
for try in 1 2 3 4 5 6 7 8 9 10; do
  for d in /dev/sr* /dev/sd* /dev/vd*; do
    [ -b "$d" ] || continue
    if [ "$(dd if=$d bs=1 skip=32808 count=6 2>/dev/null)" = "cidata" ]; then seed=$d; break 2; fi
  done
  sleep 1
done
ud=/dev/null
if [ -n "$seed" ] && mount -t iso9660 -o ro "$seed" /mnt/seed; then
  echo "gpuaas-guest: seed on $seed"
  for f in /mnt/seed/*; do
    case "$(echo "${f##*/}" | tr A-Z a-z)" in user?data*|user_dat*) ud=$f ;; meta?data*|meta_dat*) md=$f ;; esac
  done
else
  echo "gpuaas-guest: no cidata seed found"; ud=/dev/null
fi
user=$(sed -n 's/^[ -]*name: *//p' $ud | head -1 | tr -d "\"'")
[ -n "$user" ] || user=gpuaas
host=$(sed -n 's/^local-hostname: *//p' ${md:-/dev/null} 2>/dev/null | head -1)
[ -n "$host" ] && hostname "$host"
echo "$user:x:1000:1000:$user:/home/$user:/bin/sh" >> /etc/passwd
echo "$user:x:1000:" >> /etc/group
for h in /root /home/$user; do
  mkdir -p $h/.ssh
  grep -oE '(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp[0-9]+) [A-Za-z0-9+/=]+' $ud > $h/.ssh/authorized_keys
  chmod 700 $h/.ssh; chmod 600 $h/.ssh/authorized_keys
done
chown -R 1000:1000 /home/$user; chmod 755 /home/$user
echo "gpuaas-guest: user $user, $(wc -l < /root/.ssh/authorized_keys 2>/dev/null || echo 0) keys"
ifconfig lo 127.0.0.1 up
ip link set eth0 up
udhcpc -i eth0 -s /usr/share/udhcpc/script -t 20 -T 2 -A 2 -b -x hostname:"${host:-gpuaas}"
echo "gpuaas-guest: address $(cat /run/dhcp-ip 2>/dev/null)"
dropbearkey -t ed25519 -f /etc/dropbear/dropbear_ed25519_host_key >/dev/null 2>&1
dropbear -r /etc/dropbear/dropbear_ed25519_host_key -s -E -p 22 2>/dev/console
mkdir -p /var/lib/gpuaas && date -u +%FT%TZ > /var/lib/gpuaas/slice-ready
chmod 755 /var/lib/gpuaas; chmod 644 /var/lib/gpuaas/slice-ready
echo "gpuaas-guest: ready"
for f in /mnt/seed/*; do
  case "$(echo "${f##*/}" | tr A-Z a-z)" in
    validate*) echo "gpuaas-guest: running the validation script"; (sh "$f"; echo "gpuaas-guest: validation script exited $?") >/dev/console 2>&1 & ;;
  esac
done
while true; do sleep 3600; done
S
chmod 755 $r/init
(cd $r && find . | ./bin/busybox cpio -o -H newc 2>/dev/null) | gzip -9 > initrd.gz
stub=$(find pkg -name 'linuxx64.efi.stub' | head -1)
# no_timer_check: under software emulation on a busy host the kernel's check that the IO-APIC
# timer ticks can fail ("MP-BIOS bug: 8254 timer not connected to IO-APIC") and the boot stall
# there (a lab_vm run got no DHCP lease in 90 s); virtual machines' kernels commonly skip it.
echo "console=ttyS0 quiet panic=-1 no_timer_check" > cmdline
objcopy --add-section .osrel=/etc/os-release --change-section-vma .osrel=0x20000 \
  --add-section .cmdline=cmdline --change-section-vma .cmdline=0x30000 \
  --add-section .linux=pkg/boot/vmlinuz-$kver --change-section-vma .linux=0x2000000 \
  --add-section .initrd=initrd.gz --change-section-vma .initrd=0x3000000 \
  "$stub" BOOTX64.EFI
size=$(( ( $(stat -c %s BOOTX64.EFI) / 1048576 + 40 ) ))
truncate -s $((size + 2))M disk.raw
printf 'label: gpt\nstart=2048, type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B, name="ESP"\n' | sfdisk -q disk.raw
truncate -s ${size}M esp.img
mkfs.vfat -F 32 -n GPUAASESP esp.img >/dev/null
mmd -i esp.img ::/EFI ::/EFI/BOOT
mcopy -i esp.img BOOTX64.EFI ::/EFI/BOOT/BOOTX64.EFI
dd if=esp.img of=disk.raw bs=1M seek=1 conv=notrunc status=none
mkdir -p "$out"
qemu-img convert -q -f raw -O qcow2 disk.raw "$out/guest.qcow2.tmp"
mv "$out/guest.qcow2.tmp" "$out/guest.qcow2"
sha256sum "$out/guest.qcow2" | cut -d' ' -f1 > "$out/guest.sha256"
echo "$kpkg" > "$out/kernel"
echo "labguest: built $out/guest.qcow2 ($kpkg)"
