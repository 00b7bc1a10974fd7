package disk

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
)

// Identity is a disk's identity as the device itself reports it: for NVMe from Identify
// Controller (serial, model) and Identify Namespace (EUI-64, NGUID); for other block devices
// from sysfs (serial, WWN/WWID). A device that reports none (a loop device) says so in Source.
type Identity struct {
	Serial string `json:"serial,omitempty"`
	Model  string `json:"model,omitempty"`
	EUI64  string `json:"eui64,omitempty"`
	NGUID  string `json:"nguid,omitempty"`
	WWN    string `json:"wwn,omitempty"`
	Source string `json:"source"` // "nvme id-ctrl/id-ns", "sysfs", or "none: ..."
}

// String is the identity in the slot-record form ("serial:..., eui64:...").
func (id Identity) String() string {
	var parts []string
	for _, kv := range [][2]string{{"serial", id.Serial}, {"wwn", id.WWN}, {"eui64", id.EUI64}, {"nguid", id.NGUID}} {
		if kv[1] != "" {
			parts = append(parts, kv[0]+":"+kv[1])
		}
	}
	if len(parts) == 0 {
		return id.Source
	}
	return strings.Join(parts, ", ")
}

// Match checks the device against a slot's recorded identity ("serial:X", "wwn:X",
// "eui64:X" or "nguid:X"; empty: nothing recorded, nothing to check).
func (id Identity) Match(recorded string) error {
	recorded = strings.TrimSpace(recorded)
	if recorded == "" {
		return nil
	}
	kind, want, ok := strings.Cut(recorded, ":")
	if !ok || want == "" {
		return fmt.Errorf("the slot's recorded disk identity %q is not KIND:VALUE (serial, wwn, eui64, nguid)", recorded)
	}
	var got string
	switch strings.ToLower(kind) {
	case "serial":
		got = id.Serial
	case "wwn", "wwid":
		got = id.WWN
	case "eui64":
		got = id.EUI64
	case "nguid":
		got = id.NGUID
	default:
		return fmt.Errorf("the slot's recorded disk identity kind %q is unknown (serial, wwn, eui64, nguid)", kind)
	}
	if got == "" {
		return fmt.Errorf("the slot records %s but the device reports none (%s): not the slot's disk", recorded, id.String())
	}
	if !strings.EqualFold(normID(got), normID(want)) {
		return fmt.Errorf("the device reports %s:%s, the slot records %s: a different disk", kind, got, recorded)
	}
	return nil
}

func normID(s string) string {
	return strings.TrimPrefix(strings.ToLower(strings.ReplaceAll(strings.TrimSpace(s), "-", "")), "0x")
}

var nvmeNamespace = regexp.MustCompile(`^nvme([0-9]+)n([0-9]+)$`)

// nvmeController is the controller node of an NVMe namespace device (/dev/nvme0n1 ->
// /dev/nvme0), or "" for a device that is not an NVMe namespace.
func nvmeController(dev string) string {
	m := nvmeNamespace.FindStringSubmatch(filepath.Base(dev))
	if m == nil {
		return ""
	}
	return "/dev/nvme" + m[1]
}

// nvmeCtrl is what the wipe needs from `nvme id-ctrl -o json`.
type nvmeCtrl struct {
	SN      string `json:"sn"`
	MN      string `json:"mn"`
	SANICAP uint32 `json:"sanicap"`
	FNA     uint32 `json:"fna"`
}

// nvmeNS is what the wipe needs from `nvme id-ns -o json`.
type nvmeNS struct {
	EUI64 string `json:"eui64"`
	NGUID string `json:"nguid"`
}

// identity reads dev's identity; for an NVMe namespace it also returns the controller's
// Identify data (nil when dev is not NVMe or nvme-cli cannot read it).
func (w Wiper) identity(ctx context.Context, dev string) (Identity, *nvmeCtrl) {
	if ctrl := nvmeController(dev); ctrl != "" {
		out, err := w.Run.Run(ctx, "nvme", "id-ctrl", ctrl, "-o", "json")
		var c nvmeCtrl
		if err == nil && json.Unmarshal(out, &c) == nil {
			id := Identity{Serial: strings.TrimSpace(c.SN), Model: strings.TrimSpace(c.MN), Source: "nvme id-ctrl/id-ns"}
			if out, err := w.Run.Run(ctx, "nvme", "id-ns", dev, "-o", "json"); err == nil {
				var ns nvmeNS
				if json.Unmarshal(out, &ns) == nil {
					id.EUI64, id.NGUID = nonZeroHex(ns.EUI64), nonZeroHex(ns.NGUID)
				}
			}
			return id, &c
		}
		// nvme-cli missing or failing: fall through to sysfs, which NVMe also fills.
	}
	base := filepath.Base(dev)
	read := func(p string) string {
		b, err := w.FS.ReadFile(p)
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	id := Identity{Serial: read("/sys/block/" + base + "/device/serial"), Model: read("/sys/block/" + base + "/device/model")}
	id.WWN = read("/sys/block/" + base + "/device/wwid")
	if id.WWN == "" {
		id.WWN = read("/sys/block/" + base + "/wwid")
	}
	switch {
	case id.Serial != "" || id.WWN != "":
		id.Source = "sysfs"
	case strings.HasPrefix(base, "loop"):
		id.Source = "none: a loop device has no hardware identity"
	default:
		id.Source = "none: the device reports no serial or WWN"
	}
	return id, nil
}

// nonZeroHex drops an all-zero identifier (NVMe reports zeroes for an unset EUI-64/NGUID).
func nonZeroHex(s string) string {
	s = strings.TrimSpace(s)
	if strings.Trim(s, "0-x") == "" {
		return ""
	}
	return s
}
