package disk

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/task"
)

// Identify Controller bits the erase plan reads (NVMe base specification).
const (
	sanicapCryptoErase = 1 << 0 // SANICAP.CES
	sanicapBlockErase  = 1 << 1 // SANICAP.BES
	fnaAllNamespaces   = 1 << 0 // FNA: a format applies to every namespace of the controller
	fnaCryptoErase     = 1 << 2 // FNA: cryptographic erase is supported as a secure erase
)

// erasePlan is how one disk is erased: an NVMe command on its controller or namespace, or
// the zero erase.
type erasePlan struct {
	kind   string // "sanitize", "format" or "zero"
	ctrl   string // /dev/nvmeN (sanitize)
	dev    string
	sanact int    // sanitize action: 4 crypto erase, 2 block erase
	ses    int    // format secure erase setting: 2 crypto erase, 1 user data erase
	method string // what the evidence calls it
	why    string // why an NVMe erase was not used (zero plans on NVMe-capable policies)
}

func (p erasePlan) describe() string {
	switch p.kind {
	case "sanitize":
		return fmt.Sprintf("nvme sanitize %s --sanact=%d (%s)", p.ctrl, p.sanact, p.method)
	case "format":
		return fmt.Sprintf("nvme format %s --ses=%d (%s)", p.dev, p.ses, p.method)
	}
	s := "wipefs -a, blkdiscard -z (zero-fill fallback)"
	if p.why != "" {
		s += " [" + p.why + "]"
	}
	return s
}

// plan chooses the erase for a policy and device. Sanitize and a whole-controller format
// erase every namespace of the controller, so they are used only where the slot's namespace
// is the controller's only one: never another slot's data.
func (w Wiper) plan(ctx context.Context, dev, policy string, c *nvmeCtrl) erasePlan {
	zero := erasePlan{kind: "zero", dev: dev, method: "wipefs+blkdiscard-zeroout"}
	if policy == task.WipeBlkdiscardZero {
		return zero
	}
	ctrl := nvmeController(dev)
	if ctrl == "" {
		zero.why = "not an NVMe namespace"
		return zero
	}
	if c == nil {
		zero.why = "nvme id-ctrl unavailable"
		return zero
	}
	alone, err := w.onlyNamespace(ctx, ctrl)
	if err != nil {
		zero.why = err.Error()
		return zero
	}
	if policy == task.WipeNVMeSanitize && alone {
		switch {
		case c.SANICAP&sanicapCryptoErase != 0:
			return erasePlan{kind: "sanitize", ctrl: ctrl, dev: dev, sanact: 4, method: "nvme-sanitize-crypto-erase"}
		case c.SANICAP&sanicapBlockErase != 0:
			return erasePlan{kind: "sanitize", ctrl: ctrl, dev: dev, sanact: 2, method: "nvme-sanitize-block-erase"}
		}
	}
	if c.FNA&fnaAllNamespaces == 0 || alone {
		if c.FNA&fnaCryptoErase != 0 {
			return erasePlan{kind: "format", dev: dev, ses: 2, method: "nvme-format-crypto-erase"}
		}
		return erasePlan{kind: "format", dev: dev, ses: 1, method: "nvme-format-user-data-erase"}
	}
	zero.why = "the controller's format and sanitize would erase other namespaces"
	return zero
}

// onlyNamespace reports whether the controller has exactly one active namespace.
func (w Wiper) onlyNamespace(ctx context.Context, ctrl string) (bool, error) {
	out, err := w.Run.Run(ctx, "nvme", "list-ns", ctrl, "-o", "json")
	if err != nil {
		return false, fmt.Errorf("nvme list-ns: %v", err)
	}
	// nvme-cli 2.x: {"nsid_list":[{"nsid":1}]}; 1.x: {"nsid_list":[1]} or an array.
	var obj struct {
		List []json.RawMessage `json:"nsid_list"`
	}
	if json.Unmarshal(out, &obj) == nil && obj.List != nil {
		return len(obj.List) == 1, nil
	}
	var arr []json.RawMessage
	if json.Unmarshal(out, &arr) == nil {
		return len(arr) == 1, nil
	}
	return false, fmt.Errorf("nvme list-ns: unreadable output")
}

