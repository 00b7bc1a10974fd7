package health

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// maxGuestFindings bounds what one guest report can turn into: a guest is the tenant's, and
// its words only ever reach its own allocation's slots.
const maxGuestFindings = 16

// guestReport is the health part of a guest telemetry body (docs/health.md, "Guest
// telemetry"): Xid codes the guest's kernel logged since its last report, and each GPU's
// volatile uncorrectable ECC count, GPUs by their position in the allocation.
type guestReport struct {
	Xid []struct {
		GPUIndex *int `json:"gpu_index"`
		Code     *int `json:"code"`
	} `json:"xid"`
	ECCUncorrectable []int `json:"ecc_uncorrectable"`
}

// GuestFindings reads the health part of an allocation's guest telemetry body. A body without
// one (the helper's plain snapshot) has none; malformed entries are skipped, and at most 16
// findings come out of one report.
func GuestFindings(allocationID string, body []byte) []Finding {
	var g guestReport
	if json.Unmarshal(body, &g) != nil {
		return nil
	}
	var out []Finding
	for _, x := range g.Xid {
		if x.GPUIndex == nil || x.Code == nil || *x.GPUIndex < 0 || *x.GPUIndex > 64 || *x.Code <= 0 || *x.Code > 9999 {
			continue
		}
		idx := *x.GPUIndex
		out = append(out, Finding{AllocationID: allocationID, GPUIndex: &idx, Source: "guest", Signal: "xid:" + strconv.Itoa(*x.Code),
			Detail: fmt.Sprintf("the guest reported Xid %d on its GPU %d", *x.Code, idx)})
	}
	for i, n := range g.ECCUncorrectable {
		if n > 0 && i <= 64 {
			idx := i
			out = append(out, Finding{AllocationID: allocationID, GPUIndex: &idx, Source: "guest", Signal: "gpu:ecc_uncorrectable",
				Detail: fmt.Sprintf("the guest reported %d volatile uncorrectable ECC errors on its GPU %d", n, idx)})
		}
	}
	if len(out) > maxGuestFindings {
		out = out[:maxGuestFindings]
	}
	return out
}
