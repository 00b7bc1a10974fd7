#!/bin/bash
# PID 1 of a lab host run (started by /sbin/gpuaas-labhost-init from the image). Brings the
# host up the way a slice host's boot and `gpuaas-hostd bootstrap` leave it: udev, the
# network (QEMU user networking: the machine that runs the test is 10.0.2.2), vfio-pci and
# openvswitch modules, SR-IOV VFs enabled on the fabric stand-in, the OVS slice bridge,
# virtlogd + libvirtd, and sshd for the test to drive it. gpuaas binaries are in /gpuaas/bin.
exec > >(tee /gpuaas/out/init.log >/dev/console) 2>&1
set -x
mount -o remount,rw /
mkdir -p /dev/pts /dev/shm /run /tmp /sys/fs/cgroup
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mkdir -p /dev/hugepages
mount -t hugetlbfs -o pagesize=1G hugetlbfs /dev/hugepages
hostname gpuaas-labhost
echo "127.0.1.1 gpuaas-labhost" >>/etc/hosts
export PATH=/gpuaas/bin:/usr/sbin:/usr/bin:/sbin:/bin
/lib/systemd/systemd-udevd --daemon
udevadm trigger --action=add
udevadm settle --timeout=60
ip link set lo up
nic=$(ls /sys/class/net | grep -v -e '^lo$' | head -1)
ip link set "$nic" up
ip addr add 10.0.2.15/24 dev "$nic"
ip route add default via 10.0.2.2
echo "nameserver 10.0.2.3" >/etc/resolv.conf
modprobe vfio-pci
modprobe openvswitch
modprobe tun # the slice VMs' network devices
# SR-IOV: the fabric stand-ins (NVMe controllers that offer VFs and hold no namespace) get
# their VFs, as the host bootstrap does for the real fabric NIC.
for d in /sys/bus/pci/devices/*; do
  [ -r "$d/sriov_totalvfs" ] && [ "$(cat "$d/sriov_totalvfs")" -gt 0 ] || continue
  cat "$d/sriov_totalvfs" >"$d/sriov_numvfs"
done
mkdir -p /root/.ssh /run/sshd
install -m 0600 /gpuaas/authorized_keys /root/.ssh/authorized_keys
ssh-keygen -q -t ed25519 -N "" -f /etc/ssh/ssh_host_ed25519_key # RSA keys take long under emulation
/usr/sbin/sshd
mkdir -p /var/run/openvswitch
/usr/share/openvswitch/scripts/ovs-ctl start --system-id=random --no-monitor
ovs-vsctl --may-exist add-br ovsbr0
ip addr add 10.100.0.1/24 dev ovsbr0 # the slice network's router address, as the host bootstrap sets it
ip link set ovsbr0 up
# What libvirt-daemon-system's maintainer scripts do on a full install: QEMU's user.
getent group kvm >/dev/null || groupadd -r kvm
getent group libvirt-qemu >/dev/null || groupadd -r libvirt-qemu
getent passwd libvirt-qemu >/dev/null || useradd -r -g libvirt-qemu -G kvm -d /var/lib/libvirt -s /usr/sbin/nologin libvirt-qemu
mkdir -p /var/log/libvirt/qemu /var/lib/libvirt/qemu /run/libvirt
virtlogd -d
LIBVIRT_LOG_OUTPUTS="3:file:/gpuaas/out/libvirtd.log" libvirtd -d
# libvirtd probes QEMU's capabilities at its first start: minutes under emulation.
for _ in $(seq 1 900); do virsh -c qemu:///system uri >/dev/null 2>&1 && break; sleep 1; done
touch /gpuaas/out/ready
set +x
# PID 1 reaps orphans until the test powers the host off.
trap 'poweroff -f' TERM
while :; do wait; sleep 1; done
