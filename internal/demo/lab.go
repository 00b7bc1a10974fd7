package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/labguest"
)

// lab is the real-VM path's host side: a Linux bridge, two loop devices named like slot NVMe,
// and the project's test guest served over HTTP. close undoes all of it.
type lab struct {
	bridge, cidr string
	disks        []string // /dev/disk/by-id/... names
	undo         []func()
	imageURL     string
	imageSHA256  string
}

func (l *lab) close() {
	for i := len(l.undo) - 1; i >= 0; i-- {
		l.undo[i]()
	}
}

func sh(args ...string) (string, error) {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

func setupLab(dir string) (*lab, error) {
	l := &lab{bridge: "gpuaasdemo0", cidr: "10.100.9.1/24"}
	_, _ = sh("ip", "link", "del", l.bridge)
	for _, c := range [][]string{{"ip", "link", "add", l.bridge, "type", "bridge"}, {"ip", "addr", "add", l.cidr, "dev", l.bridge}, {"ip", "link", "set", l.bridge, "up"}} {
		if _, err := sh(c...); err != nil {
			l.close()
			return nil, err
		}
		if c[2] == "add" && c[3] == l.bridge {
			l.undo = append(l.undo, func() { _, _ = sh("ip", "link", "del", l.bridge) })
		}
	}
	for i, size := range []string{"256M", "64M"} {
		file := filepath.Join(dir, fmt.Sprintf("nvme%d.img", i))
		if _, err := sh("truncate", "-s", size, file); err != nil {
			l.close()
			return nil, err
		}
		dev, err := sh("losetup", "-f", "--show", file)
		if err != nil {
			l.close()
			return nil, err
		}
		l.undo = append(l.undo, func() {
			labguest.DestroyDomainsUsing(dev) // a demo that failed half-way may leave its VM on this disk
			_, _ = sh("losetup", "-d", dev)
		})
		link := fmt.Sprintf("/dev/disk/by-id/gpuaas-demo-nvme%d", i)
		_ = os.MkdirAll(filepath.Dir(link), 0o755)
		_ = os.Remove(link)
		if err := os.Symlink(dev, link); err != nil {
			l.close()
			return nil, err
		}
		l.undo = append(l.undo, func() { _ = os.Remove(link) })
		l.disks = append(l.disks, link)
		fmt.Printf("(%s -> %s: a loop device standing in for a slot NVMe)\n", link, dev)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	fmt.Println("(building the test guest from Debian packages, or taking it from the cache: a kernel and a busybox/dropbear initramfs on a UEFI disk)")
	img, err := labguest.Ensure(ctx, hostfs.Exec{})
	if err != nil {
		l.close()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		l.close()
		return nil, err
	}
	srv := &http.Server{Handler: http.FileServer(http.Dir(filepath.Dir(img.Path))), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "image server:", err)
		}
	}()
	l.undo = append(l.undo, func() { _ = srv.Close() })
	l.imageURL, l.imageSHA256 = "http://"+ln.Addr().String()+"/guest.qcow2", img.SHA256
	return l, nil
}

// slotsYAML is the lab node's slot map: two slots on NUMA 0 with the loop disks, slot i
// owning host CPU i (the lab host has two CPUs; none is kept back for housekeeping).
func (l *lab) slotsYAML() string {
	var b strings.Builder
	b.WriteString("housekeeping_cpus: \"\"\nslots:\n")
	for i, disk := range l.disks {
		fmt.Fprintf(&b, `  - slot_index: %d
    pci_address: 0000:%02x:00.0
    gpu_model: NVIDIA H200
    gpu_memory_mib: 143771
    numa_node: 0
    nvme_device: %s
    network_fabric: infiniband
    network_device: mlx5_%d
    fabric_pci_address: 0000:%02x:00.0
    mac_address: "52:54:00:09:00:%02x"
    private_ip: 10.100.9.%d
    vcpu_count: 1
    host_cpus: "%d"
    memory_mib: 256
    capacity_metadata:
      destructive_wipe_policy: blkdiscard_zero_verify
      fabric_claim_mode: per_slot_vf
      fabric_vf_pci_address: 0000:%02x:00.2
      storage_ownership: slice
`, i, 0x1b+i, disk, i, 0x1a+i, i, 10+i, i, 0x1a+i)
	}
	return b.String()
}
