// Package firmware is the deploy-time firmware-profile helper of seed 003: it reads the BIOS
// attributes a node's GPUaaS profile needs through RACADM (the host's command runner), skips
// when the cached evidence already verifies the selected profile/version, stages drift and
// asks for at most GPUAAS_FIRMWARE_MAX_REBOOT_ATTEMPTS controlled reboots, verifies again
// after them, and writes evidence under /var/lib/gpuaas/firmware-profile/ that hostd reports
// in its heartbeat and the controller requires before a node is slice-capable. A machine
// tagged with both profile tags is blocked: it never gets a firmware change.
package firmware

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/hostfs"
)

// The two GPUaaS profile intent tags (composable MAAS tags, seed 003).
const (
	TagSliceVM   = "gpuaas-profile-slice-vm"
	TagBaremetal = "gpuaas-profile-baremetal"
)

// Evidence statuses.
const (
	StatusVerified = "verified"       // the BIOS reads back as the profile wants
	StatusPending  = "pending_reboot" // changes staged; a controlled reboot applies them
	StatusMismatch = "mismatch"       // drift found and applying is not allowed
	StatusFailed   = "failed"         // still drifted after the allowed reboots
	StatusBlocked  = "blocked"        // both profile tags: refuse to choose
)

// Profile is the selected firmware profile (GPUAAS_FIRMWARE_* from the cloud-init env file).
type Profile struct {
	Tag            string
	Version        string
	ApplyIfNeeded  bool
	RebootOnChange bool
	MaxReboots     int
	Expected       []Attr // in the order given
	NodeTags       []string
}

// Attr is one BIOS attribute, e.g. BIOS.ProcSettings.ProcVirtualization=Enabled.
type Attr struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

