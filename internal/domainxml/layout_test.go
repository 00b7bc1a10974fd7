package domainxml

import (
	"encoding/xml"
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/cpuset"
)

// genSpec is a production VM over a generated host: nodes NUMA nodes of cores cores each
// (SMT siblings at +nodes*cores), the first core of each node and its sibling kept for
// housekeeping, the rest dealt to the slots of that node; the VM takes some slots of some
// nodes, listed in the plan in a shuffled order (slots of one node need not be adjacent).
func genSpec(r *rand.Rand) (Spec, [][]int) {
	nodes, cores := 1+r.Intn(3), 8+r.Intn(24)
	sib := nodes * cores
	var hk []int
	var bundles []Bundle
	var slotCPUs [][]int
	gpu := 0
	for n := 0; n < nodes; n++ {
		base := n * cores
		hk = append(hk, base, base+sib)
		perNode := 1 + r.Intn(4)
		per := (cores - 1) / perNode
		for k := 0; k < perNode; k++ {
			if r.Intn(3) == 0 {
				continue // a slot of this node the VM does not take
			}
			var cpus []int
			for c := base + 1 + k*per; c < base+1+(k+1)*per; c++ {
				cpus = append(cpus, c, c+sib)
			}
			node := n
			b := Bundle{GPUPCI: fmt.Sprintf("0000:%02x:00.0", 0x10+gpu), FabricVFPCI: fmt.Sprintf("0000:%02x:00.2", 0x80+gpu),
				Disk: fmt.Sprintf("/dev/disk/by-id/nvme-eui.%016x", gpu), NUMANode: &node, MemoryNode: &node,
				VCPUs: 1 + r.Intn(len(cpus)), MemoryMiB: 1024 * (1 + r.Intn(64)), CPUs: cpus}
			gpu++
			bundles = append(bundles, b)
			slotCPUs = append(slotCPUs, cpus)
		}
	}
	if len(bundles) == 0 {
		return genSpec(r)
	}
	r.Shuffle(len(bundles), func(i, j int) {
		bundles[i], bundles[j] = bundles[j], bundles[i]
		slotCPUs[i], slotCPUs[j] = slotCPUs[j], slotCPUs[i]
	})
	s := prod()
	s.Bundles, s.HousekeepingCPUs, s.VCPUs, s.MemoryMiB = bundles, hk, 0, 0
	for _, b := range bundles {
		s.VCPUs += b.VCPUs
		s.MemoryMiB += b.MemoryMiB
	}
	return s, slotCPUs
}

// h200Spec is the 8-slot VM of an 8-GPU host: slots 0-3 on NUMA node 0, 4-7 on node 1.
func h200Spec() Spec {
	s := prod()
	s.Bundles, s.VCPUs, s.MemoryMiB = nil, 0, 0
	s.HousekeepingCPUs = []int{0, 48, 96, 144}
	for i := 0; i < 8; i++ {
		node := i / 4
		first := node*48 + 1 + (i%4)*11
		cpus := span(first, first+10, first+96, first+106)
		s.Bundles = append(s.Bundles, Bundle{GPUPCI: fmt.Sprintf("0000:%02x:00.0", 0x10+i), FabricVFPCI: fmt.Sprintf("0000:%02x:00.2", 0x80+i),
			Disk: fmt.Sprintf("/dev/disk/by-id/nvme-eui.%016x", i), NUMANode: &node, MemoryNode: &node, VCPUs: 22, MemoryMiB: 131072, CPUs: cpus})
		s.VCPUs += 22
		s.MemoryMiB += 131072
	}
	return s
}

