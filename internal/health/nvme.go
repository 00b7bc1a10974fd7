package health

import (
	"encoding/json"
	"fmt"
)

// SmartLog is the part of nvme-cli's `nvme smart-log DEV -o json` the policy reads (the NVMe
// SMART / Health Information log page, 02h).
type SmartLog struct {
	CriticalWarning int    `json:"critical_warning"`
	AvailSpare      int    `json:"avail_spare"`
	SpareThresh     int    `json:"spare_thresh"`
	PercentUsed     int    `json:"percent_used"`
	MediaErrors     uint64 `json:"media_errors"`
}

// ParseSmartLog reads nvme-cli's JSON. critical_warning is a number in nvme-cli 1.x and 2.x;
// some builds print it as an object of bits with a "value" key, which is read too.
func ParseSmartLog(b []byte) (SmartLog, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return SmartLog{}, fmt.Errorf("nvme smart-log: not JSON: %w", err)
	}
	for _, k := range []string{"critical_warning", "avail_spare", "spare_thresh", "percent_used", "media_errors"} {
		if _, ok := raw[k]; !ok {
			return SmartLog{}, fmt.Errorf("nvme smart-log: no %s field", k)
		}
	}
	var s SmartLog
	if cw := raw["critical_warning"]; len(cw) > 0 && cw[0] == '{' {
		var obj struct {
			Value *int `json:"value"`
		}
		if err := json.Unmarshal(cw, &obj); err != nil || obj.Value == nil {
			return SmartLog{}, fmt.Errorf("nvme smart-log: critical_warning is neither a number nor an object with a value")
		}
		s.CriticalWarning = *obj.Value
		delete(raw, "critical_warning")
	} else if err := json.Unmarshal(cw, &s.CriticalWarning); err != nil {
		return SmartLog{}, fmt.Errorf("nvme smart-log: critical_warning: %w", err)
	}
	for k, dst := range map[string]any{"avail_spare": &s.AvailSpare, "spare_thresh": &s.SpareThresh,
		"percent_used": &s.PercentUsed, "media_errors": &s.MediaErrors} {
		if err := json.Unmarshal(raw[k], dst); err != nil {
			return SmartLog{}, fmt.Errorf("nvme smart-log: %s: %w", k, err)
		}
	}
	return s, nil
}

// critical_warning bits (NVMe Base Specification, SMART / Health Information).
var criticalBits = []string{"available spare below threshold", "temperature beyond threshold",
	"NVM subsystem reliability degraded", "media read-only", "volatile memory backup failed", "persistent memory region read-only"}

// Findings compares a reading with the previous one of the same disk (nil: the first).
func (s SmartLog) Findings(dev string, prev *SmartLog) []Finding {
	var out []Finding
	ev := map[string]any{"critical_warning": s.CriticalWarning, "avail_spare": s.AvailSpare, "spare_thresh": s.SpareThresh,
		"percent_used": s.PercentUsed, "media_errors": s.MediaErrors}
	add := func(signal, detail string) {
		out = append(out, Finding{NVMeDevice: dev, Source: "nvme", Signal: signal, Detail: detail, Evidence: ev})
	}
	if s.CriticalWarning != 0 {
		var bits []string
		for i, name := range criticalBits {
			if s.CriticalWarning&(1<<i) != 0 {
				bits = append(bits, name)
			}
		}
		add("nvme:critical_warning", fmt.Sprintf("critical_warning 0x%02x %v", s.CriticalWarning, bits))
	}
	if s.AvailSpare < s.SpareThresh {
		add("nvme:spare_below_threshold", fmt.Sprintf("available spare %d%% below threshold %d%%", s.AvailSpare, s.SpareThresh))
	}
	if s.PercentUsed >= 100 {
		add("nvme:worn_out", fmt.Sprintf("percentage used %d%%", s.PercentUsed))
	}
	if prev != nil && s.MediaErrors > prev.MediaErrors {
		add("nvme:media_errors_rising", fmt.Sprintf("media errors %d -> %d", prev.MediaErrors, s.MediaErrors))
	}
	return out
}
