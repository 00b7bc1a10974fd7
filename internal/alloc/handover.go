package alloc

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/store"
)

// wipeMethods words each wipe method for tenants.
var wipeMethods = map[string]string{
	"nvme-sanitize-crypto-erase":  "sanitized (crypto erase)",
	"nvme-sanitize-block-erase":   "sanitized (block erase)",
	"nvme-format-crypto-erase":    "securely formatted (crypto erase)",
	"nvme-format-user-data-erase": "securely formatted (user data erase)",
	"wipefs+blkdiscard-zeroout":   "zeroed (blkdiscard)",
	"wipefs+zero-fill":            "zeroed (zero fill)",
}

// HandoverSummary tells a tenant how its released allocation's disks were erased, from the
// latest proof recorded for each slot (proofs newest first): "2 disks sanitized (crypto
// erase) and verified at 2026-...". It names no host, device or identity. A simulated wipe
// is called simulated, never verified; a disk without a verified proof is counted as such.
func HandoverSummary(proofs []store.WipeProofRecord) string {
	latest := map[string]store.WipeProofRecord{}
	for _, p := range proofs {
		if _, seen := latest[p.SlotID]; !seen {
			latest[p.SlotID] = p
		}
	}
	if len(latest) == 0 {
		return ""
	}
	byMethod := map[string]int{}
	var at time.Time
	simulated, unverified := 0, 0
	for _, p := range latest {
		switch {
		case p.Method == "simulated":
			simulated++
		case !p.Verified:
			unverified++
		default:
			byMethod[p.Method]++
			if t := p.FinishedAt; t.After(at) {
				at = t
			}
		}
	}
	var parts []string
	if len(byMethod) > 0 {
		var groups []string
		for m, n := range byMethod {
			word := wipeMethods[m]
			if word == "" {
				word = "erased (" + m + ")"
			}
			groups = append(groups, disks(n)+" "+word)
		}
		sort.Strings(groups)
		parts = append(parts, strings.Join(groups, ", ")+" and verified at "+at.UTC().Format(time.RFC3339))
	}
	if simulated > 0 {
		parts = append(parts, disks(simulated)+" simulated (no disk was written)")
	}
	if unverified > 0 {
		parts = append(parts, disks(unverified)+" not yet verified wiped (withheld from sale until a verified wipe)")
	}
	return strings.Join(parts, "; ")
}

func disks(n int) string {
	if n == 1 {
		return "1 disk"
	}
	return fmt.Sprintf("%d disks", n)
}
