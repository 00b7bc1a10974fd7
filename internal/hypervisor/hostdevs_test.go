package hypervisor

import (
	"slices"
	"testing"
)

// A domain's live XML (as libvirt returns it, with its own attributes around ours) yields
// its PCI hostdevs' source addresses, and nothing from other device kinds.
func TestParsePCIHostdevs(t *testing.T) {
	const x = `<domain type='qemu' id='3'><name>gpuaas-a</name><devices>
  <disk type='block' device='disk'><source dev='/dev/nvme0n1'/><address type='drive' controller='0' bus='0' target='0' unit='0'/></disk>
  <hostdev mode='subsystem' type='pci' managed='no'>
    <driver name='vfio'/>
    <source><address domain='0x0000' bus='0x21' slot='0x00' function='0x0'/></source>
    <alias name='hostdev0'/>
    <address type='pci' domain='0x0000' bus='0x01' slot='0x01' function='0x0'/>
  </hostdev>
  <hostdev mode='subsystem' type='pci' managed='no'>
    <source><address domain='0x0000' bus='0x23' slot='0x00' function='0x3'/></source>
  </hostdev>
  <hostdev mode='subsystem' type='usb'><source><vendor id='0x1234'/></source></hostdev>
</devices></domain>`
	got, err := ParsePCIHostdevs(x)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"0000:21:00.0", "0000:23:00.3"}; !slices.Equal(got, want) {
		t.Fatalf("hostdevs %v, want %v", got, want)
	}
	if _, err := ParsePCIHostdevs(`<domain><devices><hostdev type='pci'><source><address domain='zz'/></source></hostdev></devices></domain>`); err == nil {
		t.Fatal("a malformed hostdev address was accepted")
	}
}
