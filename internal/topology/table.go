package topology

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// PrintTable writes a human summary of a report: each device kind as a table, or one line
// saying none was found; the candidate slots with one blocking reason per line under them;
// and a summary line of how many candidates are ready.
func PrintTable(w io.Writer, r *Report) error {
	if r.LabStandIns {
		fmt.Fprintln(w, "simulated: lab host, its GPUs and fabric are emulated stand-ins (never sold as real capacity)")
		fmt.Fprintln(w)
	}
	t := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	num := func(p *int) string {
		if p == nil {
			return "?"
		}
		return fmt.Sprint(*p)
	}
	section := func(title, header string, n int, none string, row func(i int)) {
		if n == 0 {
			fmt.Fprintf(t, "%s: %s\n\n", title, none)
			return
		}
		fmt.Fprintln(t, header)
		for i := 0; i < n; i++ {
			row(i)
		}
		fmt.Fprintln(t)
	}
	section("GPUs", "GPU\tMODEL\tNUMA\tDRIVER\tIOMMU", len(r.GPUs), "none found (no NVIDIA/AMD display or 3D controller in sysfs)", func(i int) {
		g := r.GPUs[i]
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\n", g.PCIAddress, g.Model, num(g.NUMANode), g.Driver, num(g.IOMMUGroup))
	})
	section("NVMe", "NVME\tBY-ID\tNUMA\tSIZE\tMOUNTS\tSIGNATURE\tOS DISK", len(r.NVMe), "no NVMe device found", func(i int) {
		n := r.NVMe[i]
		sig := n.Signature
		if n.SignatureError != "" {
			sig = "unknown (probe failed)"
		}
		fmt.Fprintf(t, "%s\t%s\t%s\t%d GiB\t%s\t%s\t%v\n", n.Namespace, dashIfEmpty(n.ByID), num(n.NUMANode), n.SizeBytes>>30,
			dashIfEmpty(strings.Join(n.Mounts, ",")), dashIfEmpty(sig), n.OSDisk)
	})
	section("Fabric", "FABRIC\tRDMA\tFABRIC TYPE\tNUMA\tVFS", len(r.Fabric), "no InfiniBand/RoCE device found", func(i int) {
		f := r.Fabric[i]
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\n", f.PCIAddress, dashIfEmpty(f.RDMADevice), f.Fabric, num(f.NUMANode), dashIfEmpty(strings.Join(f.VFs, ",")))
	})
	if err := t.Flush(); err != nil {
		return err
	}
	ready := 0
	if len(r.Candidates) > 0 {
		fmt.Fprintln(t, "SLOT\tREADY\tGPU\tNUMA\tNVME\tFABRIC VF")
		for _, c := range r.Candidates {
			if c.Ready {
				ready++
			}
			fmt.Fprintf(t, "%d\t%v\t%s\t%s\t%s\t%s\n", c.SlotIndex, c.Ready, c.GPUPCI, num(c.NUMANode), dashIfEmpty(c.NVMeDevice), dashIfEmpty(c.FabricVFPCI))
		}
		if err := t.Flush(); err != nil {
			return err
		}
		// Reasons one per line, outside the table: one long reason would stretch every row.
		for _, c := range r.Candidates {
			if len(c.BlockingReasons) == 0 {
				continue
			}
			fmt.Fprintf(w, "\nslot %d is blocked:\n", c.SlotIndex)
			for _, why := range c.BlockingReasons {
				fmt.Fprintf(w, "  - %s\n", why)
			}
		}
		fmt.Fprintln(w)
	}
	for _, warn := range r.Warnings {
		fmt.Fprintf(w, "warning: %s\n", warn)
	}
	_, err := fmt.Fprintf(w, "%d of %d candidate slots ready\n", ready, len(r.Candidates))
	return err
}

func dashIfEmpty(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
