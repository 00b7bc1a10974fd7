package disk

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/gpuaas/gpuaas/internal/hostfs"
)

// Signature is one on-disk signature found by probing a device: a filesystem, a volume
// manager or RAID member, an encryption header or a partition table, named as libblkid
// names it (ext4, xfs, vfat, btrfs, LVM2_member, crypto_LUKS, linux_raid_member,
// zfs_member, gpt, PMBR, dos, ...).
type Signature struct {
	Type   string `json:"type"`
	Offset string `json:"offset,omitempty"` // where wipefs found the magic (bytes, hex); "" when only blkid named it
	Usage  string `json:"usage,omitempty"`  // filesystem, raid, crypto, ... (blkid USAGE); "" for partition tables
	UUID   string `json:"uuid,omitempty"`
	Label  string `json:"label,omitempty"`
}

// Probe lists every signature on dev, the one check behind "is this disk empty?" (discovery,
// the storage transition) and the post-wipe verification. It asks libblkid twice, both times
// by low-level probing of the device itself, never through the blkid cache:
//
//   - wipefs --no-act --json lists each magic it finds, at every offset (primary and backup
//     GPT headers, both LUKS2 headers, the four ZFS labels, an mdraid 0.90/1.0 superblock at
//     the end of the device), and fails when the device cannot be opened;
//   - blkid -p -o export names what the device is as a whole (TYPE or PTTYPE, USAGE).
//
// An empty list means both found nothing. A probe that fails (tool missing, device gone,
// I/O error, output we cannot read) is an error, never "empty": blkid alone cannot tell
// "no signature" from "could not open" (both exit 2), so its "nothing" counts only beside
// a wipefs run that read the device.
func Probe(ctx context.Context, run hostfs.Runner, dev string) ([]Signature, error) {
	out, err := run.Run(ctx, "wipefs", "--no-act", "--json", dev)
	if err != nil {
		return nil, fmt.Errorf("cannot probe %s for signatures (wipefs): %w", dev, err)
	}
	sigs, err := parseWipefsJSON(out)
	if err != nil {
		return nil, fmt.Errorf("cannot probe %s for signatures: %w", dev, err)
	}
	out, err = run.Run(ctx, "blkid", "-p", "-o", "export", dev)
	var xe *hostfs.ExitError
	switch {
	case err == nil:
		sigs = mergeBlkid(sigs, parseBlkidExport(out))
	case errors.As(err, &xe) && xe.Code == 2:
		// Nothing identified; wipefs above proved the device readable.
	case errors.As(err, &xe) && xe.Code == 8:
		// Ambivalent: more than one signature claims the device (e.g. a filesystem over an
		// old RAID superblock). Not empty whatever wipefs listed.
		if len(sigs) == 0 {
			sigs = append(sigs, Signature{Type: "ambivalent"})
		}
	default:
		return nil, fmt.Errorf("cannot probe %s for signatures (blkid): %w", dev, err)
	}
	return sigs, nil
}

// Describe names the distinct signature types in the order found ("" for none), e.g.
// "gpt, PMBR" or "LVM2_member".
func Describe(sigs []Signature) string {
	seen := map[string]bool{}
	var names []string
	for _, s := range sigs {
		if !seen[s.Type] {
			seen[s.Type] = true
			names = append(names, s.Type)
		}
	}
	return strings.Join(names, ", ")
}

// wipefsJSON is wipefs --json's shape (util-linux 2.27+); uuid and label are null when absent.
type wipefsJSON struct {
	Signatures *[]struct {
		Offset string  `json:"offset"`
		Type   string  `json:"type"`
		UUID   *string `json:"uuid"`
		Label  *string `json:"label"`
	} `json:"signatures"`
}

func parseWipefsJSON(b []byte) ([]Signature, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, nil // wipefs prints nothing at all for a device with no signature
	}
	var w wipefsJSON
	if err := json.Unmarshal(b, &w); err != nil || w.Signatures == nil {
		return nil, fmt.Errorf("wipefs printed no signature list: %.80q", b)
	}
	var out []Signature
	for _, s := range *w.Signatures {
		if s.Type == "" {
			return nil, fmt.Errorf("wipefs listed a signature without a type at %q", s.Offset)
		}
		sig := Signature{Type: s.Type, Offset: s.Offset}
		if s.UUID != nil {
			sig.UUID = *s.UUID
		}
		if s.Label != nil {
			sig.Label = *s.Label
		}
		out = append(out, sig)
	}
	return out, nil
}

// parseBlkidExport reads blkid -o export's KEY=value lines (values shell-escaped with
// backslashes) into what names the device: TYPE, else PTTYPE.
func parseBlkidExport(b []byte) Signature {
	kv := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			continue
		}
		var u strings.Builder
		for i := 0; i < len(v); i++ {
			if v[i] == '\\' && i+1 < len(v) {
				i++
			}
			u.WriteByte(v[i])
		}
		kv[k] = u.String()
	}
	s := Signature{Type: kv["TYPE"], Usage: kv["USAGE"], UUID: kv["UUID"], Label: kv["LABEL"]}
	if s.Type == "" {
		s.Type, s.UUID = kv["PTTYPE"], kv["PTUUID"]
	}
	if s.Type == "" {
		s.Type = "unknown" // blkid identified something (it exits 0 only then) but named no type
	}
	return s
}

// mergeBlkid adds blkid's view to wipefs's list: its usage on the entries of the same type,
// or the type itself when wipefs did not list it.
func mergeBlkid(sigs []Signature, b Signature) []Signature {
	if b.Type == "" {
		return sigs
	}
	found := false
	for i := range sigs {
		if sigs[i].Type == b.Type {
			sigs[i].Usage, found = b.Usage, true
		}
	}
	if !found {
		sigs = append(sigs, b)
	}
	return sigs
}
