#!/bin/bash
# Builds the gpuaas lab host image: a small Debian 12 root filesystem (debootstrap from the
# Debian mirror) with the Debian kernel, libvirt + QEMU, OVMF, Open vSwitch, nvme-cli and
# OpenSSH, packed as a raw ext4 image, plus the kernel and initramfs to boot it directly.
# gpuaas binaries are not in the image: each run shares them in (labhost.Machine).
# Usage: build.sh OUTDIR. Writes OUTDIR/rootfs.img, OUTDIR/vmlinuz, OUTDIR/initrd.img.
set -euo pipefail
out=${1:?usage: build.sh OUTDIR}
mirror=${GPUAAS_LABHOST_MIRROR:-http://deb.debian.org/debian}
for t in debootstrap mkfs.ext4 du; do
  command -v "$t" >/dev/null || { echo "labhost: missing $t (apt-get install -y debootstrap e2fsprogs)" >&2; exit 3; }
done
pkgs=(
  linux-image-amd64 initramfs-tools kmod udev iproute2 pciutils procps util-linux e2fsprogs
  nvme-cli libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients qemu-system-x86 qemu-utils ovmf
  openvswitch-switch openssh-server ca-certificates dosfstools mtools iptables busybox
)
mkdir -p "$out"
r="$out/rootfs.tmp"
rm -rf "$r"
debootstrap --variant=minbase --include="$(IFS=,; echo "${pkgs[*]}")" bookworm "$r" "$mirror" >"$out/debootstrap.log" 2>&1 ||
  { tail -20 "$out/debootstrap.log" >&2; exit 1; }
# PID 1 of the lab host: mounts the run's share (its script and our binaries) and runs it.
cat >"$r/sbin/gpuaas-labhost-init" <<'INIT'
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
modprobe 9pnet_virtio && modprobe 9p
mkdir -p /gpuaas
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 gpuaas /gpuaas || { echo "labhost: no share"; sleep 5; poweroff -f; }
exec /bin/bash /gpuaas/init.sh
INIT
chmod 0755 "$r/sbin/gpuaas-labhost-init"
echo gpuaas-labhost >"$r/etc/hostname"
: >"$r/etc/fstab"
rm -f "$r"/etc/ssh/ssh_host_* # generated at each boot
chroot "$r" apt-get clean
rm -rf "$r"/var/lib/apt/lists/* "$r"/usr/share/doc/* "$r"/usr/share/man/*
kver=$(ls "$r/lib/modules" | head -1)
cp "$r/boot/vmlinuz-$kver" "$out/vmlinuz.tmp"
cp "$r/boot/initrd.img-$kver" "$out/initrd.img.tmp"
size=$(( $(du -sm "$r" | cut -f1) * 3 / 2 + 1024 ))
rm -f "$out/rootfs.img.tmp"
mkfs.ext4 -q -F -L gpuaas-labhost -d "$r" "$out/rootfs.img.tmp" "${size}M"
rm -rf "$r"
mv "$out/vmlinuz.tmp" "$out/vmlinuz"
mv "$out/initrd.img.tmp" "$out/initrd.img"
mv "$out/rootfs.img.tmp" "$out/rootfs.img"
echo "$kver" >"$out/kernel"
