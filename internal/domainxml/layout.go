package domainxml

import (
	"fmt"
	"sort"
	"strconv"

	"github.com/gpuaas/gpuaas/internal/cpuset"
)

// layout places a VM's slots: which vCPUs each slot gets and the host CPUs they are pinned
// to, the guest NUMA cells (one per host node the slots sit on) with their vCPUs and memory,
// the host node each cell's memory is bound to, and a PCIe expander bus per cell with one root
// port per device of the cell's slots. The guest then reads the truth from ACPI: which vCPUs,
// memory, GPUs, VFs and disks share a NUMA node (nvidia-smi topo -m, NCCL).
type layout struct {
	s      Spec
	vcpus  []int // per slot: its vCPU count
	mem    []int // per slot: its memory (MiB)
	first  []int // per slot: its first vCPU
	cells  []cell
	pci    []controller // pcie-root, expander buses and root ports (nil without cells)
	portOf map[[2]int]int
}

// cell is one guest NUMA node.
type cell struct {
	node    int  // the host node (and the slots' numa_node)
	memNode *int // where its memory is bound on the host (nil: not bound)
	slots   []int
	vcpus   []int
	memMiB  int
}

// devicesPerSlot is the root ports a slot needs: its disk's SCSI controller, then (with
// passthrough) its GPU and its fabric VF.
func devicesPerSlot(s Spec) int {
	if s.Emulated {
		return 1
	}
	return 3
}

// lowestExpanderBus keeps the bus numbers below it for the root complex's own root ports (the
// NIC, the SATA CD-ROM and whatever libvirt adds there).
const lowestExpanderBus = 0x20

func plan(s Spec) (*layout, error) {
	n := len(s.Bundles)
	l := &layout{s: s, portOf: map[[2]int]int{}}
	var err error
	own := func(f func(Bundle) int) []int {
		out := make([]int, n)
		for i, b := range s.Bundles {
			out[i] = f(b)
		}
		return out
	}
	if l.vcpus, err = Shares(s.VCPUs, own(func(b Bundle) int { return b.VCPUs })); err != nil {
		return nil, fmt.Errorf("domainxml: vCPUs: %v", err)
	}
	if l.mem, err = Shares(s.MemoryMiB, own(func(b Bundle) int { return b.MemoryMiB })); err != nil {
		return nil, fmt.Errorf("domainxml: memory: %v", err)
	}
	known := true
	for i, b := range s.Bundles {
		if b.NUMANode == nil {
			known = false
		} else if *b.NUMANode < 0 || *b.NUMANode > 1023 {
			return nil, fmt.Errorf("domainxml: slot %d: NUMA node %d out of range", i, *b.NUMANode)
		}
		if b.MemoryNode != nil && (b.NUMANode == nil || *b.MemoryNode != *b.NUMANode) {
			return nil, fmt.Errorf("domainxml: slot %d: memory bound to node %d, not its NUMA node", i, *b.MemoryNode)
		}
	}
	// vCPUs are numbered cell by cell (slots in plan order within a cell), so each guest cell
	// holds a contiguous vCPU range.
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	if known {
		byNode := map[int]int{}
		for i, b := range s.Bundles {
			c, ok := byNode[*b.NUMANode]
			if !ok {
				c = len(l.cells)
				byNode[*b.NUMANode] = c
				l.cells = append(l.cells, cell{node: *b.NUMANode, memNode: b.MemoryNode})
			}
			l.cells[c].slots = append(l.cells[c].slots, i)
			if b.MemoryNode == nil {
				l.cells[c].memNode = nil // a cell is bound only when all its slots are
			}
		}
		sort.SliceStable(l.cells, func(a, b int) bool { return l.cells[a].node < l.cells[b].node })
		order = order[:0]
		for _, c := range l.cells {
			order = append(order, c.slots...)
		}
	}
	l.first = make([]int, n)
	next := 0
	for _, i := range order {
		l.first[i] = next
		next += l.vcpus[i]
	}
	for ci := range l.cells {
		c := &l.cells[ci]
		for _, i := range c.slots {
			for k := 0; k < l.vcpus[i]; k++ {
				c.vcpus = append(c.vcpus, l.first[i]+k)
			}
			c.memMiB += l.mem[i]
		}
		if len(c.vcpus) == 0 || c.memMiB == 0 {
			return nil, fmt.Errorf("domainxml: guest cell of NUMA node %d gets %d vCPUs and %d MiB: every cell needs both", c.node, len(c.vcpus), c.memMiB)
		}
	}
	if err := l.checkPins(); err != nil {
		return nil, err
	}
	return l, l.expanderBuses()
}

// Shares is each slot's part of total: the slots' own values when any is set (they must add
// up to total), else total split evenly (the first slots take the remainder).
func Shares(total int, own []int) ([]int, error) {
	n := len(own)
	if n == 0 {
		return nil, fmt.Errorf("no slots")
	}
	out := make([]int, n)
	sum, set := 0, false
	for i := range out {
		out[i] = own[i]
		if out[i] < 0 {
			return nil, fmt.Errorf("slot %d has %d", i, out[i])
		}
		sum += out[i]
		set = set || out[i] > 0
	}
	if set {
		if sum != total {
			return nil, fmt.Errorf("the slots' shares add up to %d, the domain has %d", sum, total)
		}
		return out, nil
	}
	for i := range out {
		out[i] = total / n
		if i < total%n {
			out[i]++
		}
	}
	return out, nil
}