// checkLayout reads the domain back and checks every placement promise against the spec.
func checkLayout(t *testing.T, s Spec, x []byte) {
	t.Helper()
	var d domain
	if err := xml.Unmarshal(x, &d); err != nil {
		t.Fatal(err)
	}
	slotOfCPU := map[int]int{}
	for i, b := range s.Bundles {
		for _, c := range b.CPUs {
			slotOfCPU[c] = i
		}
	}
	// Every vCPU pinned once, to one CPU of exactly one slot, each slot getting its own count.
	if d.CPUTune == nil || len(d.CPUTune.Pins) != s.VCPUs {
		t.Fatalf("%d vCPU pins for %d vCPUs", len(d.CPUTune.Pins), s.VCPUs)
	}
	slotOfVCPU := map[int]int{}
	perSlot := map[int]int{}
	used := map[int]bool{}
	for _, p := range d.CPUTune.Pins {
		c, err := strconv.Atoi(p.CPUSet)
		if err != nil {
			t.Fatalf("vCPU %d pinned to %q, not one CPU", p.VCPU, p.CPUSet)
		}
		i, ok := slotOfCPU[c]
		if !ok {
			t.Fatalf("vCPU %d pinned to CPU %d, outside every slot's set", p.VCPU, c)
		}
		if used[c] {
			t.Fatalf("CPU %d carries two vCPUs", c)
		}
		if _, dup := slotOfVCPU[p.VCPU]; dup || p.VCPU < 0 || p.VCPU >= s.VCPUs {
			t.Fatalf("vCPU %d pinned twice or out of range", p.VCPU)
		}
		used[c], slotOfVCPU[p.VCPU] = true, i
		perSlot[i]++
	}
	for i, b := range s.Bundles {
		if perSlot[i] != b.VCPUs {
			t.Fatalf("slot %d: %d vCPUs on its CPUs, want %d", i, perSlot[i], b.VCPUs)
		}
	}
	hk := cpuset.Format(s.HousekeepingCPUs)
	if d.CPUTune.EmulatorPin == nil || d.CPUTune.EmulatorPin.CPUSet != hk || len(d.CPUTune.IOThreadPin) != 1 || d.CPUTune.IOThreadPin[0].CPUSet != hk {
		t.Fatalf("emulator/iothread pins %+v %+v, want housekeeping %s", d.CPUTune.EmulatorPin, d.CPUTune.IOThreadPin, hk)
	}
	// One guest cell per host node, in node order; each vCPU in the cell of its slot's node,
	// each cell's memory its slots' memory, bound strictly to that node.
	var nodes []int
	for _, b := range s.Bundles {
		nodes = append(nodes, *b.NUMANode)
	}
	nodes = cpuset.Union(nodes)
	if d.CPU == nil || d.CPU.NUMA == nil || len(d.CPU.NUMA.Cells) != len(nodes) {
		t.Fatalf("guest cells %+v for host nodes %v", d.CPU, nodes)
	}
	for ci, c := range d.CPU.NUMA.Cells {
		vcpus, err := cpuset.Parse(c.CPUs)
		if err != nil || c.ID != ci {
			t.Fatalf("cell %+v: %v", c, err)
		}
		mem := 0
		for _, b := range s.Bundles {
			if *b.NUMANode == nodes[ci] {
				mem += b.MemoryMiB
			}
		}
		for _, v := range vcpus {
			if n := *s.Bundles[slotOfVCPU[v]].NUMANode; n != nodes[ci] {
				t.Fatalf("vCPU %d in guest cell %d (node %d) but pinned to slot %d on node %d", v, ci, nodes[ci], slotOfVCPU[v], n)
			}
		}
		if c.Memory != mem || c.Unit != "MiB" {
			t.Fatalf("cell %d memory %d %s, want %d MiB", ci, c.Memory, c.Unit, mem)
		}
	}
	nt := d.NUMATune
	if nt == nil || nt.Memory.Mode != "strict" || nt.Memory.Nodeset != cpuset.Format(nodes) || len(nt.Memnodes) != len(nodes) {
		t.Fatalf("numatune %+v, want strict on %v with a memnode per cell", nt, nodes)
	}
	for ci, m := range nt.Memnodes {
		if m.CellID != ci || m.Mode != "strict" || m.Nodeset != strconv.Itoa(nodes[ci]) {
			t.Fatalf("memnode %+v, want cell %d strict on node %d", m, ci, nodes[ci])
		}
	}
	// Each device under a root port whose bus is the expander bus bound to its slot's cell.
	ctl := map[string]controller{}
	for _, c := range d.Devices.Controllers {
		if c.Type == "pci" {
			ctl[fmt.Sprintf("0x%02x", c.Index)] = c
		}
	}
	cellOf := func(a *devAddress) int {
		t.Helper()
		if a == nil || a.Type != "pci" {
			t.Fatalf("device without a PCI address: %+v", a)
		}
		port, ok := ctl[a.Bus]
		if !ok || port.Model != "pcie-root-port" || port.Address == nil {
			t.Fatalf("device on bus %s, not a root port: %+v", a.Bus, port)
		}
		pxb := ctl[port.Address.Bus]
		if pxb.Model != "pcie-expander-bus" || pxb.Target == nil {
			t.Fatalf("root port %d on bus %s, not an expander bus: %+v", port.Index, port.Address.Bus, pxb)
		}
		return pxb.Target.Node
	}
	wantCell := func(i int) int {
		for ci, n := range nodes {
			if n == *s.Bundles[i].NUMANode {
				return ci
			}
		}
		return -1
	}
	for _, c := range d.Devices.Controllers {
		if c.Type == "scsi" {
			if got := cellOf(c.Address); got != wantCell(c.Index) {
				t.Fatalf("slot %d disk controller in guest cell %d, want %d", c.Index, got, wantCell(c.Index))
			}
		}
	}
	for _, h := range d.Devices.Hostdevs {
		src := fmt.Sprintf("%s:%s:%s.%s", strings.TrimPrefix(h.Source.Address.Domain, "0x"), strings.TrimPrefix(h.Source.Address.Bus, "0x"),
			strings.TrimPrefix(h.Source.Address.Slot, "0x"), strings.TrimPrefix(h.Source.Address.Function, "0x"))
		for i, b := range s.Bundles {
			if b.GPUPCI == src || b.FabricVFPCI == src {
				if got := cellOf(h.Address); got != wantCell(i) {
					t.Fatalf("slot %d device %s in guest cell %d, want %d", i, src, got, wantCell(i))
				}
			}
		}
	}
	for i, dk := range d.Devices.Disks[:len(s.Bundles)] {
		if dk.Address == nil || dk.Address.Controller != strconv.Itoa(i) {
			t.Fatalf("slot %d disk on controller %+v", i, dk.Address)
		}
	}
}

