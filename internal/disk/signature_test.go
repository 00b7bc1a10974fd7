package disk

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/disk/disktest"
	"github.com/gpuaas/gpuaas/internal/hostfs"
)

// TestProbeFindsEverySignature puts each signature on a real loop device with the real tool
// (LVM2 PV, LUKS1 and LUKS2, mdraid members of metadata 0.90, 1.0 and 1.1 and 1.2 — 0.90
// and 1.0 at the END of the device —, ZFS member, ext4, xfs, vfat, btrfs, gpt, dos) and
// checks that every user of the probe sees it: Probe itself, the storage transition's plan
// (the "is this disk empty?" check) and the post-wipe verification (SignatureAfter, not
// verified). Then the wipe removes it and the same probe finds nothing.
func TestProbeFindsEverySignature(t *testing.T) {
	ctx := context.Background()
	for _, k := range disktest.Kinds {
		t.Run(k.Name, func(t *testing.T) {
			m := disktest.Carry(t, k)
			t.Logf("%s: %s", m.Dev, m.How)
			w := wiper()
			sigs, err := Probe(ctx, w.Run, m.Dev)
			if err != nil || !hasType(sigs, k.Want) {
				t.Fatalf("Probe(%s carrying %s) = %+v, %v; want %s", m.Dev, k.Name, sigs, err, k.Want)
			}

			plan, err := w.Transition(ctx, TransitionOptions{Devices: []string{m.Dev}, NodeName: "n",
				FstabPath: filepath.Join(t.TempDir(), "fstab"), ManifestDir: t.TempDir()})
			if err != nil || len(plan.Devices) != 1 || !hasType(plan.Devices[0].Signatures, k.Want) ||
				!strings.Contains(strings.Join(plan.Devices[0].Actions, "\n"), "erases "+Describe(sigs)) {
				t.Fatalf("transition plan does not name %s: %+v, %v", k.Want, plan, err)
			}

			before, err := w.Verify(ctx, m.Dev, k.Size)
			if err != nil || before.Verified || !strings.Contains(before.SignatureAfter, k.Want) {
				t.Fatalf("verify before the wipe = %+v, %v; want %s named and not verified", before, err, k.Want)
			}

			ev, err := w.Wipe(ctx, m.Dev, true)
			if err != nil || !ev.Verified || ev.SignatureAfter != "" {
				t.Fatalf("wipe = %+v, %v", ev, err)
			}
			if after, err := Probe(ctx, w.Run, m.Dev); err != nil || len(after) != 0 {
				t.Fatalf("after the wipe Probe = %+v, %v; want nothing", after, err)
			}
		})
	}
}