// sanitizeTimeout bounds a sanitize (block erase of a large drive takes tens of minutes).
const sanitizeTimeout = 2 * time.Hour

// erase runs the plan. An NVMe command that fails falls back to the zero erase: the disk is
// still erased, and the evidence says by what.
func (w Wiper) erase(ctx context.Context, dev string, size int64, p erasePlan, ev *Evidence) error {
	switch p.kind {
	case "sanitize":
		step := fmt.Sprintf("nvme sanitize %s --sanact=%d", p.ctrl, p.sanact)
		ev.Steps = append(ev.Steps, step)
		_, err := w.Run.Run(ctx, "nvme", "sanitize", p.ctrl, fmt.Sprintf("--sanact=%d", p.sanact))
		if err == nil {
			err = w.waitSanitize(ctx, p.ctrl)
		}
		if err == nil {
			ev.Method = p.method
			return nil
		}
		ev.Steps = append(ev.Steps, "sanitize failed: "+err.Error())
	case "format":
		step := fmt.Sprintf("nvme format %s --ses=%d --force", p.dev, p.ses)
		ev.Steps = append(ev.Steps, step)
		_, err := w.Run.Run(ctx, "nvme", "format", p.dev, fmt.Sprintf("--ses=%d", p.ses), "--force")
		if err == nil {
			ev.Method = p.method
			return nil
		}
		ev.Steps = append(ev.Steps, "format failed: "+err.Error())
	}
	return w.zeroErase(ctx, dev, size, ev)
}

// waitSanitize polls the Sanitize Status log until the sanitize completes (SSTAT status 1,
// or 4: completed without deallocation), fails (3) or the deadline passes.
func (w Wiper) waitSanitize(ctx context.Context, ctrl string) error {
	sleep := w.Sleep
	if sleep == nil {
		sleep = time.Sleep
	}
	now := w.Now
	if now == nil {
		now = time.Now
	}
	deadline := now().Add(sanitizeTimeout)
	for {
		out, err := w.Run.Run(ctx, "nvme", "sanitize-log", ctrl, "-o", "json")
		if err != nil {
			return fmt.Errorf("nvme sanitize-log: %w", err)
		}
		sstat, ok := sanitizeStatus(out)
		if !ok {
			return fmt.Errorf("nvme sanitize-log: no sstat in %q", strings.TrimSpace(string(out)))
		}
		switch sstat & 0x7 {
		case 1, 4:
			return nil
		case 3:
			return fmt.Errorf("the controller reports the sanitize failed (sstat %#x)", sstat)
		case 0:
			return fmt.Errorf("the controller reports no sanitize was run (sstat %#x)", sstat)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if now().After(deadline) {
			return fmt.Errorf("sanitize still in progress after %s", sanitizeTimeout)
		}
		sleep(5 * time.Second)
	}
}

// sanitizeStatus reads SSTAT from `nvme sanitize-log -o json`: top level (nvme-cli 1.x) or
// under the device name (2.x: {"nvme0": {"sstat": ...}}).
func sanitizeStatus(out []byte) (uint32, bool) {
	var top map[string]json.RawMessage
	if json.Unmarshal(out, &top) != nil {
		return 0, false
	}
	read := func(m map[string]json.RawMessage) (uint32, bool) {
		raw, ok := m["sstat"]
		if !ok {
			return 0, false
		}
		var v uint32
		return v, json.Unmarshal(raw, &v) == nil
	}
	if v, ok := read(top); ok {
		return v, true
	}
	for _, raw := range top {
		var inner map[string]json.RawMessage
		if json.Unmarshal(raw, &inner) == nil {
			if v, ok := read(inner); ok {
				return v, true
			}
		}
	}
	return 0, false
}

// tools records the versions of the erase tools (the first line each prints).
func (w Wiper) tools(ctx context.Context, nvme bool) map[string]string {
	out := map[string]string{}
	line := func(name string, args ...string) string {
		b, err := w.Run.Run(ctx, name, args...)
		if err != nil {
			return "unavailable"
		}
		s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
		return s
	}
	out["util-linux"] = line("blkdiscard", "--version")
	if nvme {
		out["nvme-cli"] = line("nvme", "version")
	}
	return out
}