func TestEightSlotTwoNodeDomain(t *testing.T) {
	s := h200Spec()
	x, err := Build(s)
	if err != nil {
		t.Fatal(err)
	}
	checkLayout(t, s, x)
	str := string(x)
	for _, want := range []string{`<cell id="0" cpus="0-87" memory="524288" unit="MiB">`, `<cell id="1" cpus="88-175" memory="524288" unit="MiB">`,
		`<memnode cellid="0" mode="strict" nodeset="0">`, `<memnode cellid="1" mode="strict" nodeset="1">`, `<vcpupin vcpu="0" cpuset="1">`,
		`<vcpupin vcpu="88" cpuset="49">`, `<node>0</node>`, `<node>1</node>`} {
		if !strings.Contains(str, want) {
			t.Errorf("domain lacks %s", want)
		}
	}
	if n := strings.Count(str, `model="pcie-expander-bus"`); n != 2 {
		t.Errorf("%d expander buses, want one per guest cell (2)", n)
	}
	validate(t, x)
}

// Property: over generated hosts and plans, every pin is inside its slot's set, each cell
// holds exactly its node's slots, memory is bound strictly per cell, and every device sits
// under its cell's expander bus.
func TestLayoutPropertiesOverGeneratedPlans(t *testing.T) {
	r := rand.New(rand.NewSource(31))
	for n := 0; n < 300; n++ {
		s, _ := genSpec(r)
		x, err := Build(s)
		if err != nil {
			t.Fatalf("case %d: %v", n, err)
		}
		checkLayout(t, s, x)
		if n < 3 {
			validate(t, x)
		}
	}
}

func TestPinningRefusals(t *testing.T) {
	cases := map[string]struct {
		mut  func(*Spec)
		want string
	}{
		"fewer CPUs than vCPUs": {func(s *Spec) { s.Bundles[0].CPUs = s.Bundles[0].CPUs[:4] }, "slot 0 has 24 vCPUs but only 4 host CPUs (2-5): refusing to over-subscribe"},
		"two slots share a CPU": {func(s *Spec) { s.Bundles[1].CPUs = append(s.Bundles[1].CPUs, s.Bundles[0].CPUs[0]) }, "host CPU 2 belongs to slots 0 and 1"},
		"housekeeping on a slot": {func(s *Spec) { s.HousekeepingCPUs = append(s.HousekeepingCPUs, s.Bundles[1].CPUs[3]) },
			"housekeeping CPU 17 is slot 1's"},
		"shares do not add up":       {func(s *Spec) { s.Bundles[0].VCPUs = 10 }, "add up to 34, the domain has 48"},
		"memory off the slot's node": {func(s *Spec) { s.Bundles[0].MemoryNode = numa(1) }, "slot 0: memory bound to node 1"},
		"cell without vCPUs": {func(s *Spec) {
			s.Bundles[1].NUMANode, s.Bundles[1].MemoryNode, s.Bundles[1].VCPUs, s.Bundles[0].VCPUs, s.Bundles[1].CPUs = numa(1), numa(1), 0, 48, nil
			s.Bundles[0].CPUs = span(2, 25, 98, 121)
		}, "guest cell of NUMA node 1 gets 0 vCPUs"},
	}
	for name, c := range cases {
		s := prod()
		c.mut(&s)
		if x, err := Build(s); err == nil {
			t.Errorf("%s: built\n%s", name, x)
		} else if !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "domainxml: ") {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
}

// Without per-slot counts the VM's vCPUs and memory are split evenly across its slots.
func TestEvenSharesWhenSlotsCarryNone(t *testing.T) {
	s := prod()
	s.VCPUs, s.MemoryMiB = 7, 1001
	for i := range s.Bundles {
		s.Bundles[i].VCPUs, s.Bundles[i].MemoryMiB = 0, 0
	}
	x, err := Build(s)
	if err != nil {
		t.Fatal(err)
	}
	str := string(x)
	if !strings.Contains(str, `<vcpupin vcpu="3" cpuset="5">`) || !strings.Contains(str, `<vcpupin vcpu="4" cpuset="14">`) ||
		!strings.Contains(str, `memory="1001"`) {
		t.Fatalf("uneven split:\n%s", x)
	}
}
