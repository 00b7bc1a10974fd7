package task

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func keys(t *testing.T) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

func provision() VMProvision {
	numa := 0
	return VMProvision{AllocationID: "a1", Bundles: []Bundle{{SlotID: "s0", SlotIndex: 0, GPUPCI: "0000:1b:00.0",
		FabricVFPCI: "0000:1a:00.2", NVMeDevice: "/dev/disk/by-id/nvme-eui.1", NUMANode: &numa, MACAddress: "52:54:00:00:00:01",
		PrivateIP: "10.100.0.10", WipePolicy: "blkdiscard_zero_verify"}},
		Profile: Profile{Name: "h200_1g_24c_64g", GPUCount: 1, VCPUCount: 24, MemoryMiB: 65536},
		Image:   Image{ID: "i1", Slug: "img", SourceType: "http", SourceRef: "https://x/img.qcow2", DigestSHA256: "ab", Format: "qcow2", Username: "debian"}}
}

func reason(t *testing.T, err error) string {
	t.Helper()
	var re *RefusedError
	if !errors.As(err, &re) {
		t.Fatalf("want a refusal, got %v", err)
	}
	return re.Reason
}

func TestVerifyAcceptsAGoodTask(t *testing.T) {
	pub, priv := keys(t)
	e, err := New(priv, "task-1", "node-1", TypeVMProvision, provision(), t0, 20*time.Minute, 1)
	if err != nil {
		t.Fatal(err)
	}
	v := &Verifier{Key: pub, NodeID: "node-1", Now: func() time.Time { return t0.Add(time.Minute) }, Skew: time.Minute}
	p, err := v.Verify(e)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := p.(*VMProvision)
	if !ok || got.Bundles[0].FabricVFPCI != "0000:1a:00.2" || got.Image.DigestSHA256 != "ab" {
		t.Fatalf("payload = %#v", p)
	}
	// The envelope survives a JSON round trip (what travels over HTTPS) and still verifies,
	// even with the payload re-indented.
	b, _ := json.Marshal(e)
	var back Envelope
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	var pretty map[string]any
	_ = json.Unmarshal(back.Payload, &pretty)
	back.Payload, _ = json.MarshalIndent(pretty, "", "    ")
	if _, err := v.Verify(&back); err != nil {
		t.Fatalf("round-tripped envelope: %v", err)
	}
}

func TestVerifyRefusals(t *testing.T) {
	pub, priv := keys(t)
	_, otherPriv := keys(t)
	now := func() time.Time { return t0.Add(time.Minute) }
	good := func() *Envelope {
		e, err := New(priv, "task-1", "node-1", TypeVMRelease, VMRelease{AllocationID: "a1", Wipe: true}, t0, 20*time.Minute, 1)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	cases := map[string]struct {
		mutate func(*Envelope)
		want   string
	}{
		"tampered payload": {func(e *Envelope) {
			e.Payload = json.RawMessage(`{"allocation_id":"a2","bundles":null,"wipe":false,"graceful_timeout_s":0}`)
		}, RefuseBadSignature},
		"tampered attempt": {func(e *Envelope) { e.Attempt = 2 }, RefuseBadSignature},
		"other key":        {func(e *Envelope) { _ = e.Sign(otherPriv) }, RefuseBadSignature},
		"unsigned":         {func(e *Envelope) { e.Signature = nil }, RefuseUnsigned},
		"wrong node":       {func(e *Envelope) { e.NodeID = "node-2"; _ = e.Sign(priv) }, RefuseWrongNode},
		"expired":          {func(e *Envelope) { e.NotAfter = t0.Add(-time.Hour); _ = e.Sign(priv) }, RefuseExpired},
		"from the future":  {func(e *Envelope) { e.IssuedAt = t0.Add(time.Hour); _ = e.Sign(priv) }, RefuseNotYetValid},
		"unknown type":     {func(e *Envelope) { e.Type = "shell.exec"; _ = e.Sign(priv) }, RefuseUnknownType},
		"unknown field": {func(e *Envelope) {
			e.Payload = json.RawMessage(`{"allocation_id":"a1","cmd":"rm -rf /"}`)
			_ = e.Sign(priv)
		}, RefuseBadPayload},
		"missing id": {func(e *Envelope) { e.TaskID = "" }, RefuseMalformed},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			e := good()
			c.mutate(e)
			_, err := (&Verifier{Key: pub, NodeID: "node-1", Now: now, Skew: time.Minute}).Verify(e)
			if got := reason(t, err); got != c.want {
				t.Fatalf("reason = %s, want %s (%v)", got, c.want, err)
			}
		})
	}
	// Within the skew tolerance a slightly early or late clock is accepted.
	e := good()
	late := &Verifier{Key: pub, NodeID: "node-1", Now: func() time.Time { return t0.Add(20*time.Minute + 30*time.Second) }, Skew: time.Minute}
	if _, err := late.Verify(e); err != nil {
		t.Fatalf("within skew: %v", err)
	}
}

func TestReplayRefusedAcrossRestart(t *testing.T) {
	pub, priv := keys(t)
	dir := filepath.Join(t.TempDir(), "completed")
	rs, err := NewDiskReplayStore(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	rs.Now = func() time.Time { return t0 }
	e, _ := New(priv, "task-9", "node-1", TypeReconcile, Reconcile{Allocations: []ReconcileAllocation{{AllocationID: "a1", Status: "active"}}}, t0, time.Hour, 1)
	v := &Verifier{Key: pub, NodeID: "node-1", Now: func() time.Time { return t0 }, Replay: rs}
	if _, err := v.Verify(e); err != nil {
		t.Fatal(err)
	}
	if err := rs.MarkCompleted("task-9", e.NotAfter); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(filepath.Join(dir, "task-9"))
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("marker mode %v", fi.Mode().Perm())
	}
	rs2, _ := NewDiskReplayStore(dir, 0) // a restarted hostd
	v.Replay = rs2
	if got := reason(t, func() error { _, err := v.Verify(e); return err }()); got != RefuseReplay {
		t.Fatalf("reason = %s", got)
	}
	if err := rs.MarkCompleted("../etc/passwd", e.NotAfter); err == nil {
		t.Fatal("unsafe task id accepted as a file name")
	}
}

func TestNewRefusesUnknownType(t *testing.T) {
	_, priv := keys(t)
	if _, err := New(priv, "t", "n", "shell.exec", map[string]string{"cmd": "id"}, t0, time.Minute, 1); err == nil {
		t.Fatal("built an envelope for an unknown type")
	}
}

// hostd refuses a plan or repair naming a wipe policy it does not implement before it runs
// (so before any disk is touched).
func TestUnknownWipePolicyIsRefusedBeforeRunning(t *testing.T) {
	for _, payload := range []checker{
		&VMProvision{AllocationID: "a1", Bundles: []Bundle{{SlotID: "s1", WipePolicy: "shred_35_passes"}}},
		&VMRelease{AllocationID: "a1", Bundles: []Bundle{{SlotID: "s1", WipePolicy: "shred_35_passes"}}},
		&WipeVerify{SlotID: "s1", Device: "/dev/disk/by-id/nvme-eui.0025384511b23c41", Policy: "shred_35_passes"},
	} {
		if err := payload.check(); err == nil || !strings.Contains(err.Error(), `unknown destructive_wipe_policy "shred_35_passes"`) {
			t.Fatalf("%T with an unknown wipe policy: %v", payload, err)
		}
	}
	for p := range WipePolicies {
		if err := (&WipeVerify{SlotID: "s1", Device: "/dev/disk/by-id/nvme-eui.0025384511b23c41", Policy: p}).check(); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
	}
}
