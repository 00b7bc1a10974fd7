#!/bin/bash
# Copies what discovery reads from this host into a tree (the layout of
# internal/topology/fixture: real directories for devices, links with their kernel targets) and
# packs it as OUT.tar.gz, so `make test` runs discovery on a real kernel's sysfs.
# Usage: snapshot.sh OUT.tar.gz
set -euo pipefail
out=${1:?usage: snapshot.sh OUT.tar.gz}
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
copy() { # copy readable regular files named $2.. of directory $1
  local d=$1; shift
  mkdir -p "$t$d"
  for f in "$@"; do [ -f "$d/$f" ] && [ -r "$d/$f" ] && cat "$d/$f" >"$t$d/$f" 2>/dev/null || true; done
}
link() { # reproduce link $1 with its raw target
  mkdir -p "$t$(dirname "$1")"
  ln -sfn "$(readlink "$1")" "$t$1"
}
for l in /sys/bus/pci/devices/*; do
  link "$l"
  real=$(readlink -f "$l")
  copy "$real" vendor device class subsystem_vendor subsystem_device numa_node local_cpulist sriov_totalvfs sriov_numvfs \
    current_link_speed current_link_width max_link_speed max_link_width reset_method
  for x in driver iommu_group physfn "$real"/virtfn*; do
    x=$(basename "$x")
    [ -L "$real/$x" ] && link "$real/$x"
  done
done
for g in /sys/kernel/iommu_groups/*/devices/*; do link "$g"; done
for c in /sys/class/nvme/*; do mkdir -p "$t$c"; ln -sfn "$(readlink "$c/device")" "$t$c/device"; copy "$c" serial model firmware_rev; done
for b in /sys/block/nvme*n*; do
  copy "$b" size
  for p in "$b"/$(basename "$b")p*; do [ -d "$p" ] && copy "$p" partition; done
done
for n in /sys/devices/system/node/node[0-9]*; do
  copy "$n" cpulist
  copy "$n/hugepages/hugepages-1048576kB" nr_hugepages free_hugepages
done
for c in /sys/devices/system/cpu/cpu[0-9]*; do copy "$c/topology" core_cpus_list thread_siblings_list; done
for n in /sys/class/net/*; do copy "$n" address; done
for l in /dev/disk/by-id/*; do link "$l"; done
for d in /dev/nvme*n*; do [ -b "$d" ] && : >"$t/dev/$(basename "$d")"; done # probed as empty: no signature
mkdir -p "$t/proc"
grep -v -e ' /gpuaas ' /proc/mounts >"$t/proc/mounts"
uname -r >"$t/kernel-release"
tar -C "$t" -czf "$out" .
