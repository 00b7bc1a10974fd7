package topology

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// PrintTable writes a human summary of a report.
func PrintTable(w io.Writer, r *Report) error {
	t := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	num := func(p *int) string {
		if p == nil {
			return "?"
		}
		return fmt.Sprint(*p)
	}
	fmt.Fprintln(t, "GPU\tMODEL\tNUMA\tDRIVER\tIOMMU")
	for _, g := range r.GPUs {
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\n", g.PCIAddress, g.Model, num(g.NUMANode), g.Driver, num(g.IOMMUGroup))
	}
	fmt.Fprintln(t, "\nNVME\tBY-ID\tNUMA\tSIZE\tMOUNTS\tSIGNATURE\tOS DISK")
	for _, n := range r.NVMe {
		fmt.Fprintf(t, "%s\t%s\t%s\t%d GiB\t%s\t%s\t%v\n", n.Namespace, dashIfEmpty(n.ByID), num(n.NUMANode), n.SizeBytes>>30,
			dashIfEmpty(strings.Join(n.Mounts, ",")), dashIfEmpty(n.Signature), n.OSDisk)
	}
	fmt.Fprintln(t, "\nFABRIC\tRDMA\tFABRIC TYPE\tNUMA\tVFS")
	for _, f := range r.Fabric {
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\n", f.PCIAddress, dashIfEmpty(f.RDMADevice), f.Fabric, num(f.NUMANode), dashIfEmpty(strings.Join(f.VFs, ",")))
	}
	fmt.Fprintln(t, "\nSLOT\tREADY\tGPU\tNUMA\tNVME\tFABRIC VF\tBLOCKING REASONS")
	for _, c := range r.Candidates {
		fmt.Fprintf(t, "%d\t%v\t%s\t%s\t%s\t%s\t%s\n", c.SlotIndex, c.Ready, c.GPUPCI, num(c.NUMANode), dashIfEmpty(c.NVMeDevice),
			dashIfEmpty(c.FabricVFPCI), dashIfEmpty(strings.Join(c.BlockingReasons, "; ")))
	}
	for _, w := range r.Warnings {
		fmt.Fprintf(t, "warning: %s\n", w)
	}
	return t.Flush()
}

func dashIfEmpty(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