// checkPins refuses over-subscription (a slot with fewer CPUs than vCPUs), two slots of the VM
// sharing a CPU, and housekeeping threads on a slot's CPU.
func (l *layout) checkPins() error {
	owner := map[int]int{}
	for i, b := range l.s.Bundles {
		if len(b.CPUs) == 0 {
			continue
		}
		if len(b.CPUs) < l.vcpus[i] {
			return fmt.Errorf("domainxml: slot %d has %d vCPUs but only %d host CPUs (%s): refusing to over-subscribe", i, l.vcpus[i], len(b.CPUs), cpuset.Format(b.CPUs))
		}
		for _, c := range b.CPUs {
			if j, ok := owner[c]; ok && j != i {
				return fmt.Errorf("domainxml: host CPU %d belongs to slots %d and %d", c, j, i)
			}
			owner[c] = i
		}
	}
	for _, c := range l.s.HousekeepingCPUs {
		if i, ok := owner[c]; ok {
			return fmt.Errorf("domainxml: housekeeping CPU %d is slot %d's: emulator threads would run on tenant CPUs", c, i)
		}
	}
	return nil
}

// expanderBuses lays out one pxb-pcie per cell, bound to the cell, with a root port per
// device of the cell's slots. Bus numbers are handed out from the top (255) down, each
// expander owning the numbers up to the next one's.
func (l *layout) expanderBuses() error {
	if len(l.cells) == 0 {
		return nil
	}
	per := devicesPerSlot(l.s)
	busNr := make([]int, len(l.cells))
	top := 256
	for ci := len(l.cells) - 1; ci >= 0; ci-- {
		ports := per * len(l.cells[ci].slots)
		if ports > 32 {
			return fmt.Errorf("domainxml: NUMA node %d needs %d root ports, an expander bus has 32", l.cells[ci].node, ports)
		}
		top -= ports + 1
		busNr[ci] = top
	}
	if busNr[0] < lowestExpanderBus {
		return fmt.Errorf("domainxml: %d slots need more PCI buses than a guest has", len(l.s.Bundles))
	}
	l.pci = []controller{{Type: "pci", Index: 0, Model: "pcie-root"}}
	idx := 1
	for ci, c := range l.cells {
		pxb := idx
		idx++
		l.pci = append(l.pci, controller{Type: "pci", Index: pxb, Model: "pcie-expander-bus", Target: &ctlTarget{BusNr: busNr[ci], Node: ci}})
		slot := 0
		for _, i := range c.slots {
			for dev := 0; dev < per; dev++ {
				l.pci = append(l.pci, controller{Type: "pci", Index: idx, Model: "pcie-root-port", Address: pciSlot(pxb, slot)})
				l.portOf[[2]int{i, dev}] = idx
				idx++
				slot++
			}
		}
	}
	return nil
}

func pciSlot(bus, slot int) *devAddress {
	return &devAddress{Type: "pci", Domain: "0x0000", Bus: fmt.Sprintf("0x%02x", bus), Slot: fmt.Sprintf("0x%02x", slot), Function: "0x0"}
}

// busControllers are the PCI controllers to declare (none without cells: libvirt's default
// layout on the root complex).
func (l *layout) busControllers() []controller { return l.pci }

// port is the guest address of slot i's device dev (0 disk controller, 1 GPU, 2 VF): slot 0
// of its own root port under the cell's expander bus; nil without cells.
func (l *layout) port(i, dev int) *devAddress {
	idx, ok := l.portOf[[2]int{i, dev}]
	if !ok {
		return nil
	}
	return pciSlot(idx, 0)
}

// cpuTune pins slot i's k-th vCPU to its k-th host CPU, and the emulator and I/O threads to
// the housekeeping CPUs.
func (l *layout) cpuTune() *cpuTune {
	t := &cpuTune{}
	for i, b := range l.s.Bundles {
		if len(b.CPUs) == 0 {
			continue
		}
		for k := 0; k < l.vcpus[i]; k++ {
			t.Pins = append(t.Pins, vcpuPin{VCPU: l.first[i] + k, CPUSet: strconv.Itoa(b.CPUs[k])})
		}
	}
	sort.Slice(t.Pins, func(a, b int) bool { return t.Pins[a].VCPU < t.Pins[b].VCPU })
	if hk := l.s.HousekeepingCPUs; len(hk) > 0 {
		t.EmulatorPin = &cpusetAttr{CPUSet: cpuset.Format(hk)}
		t.IOThreadPin = []iothreadPin{{IOThread: 1, CPUSet: cpuset.Format(hk)}}
	}
	if len(t.Pins) == 0 && t.EmulatorPin == nil {
		return nil
	}
	return t
}

func (l *layout) guestCells() *numaXML {
	n := &numaXML{}
	for ci, c := range l.cells {
		n.Cells = append(n.Cells, cellXML{ID: ci, CPUs: cpuset.Format(c.vcpus), Memory: c.memMiB, Unit: "MiB"})
	}
	return n
}

// numaTune binds memory strictly: the whole VM to its cells' host nodes, each cell to its own.
func (l *layout) numaTune() *numaTune {
	var nodes []int
	t := &numaTune{}
	for ci, c := range l.cells {
		if c.memNode == nil {
			continue
		}
		nodes = append(nodes, *c.memNode)
		t.Memnodes = append(t.Memnodes, memnode{CellID: ci, Mode: "strict", Nodeset: strconv.Itoa(*c.memNode)})
	}
	if len(nodes) == 0 {
		return nil
	}
	t.Memory.Mode, t.Memory.Nodeset = "strict", cpuset.Format(nodes)
	return t
}