// TestProbeFailureIsNeverEmpty: a device that cannot be read, or a probe tool that is
// missing, is an error from Probe and Verify and a refusal in the transition plan — never
// "no signature". (blkid alone exits 2, "nothing found", for a device it cannot open.)
func TestProbeFailureIsNeverEmpty(t *testing.T) {
	ctx := context.Background()
	dev := disktest.Loop(t, 16<<20)
	w := wiper()

	gone := filepath.Join(t.TempDir(), "gone")
	if sigs, err := Probe(ctx, w.Run, gone); err == nil {
		t.Fatalf("probe of a missing device = %+v, nil error", sigs)
	}
	if ev, err := w.Verify(ctx, gone, 16<<20); err == nil || ev.Verified {
		t.Fatalf("verify of a missing device = %+v, %v", ev, err)
	}

	// The tools are missing: PATH names an empty directory.
	t.Setenv("PATH", t.TempDir())
	if sigs, err := Probe(ctx, w.Run, dev); err == nil || !strings.Contains(err.Error(), "cannot probe") {
		t.Fatalf("probe without wipefs/blkid = %+v, %v", sigs, err)
	}
	if ev, err := w.Verify(ctx, dev, 16<<20); err == nil || ev.Verified {
		t.Fatalf("verify without wipefs/blkid = %+v, %v", ev, err)
	}
	fstab := filepath.Join(t.TempDir(), "fstab")
	orig := "UUID=abc / ext4 defaults 0 1\n" + dev + " /srv ext4 defaults 0 2\n"
	if err := os.WriteFile(fstab, []byte(orig), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := w.Transition(ctx, TransitionOptions{Devices: []string{dev}, NodeName: "n", Confirm: "n", Apply: true,
		FstabPath: fstab, ManifestDir: t.TempDir()})
	if !errors.Is(err, ErrRefused) || len(res.Devices) != 1 || !strings.Contains(res.Devices[0].Refused, "cannot probe") {
		t.Fatalf("transition of an unprobeable device = %+v, %v", res, err)
	}
	if b, _ := os.ReadFile(fstab); string(b) != orig || res.FstabBackup != "" {
		t.Fatalf("refused transition touched fstab: %q", b)
	}
}

// A runner whose probe tools answer with output we cannot read is an error, not "empty".
type cannedRunner map[string]struct {
	out []byte
	err error
}

func (c cannedRunner) Run(_ context.Context, name string, _ ...string) ([]byte, error) {
	r := c[name]
	return r.out, r.err
}

func TestProbeOutputParsing(t *testing.T) {
	ctx := context.Background()
	none := &hostfs.ExitError{Cmd: "blkid", Code: 2}
	for _, c := range []struct {
		name    string
		run     cannedRunner
		want    string
		wantErr bool
	}{
		{"nothing", cannedRunner{"wipefs": {out: []byte(`{"signatures": []}`)}, "blkid": {err: none}}, "", false},
		{"wipefs silent", cannedRunner{"wipefs": {}, "blkid": {err: none}}, "", false},
		{"garbled wipefs", cannedRunner{"wipefs": {out: []byte("wipefs: something odd")}, "blkid": {err: none}}, "", true},
		{"wipefs without list", cannedRunner{"wipefs": {out: []byte(`{}`)}, "blkid": {err: none}}, "", true},
		{"blkid I/O error", cannedRunner{"wipefs": {out: []byte(`{"signatures": []}`)}, "blkid": {err: &hostfs.ExitError{Code: 4}}}, "", true},
		{"ambivalent", cannedRunner{"wipefs": {out: []byte(`{"signatures": []}`)}, "blkid": {err: &hostfs.ExitError{Code: 8}}}, "ambivalent", false},
		{"blkid only", cannedRunner{"wipefs": {out: []byte(`{"signatures": []}`)}, "blkid": {out: []byte("DEVNAME=/dev/x\nPTUUID=1\nPTTYPE=gpt\n")}}, "gpt", false},
		{"blkid no type", cannedRunner{"wipefs": {out: []byte(`{"signatures": []}`)}, "blkid": {out: []byte("DEVNAME=/dev/x\n")}}, "unknown", false},
		{"both", cannedRunner{
			"wipefs": {out: []byte(`{"signatures": [{"device":"x","offset":"0x218","type":"LVM2_member","uuid":"u","label":null}]}`)},
			"blkid":  {out: []byte("DEVNAME=/dev/x\nVERSION=LVM2\\ 001\nTYPE=LVM2_member\nUSAGE=raid\n")}}, "LVM2_member", false},
	} {
		sigs, err := Probe(ctx, c.run, "/dev/x")
		if (err != nil) != c.wantErr || Describe(sigs) != c.want {
			t.Errorf("%s: Probe = %+v, %v; want %q (error %v)", c.name, sigs, err, c.want, c.wantErr)
		}
	}
}

func hasType(sigs []Signature, typ string) bool {
	for _, s := range sigs {
		if s.Type == typ {
			return true
		}
	}
	return false
}

// FuzzProbeOutput: whatever wipefs and blkid print, Probe never panics; it either fails or
// returns signatures that each carry a type (an untyped entry would read as "empty").
func FuzzProbeOutput(f *testing.F) {
	f.Add([]byte(`{"signatures": [{"device":"x","offset":"0x438","type":"ext4","uuid":null,"label":null}]}`), []byte("TYPE=ext4\nUSAGE=filesystem\n"), 0)
	f.Add([]byte(`{"signatures": []}`), []byte(""), 2)
	f.Add([]byte(""), []byte("PTTYPE=gpt\n"), 0)
	f.Add([]byte(`{"signatures": [{}]}`), []byte("VERSION=a\\ b\\"), 8)
	f.Fuzz(func(t *testing.T, wipefs, blkid []byte, code int) {
		var berr error
		if code != 0 {
			berr = &hostfs.ExitError{Cmd: "blkid", Code: code}
		}
		run := cannedRunner{"wipefs": {out: wipefs}, "blkid": {out: blkid, err: berr}}
		sigs, err := Probe(context.Background(), run, "/dev/x")
		if err != nil {
			return
		}
		for _, s := range sigs {
			if s.Type == "" {
				t.Fatalf("untyped signature %+v from wipefs %q blkid %q (exit %d)", s, wipefs, blkid, code)
			}
		}
		if len(sigs) == 0 && (code == 0 || code == 8) {
			t.Fatalf("blkid identified something (exit %d) but Probe says empty: blkid %q", code, blkid)
		}
	})
}
