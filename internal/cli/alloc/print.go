package alloc

import (
	"fmt"
	"io"
	"strings"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/output"
)

// printList writes v (one allocation or a List) as JSON/YAML, or the allocations as a table.
func printList(w io.Writer, o output.Format, v any, allocs []apiv1.Allocation) error {
	return output.Print(w, o, v, func(t *output.TableWriter) {
		t.Header("allocations", len(allocs), "ID", "STATUS", "SKU", "GPUS", "NODE", "SLOTS", "REGION", "CREATED")
		for _, a := range allocs {
			t.Row(a.ID, a.Status, a.SKU, a.GPUs, output.Dash(a.Node), output.Ints(slotIndexes(a)), output.Dash(a.Region), output.Time(a.CreatedAt))
		}
	})
}

// slotIndexes are the slot indexes of the allocation's current placement: the same field
// (slots) that -o json prints, so table and JSON never disagree.
func slotIndexes(a apiv1.Allocation) []int {
	var idx []int
	for _, sl := range a.Slots {
		idx = append(idx, sl.SlotIndex)
	}
	return idx
}

// printDetail is `alloc show`'s table: the allocation, its host tasks, then its claims.
func printDetail(t *output.TableWriter, a *apiv1.Allocation) {
	t.Row("ID:", a.ID)
	t.Row("Tenant:", output.Dash(a.TenantID))
	t.Row("SKU:", a.SKU)
	t.Row("Shape:", output.Dash(a.CapacityShape))
	t.Row("GPUs:", a.GPUs)
	t.Row("Region:", output.Dash(a.Region))
	t.Row("Status:", a.Status)
	if a.FailureReason != "" {
		t.Row("Failure:", a.FailureReason)
	}
	t.Row("Placement:", output.Dash(a.PlacementStatus))
	// Node is what JSON's "node" says: the name for admins, the opaque host alias for tenants.
	node := output.Dash(a.Node)
	if a.Node != "" && a.NodeID != "" {
		node += " (" + a.NodeID + ")"
	}
	t.Row("Node:", node)
	if a.Simulated {
		t.Row("Simulated:", "yes: the host runs the sim runtime; no VM exists and no disk is written")
	}
	p := a.Profile
	t.Row("Profile:", fmt.Sprintf("%s (%s): %d vCPU, %d MiB memory", output.Dash(p.Name), output.Dash(p.Source), p.VCPUCount, p.MemoryMiB))
	image := "-"
	if a.Image != nil {
		image = a.Image.Slug
		if a.Image.DigestSHA256 != "" {
			image += " (sha256:" + a.Image.DigestSHA256 + ")"
		}
	}
	t.Row("Image:", image)
	t.Row("Price:", fmt.Sprintf("%s per GPU-hour x %d GPUs", output.Money(a.Price.GPUHourlyPriceMinor, a.Price.Currency), a.Price.GPUs))
	t.Row("Accrued cost:", fmt.Sprintf("%s (%d s billed)", output.Money(a.Cost.AccruedMinor, a.Cost.Currency), a.Cost.BilledSeconds))
	if len(a.SSHPublicKeys) > 0 {
		t.Row("SSH keys:", len(a.SSHPublicKeys))
	}
	t.Row("Created:", output.Time(a.CreatedAt))
	t.Row("Active since:", output.TimePtr(a.ActiveAt))
	if a.ReleasingAt != nil {
		t.Row("Releasing since:", output.TimePtr(a.ReleasingAt))
	}
	t.Row("Released:", output.TimePtr(a.ReleasedAt))
	if a.Handover != "" {
		t.Row("Handover:", a.Handover)
	}
	for i, e := range a.HealthEvents {
		label := ""
		if i == 0 {
			label = "Health:"
		}
		gpu := "allocation"
		if e.SlotIndex != nil {
			gpu = fmt.Sprintf("slot %d", *e.SlotIndex)
		}
		t.Row(label, fmt.Sprintf("%s %s %s (%s): %s", output.TimePtr(&e.At), gpu, e.Signal, e.HealthAfter, e.Reason))
	}

	for _, tk := range a.Tasks {
		t.Blank()
		t.Row(fmt.Sprintf("Task %s (%s, attempt %d): %s", output.Short(tk.ID), tk.Type, tk.Attempt, tk.Status))
		if tk.Error != "" {
			t.Row("", "error: "+tk.Error)
		}
		if tk.Waiting != "" {
			t.Row("", "waiting: "+tk.Waiting)
		}
		var ms int64
		for _, ph := range tk.Phases {
			ms += ph.DurationMS
			t.Row("", ph.Name, phaseStatus(a, ph), output.Millis(ph.DurationMS), output.Dash(ph.Note()))
		}
		if len(tk.Phases) > 0 {
			t.Row("", "total", "", output.Millis(ms))
		}
	}
	if len(a.Claims) > 0 {
		t.Blank()
		t.Row("CLAIM", "KIND", "STATUS", "SLOT", "NUMA", "GPU PCI", "NVME", "FABRIC VF", "MAC", "IP")
		for _, c := range a.Claims {
			t.Row(output.Short(c.ID), c.Kind, c.Status, output.IntPtr(c.SlotIndex), output.IntPtr(c.NUMANode),
				output.Dash(c.PCIAddress), output.Dash(c.NVMeDevice), output.Dash(c.FabricVF), output.Dash(c.MACAddress), output.Dash(c.PrivateIP))
		}
	}
}

// printExplain is `alloc explain`'s table.
func printExplain(t *output.TableWriter, ex *apiv1.PlacementExplain) {
	t.Row("Feasible:", ex.Feasible)
	if ex.Reason != "" {
		t.Row("Reason:", ex.Reason)
	}
	for i, line := range strings.Split(strings.TrimSpace(ex.Message), "\n") {
		label := ""
		if i == 0 {
			label = "Message:"
		}
		t.Row(label, line)
	}
	if len(ex.Choices) > 0 {
		t.Blank()
		t.Row("RANK", "NODE", "SLOTS", "NUMA", "WHY")
		for i, ch := range ex.Choices {
			t.Row(i+1, output.Dash(ch.NodeName), output.Ints(ch.SlotIndexes), output.Ints(ch.NUMANodes), ch.Reason)
		}
	}
}

// phaseStatus is a phase's status as shown: on a simulated allocation a phase is never "ok"
// (a hostd that predates the "simulated" status still reports ok for the sim runtime).
func phaseStatus(a *apiv1.Allocation, p apiv1.TaskPhase) string {
	if a.Simulated && p.Status == "ok" {
		return "simulated"
	}
	return p.Status
}