var (
	attrRE    = regexp.MustCompile(`^BIOS\.[A-Za-z0-9]+\.[A-Za-z0-9_]+$`)
	valueRE   = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,64}$`)
	versionRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
)

// ProfileFromEnv reads and validates the profile environment.
func ProfileFromEnv(getenv func(string) string) (Profile, error) {
	p := Profile{Tag: getenv("GPUAAS_FIRMWARE_PROFILE_TAG"), Version: getenv("GPUAAS_FIRMWARE_PROFILE_VERSION"),
		ApplyIfNeeded: getenv("GPUAAS_FIRMWARE_APPLY_IF_NEEDED") == "1", RebootOnChange: getenv("GPUAAS_FIRMWARE_REBOOT_ON_CHANGE") == "1", MaxReboots: 1}
	if p.Tag != TagSliceVM && p.Tag != TagBaremetal {
		return p, fmt.Errorf("GPUAAS_FIRMWARE_PROFILE_TAG must be %s or %s, not %q", TagSliceVM, TagBaremetal, p.Tag)
	}
	if !versionRE.MatchString(p.Version) {
		return p, fmt.Errorf("GPUAAS_FIRMWARE_PROFILE_VERSION %q is not a profile version", p.Version)
	}
	if s := getenv("GPUAAS_FIRMWARE_MAX_REBOOT_ATTEMPTS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > 5 {
			return p, fmt.Errorf("GPUAAS_FIRMWARE_MAX_REBOOT_ATTEMPTS must be 0..5, not %q", s)
		}
		p.MaxReboots = n
	}
	seen := map[string]bool{}
	for _, kv := range strings.Fields(getenv("GPUAAS_FIRMWARE_EXPECTED_BIOS_ATTRS")) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !attrRE.MatchString(k) || !valueRE.MatchString(v) || seen[k] {
			return p, fmt.Errorf("GPUAAS_FIRMWARE_EXPECTED_BIOS_ATTRS: %q is not BIOS.Group.Name=Value (once each)", kv)
		}
		seen[k] = true
		p.Expected = append(p.Expected, Attr{k, v})
	}
	if len(p.Expected) == 0 {
		return p, errors.New("GPUAAS_FIRMWARE_EXPECTED_BIOS_ATTRS names no attribute")
	}
	p.NodeTags = strings.FieldsFunc(getenv("GPUAAS_NODE_TAGS"), func(r rune) bool { return r == ',' || r == ' ' })
	return p, nil
}

// Evidence is the helper's record (evidence.json).
type Evidence struct {
	ProfileTag     string            `json:"profile_tag"`
	Version        string            `json:"version"`
	Status         string            `json:"status"`
	Expected       map[string]string `json:"expected"`
	Actual         map[string]string `json:"actual,omitempty"`
	Drift          []string          `json:"drift,omitempty"`
	RebootAttempts int               `json:"reboot_attempts"`
	Message        string            `json:"message,omitempty"`
	CheckedAt      time.Time         `json:"checked_at"`
}

// Helper runs the profile through RACADM.
type Helper struct {
	Run    hostfs.Runner
	Dir    string // /var/lib/gpuaas/firmware-profile
	Racadm string // default "racadm"
	Now    func() time.Time
}

func (h Helper) racadm() string {
	if h.Racadm == "" {
		return "racadm"
	}
	return h.Racadm
}

func (h Helper) now() time.Time {
	if h.Now == nil {
		return time.Now().UTC()
	}
	return h.Now().UTC()
}

// EvidencePath is where the evidence lives.
func (h Helper) EvidencePath() string { return filepath.Join(h.Dir, "evidence.json") }

// Cached returns the evidence on disk (zero Evidence and no error when there is none).
func (h Helper) Cached() (Evidence, error) {
	var e Evidence
	b, err := os.ReadFile(h.EvidencePath())
	if errors.Is(err, os.ErrNotExist) {
		return e, nil
	}
	if err != nil {
		return e, err
	}
	if err := json.Unmarshal(b, &e); err != nil {
		return e, fmt.Errorf("firmware evidence %s is corrupt: %w", h.EvidencePath(), err)
	}
	return e, nil
}

func (h Helper) write(e Evidence) error {
	if err := os.MkdirAll(h.Dir, 0o755); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(e, "", "  ")
	tmp := h.EvidencePath() + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, h.EvidencePath())
}

// read asks RACADM for one attribute; its output ends with "Name=Value" (after a
// "[Key=...]" line on real iDRACs).
func (h Helper) read(ctx context.Context, a Attr) (string, error) {
	out, err := h.Run.Run(ctx, h.racadm(), "get", a.Name)
	if err != nil {
		return "", fmt.Errorf("racadm get %s: %w", a.Name, err)
	}
	short := a.Name[strings.LastIndex(a.Name, ".")+1:]
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(line)
		if k, v, ok := strings.Cut(line, "="); ok && (k == short || k == a.Name) {
			return strings.TrimSuffix(strings.TrimSpace(v), " (Pending Value)"), nil
		}
	}
	return "", fmt.Errorf("racadm get %s: no value in %q", a.Name, strings.TrimSpace(string(out)))
}

func (h Helper) blocked(p Profile) bool {
	has := map[string]bool{}
	for _, t := range p.NodeTags {
		has[t] = true
	}
	return has[TagSliceVM] && has[TagBaremetal]
}

// Check reads the BIOS and reports, without changing anything (the evidence is not written).
func (h Helper) Check(ctx context.Context, p Profile) (Evidence, error) {
	e := Evidence{ProfileTag: p.Tag, Version: p.Version, Expected: map[string]string{}, Actual: map[string]string{}, CheckedAt: h.now()}
	for _, a := range p.Expected {
		e.Expected[a.Name] = a.Value
	}
	if h.blocked(p) {
		e.Status, e.Message = StatusBlocked, "the node carries both "+TagSliceVM+" and "+TagBaremetal+": refusing to choose a firmware profile"
		return e, nil
	}
	for _, a := range p.Expected {
		v, err := h.read(ctx, a)
		if err != nil {
			return e, err
		}
		e.Actual[a.Name] = v
		if v != a.Value {
			e.Drift = append(e.Drift, fmt.Sprintf("%s is %s, want %s", a.Name, v, a.Value))
		}
	}
	sort.Strings(e.Drift)
	if len(e.Drift) == 0 {
		e.Status = StatusVerified
	} else {
		e.Status = StatusMismatch
	}
	return e, nil
}

// Apply runs seed 003's rule and writes the evidence: skip when the cached evidence verifies
// this profile/version; verify; on drift (when allowed) stage the changes and, within the
// reboot budget, ask for a controlled reboot; after the budget, fail. It returns an error
// whenever the node is not verified, so the oneshot unit fails and onboarding stops.
func (h Helper) Apply(ctx context.Context, p Profile) (Evidence, error) {
	prev, err := h.Cached()
	if err != nil {
		return prev, err
	}
	if prev.Status == StatusVerified && prev.ProfileTag == p.Tag && prev.Version == p.Version && !h.blocked(p) {
		prev.Message = "cached: " + p.Tag + " " + p.Version + " already verified"
		return prev, nil
	}
	attempts := 0
	if prev.ProfileTag == p.Tag && prev.Version == p.Version {
		attempts = prev.RebootAttempts // a reprofile to another tag/version starts over
	}
	e, err := h.Check(ctx, p)
	e.RebootAttempts = attempts
	if err != nil {
		e.Status, e.Message = StatusFailed, err.Error()
		_ = h.write(e)
		return e, err
	}
	switch {
	case e.Status == StatusBlocked:
		_ = h.write(e)
		return e, errors.New(e.Message)
	case e.Status == StatusVerified:
		e.Message = "BIOS reads back as " + p.Tag + " " + p.Version
		return e, h.write(e)
	case !p.ApplyIfNeeded:
		e.Message = "drift found; GPUAAS_FIRMWARE_APPLY_IF_NEEDED is not 1"
		_ = h.write(e)
		return e, fmt.Errorf("firmware drift: %s", strings.Join(e.Drift, "; "))
	case attempts >= p.MaxReboots:
		e.Status = StatusFailed
		e.Message = fmt.Sprintf("still drifted after %d controlled reboot(s): the node stays unschedulable", attempts)
		_ = h.write(e)
		return e, errors.New(e.Message)
	}
	for _, a := range p.Expected {
		if e.Actual[a.Name] == a.Value {
			continue
		}
		if _, err := h.Run.Run(ctx, h.racadm(), "set", a.Name, a.Value); err != nil {
			e.Status, e.Message = StatusFailed, fmt.Sprintf("racadm set %s: %v", a.Name, err)
			_ = h.write(e)
			return e, errors.New(e.Message)
		}
	}
	if _, err := h.Run.Run(ctx, h.racadm(), "jobqueue", "create", "BIOS.Setup.1-1"); err != nil {
		e.Status, e.Message = StatusFailed, "racadm jobqueue create: "+err.Error()
		_ = h.write(e)
		return e, errors.New(e.Message)
	}
	e.Status = StatusPending
	if !p.RebootOnChange {
		e.Message = "changes staged; reboot the node to apply them (GPUAAS_FIRMWARE_REBOOT_ON_CHANGE is not 1)"
		_ = h.write(e)
		return e, errors.New(e.Message)
	}
	e.RebootAttempts++
	e.Message = fmt.Sprintf("changes staged; controlled reboot %d of %d", e.RebootAttempts, p.MaxReboots)
	if err := h.write(e); err != nil {
		return e, err
	}
	if _, err := h.Run.Run(ctx, "systemctl", "reboot"); err != nil {
		return e, fmt.Errorf("controlled reboot: %w", err)
	}
	return e, errors.New(e.Message)
}
