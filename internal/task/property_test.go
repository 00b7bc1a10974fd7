package task

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// propertyRand returns a seeded generator; the seed is logged when the test fails, and
// TASK_PROPERTY_SEED replays it.
func propertyRand(t *testing.T) *rand.Rand {
	t.Helper()
	seed := time.Now().UnixNano()
	if v := os.Getenv("TASK_PROPERTY_SEED"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("TASK_PROPERTY_SEED: %v", err)
		}
		seed = n
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("property seed %d: rerun with TASK_PROPERTY_SEED=%d go test -run '^%s$' ./internal/task/", seed, seed, t.Name())
		}
	})
	return rand.New(rand.NewSource(seed))
}

// seededKey derives a signing key from the generator, so a seed replays the same keys.
func seededKey(r *rand.Rand) (ed25519.PublicKey, ed25519.PrivateKey) {
	seed := make([]byte, ed25519.SeedSize)
	r.Read(seed)
	priv := ed25519.NewKeyFromSeed(seed)
	return priv.Public().(ed25519.PublicKey), priv
}

const idAlphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"

func randID(r *rand.Rand) string {
	b := []byte{idAlphabet[r.Intn(62)]} // first character alphanumeric
	for n := r.Intn(40); n > 0; n-- {
		b = append(b, idAlphabet[r.Intn(len(idAlphabet))])
	}
	return string(b)
}

// randText is any valid UTF-8, including characters JSON and HTML escape.
func randText(r *rand.Rand) string {
	pool := []rune("aZ09 \"\\/<>&'\n\t\u00e9\u2028\u4e16\U0001F600{}[]:,")
	var b strings.Builder
	for n := r.Intn(24); n > 0; n-- {
		b.WriteRune(pool[r.Intn(len(pool))])
	}
	return b.String()
}

func randPCI(r *rand.Rand) string {
	return fmt.Sprintf("%04x:%02x:%02x.%d", r.Intn(4), r.Intn(256), r.Intn(32), r.Intn(8))
}

func randBundle(r *rand.Rand, i int) Bundle {
	numa := r.Intn(8)
	b := Bundle{SlotID: randID(r), SlotIndex: i, GPUPCI: randPCI(r), FabricVFPCI: randPCI(r),
		NVMeDevice: "/dev/disk/by-id/nvme-eui." + strconv.FormatUint(r.Uint64(), 16), MACAddress: fmt.Sprintf("52:54:00:%02x:%02x:%02x", r.Intn(256), r.Intn(256), r.Intn(256)),
		PrivateIP: fmt.Sprintf("10.100.%d.%d", r.Intn(256), 2+r.Intn(250)), WipePolicy: []string{WipeBlkdiscardZero, WipeNVMeSanitize, WipeSecureErase}[r.Intn(3)], DiskIdentity: randText(r), VCPUCount: r.Intn(1 << 20), MemoryMiB: r.Int()}
	if r.Intn(2) == 0 {
		b.NUMANode = &numa
	}
	return b
}

// randTask is a valid (type, payload) pair with random contents.
func randTask(r *rand.Rand) (Type, any) {
	bundles := make([]Bundle, r.Intn(4))
	for i := range bundles {
		bundles[i] = randBundle(r, i)
	}
	switch r.Intn(4) {
	case 0:
		return TypeVMRelease, VMRelease{AllocationID: randID(r), Bundles: bundles, Wipe: r.Intn(2) == 0, GracefulTimeoutS: r.Int()}
	case 1:
		return TypeReconcile, Reconcile{Allocations: []ReconcileAllocation{{AllocationID: randID(r), Status: randText(r), Bundles: bundles}}}
	case 2:
		return TypePrereqCheck, PrereqCheck{HugepagesGiB: r.Intn(1 << 30), Bridge: randText(r)}
	default:
		return TypeTopologyDiscover, TopologyDiscover{IncludeHugepages: r.Intn(2) == 0}
	}
}

type propEnv struct {
	pub  ed25519.PublicKey
	priv ed25519.PrivateKey
	env  *Envelope
	now  time.Time
}

func randEnvelope(t *testing.T, r *rand.Rand) propEnv {
	t.Helper()
	pub, priv := seededKey(r)
	typ, payload := randTask(r)
	issued := t0.Add(time.Duration(r.Int63n(int64(365 * 24 * time.Hour)))).Add(time.Duration(r.Intn(1e9)))
	ttl := time.Duration(1+r.Intn(3600)) * time.Second
	e, err := New(priv, randID(r), randID(r), typ, payload, issued, ttl, 1+r.Intn(9))
	if err != nil {
		t.Fatal(err)
	}
	return propEnv{pub: pub, priv: priv, env: e, now: issued.Add(ttl / 2)}
}

func (p propEnv) verifier(node string, now time.Time, skew time.Duration) *Verifier {
	return &Verifier{Key: p.pub, NodeID: node, Now: func() time.Time { return now }, Skew: skew}
}

// TestPropertySignatureCoversEveryByte changes one byte at every position of random signed
// envelopes as they travel (JSON) and checks: the host accepts the changed envelope exactly
// when it still means the same signed task (same canonical bytes and signature: a change of
// key case or insignificant space), and refuses it otherwise.
func TestPropertySignatureCoversEveryByte(t *testing.T) {
	r := propertyRand(t)
	iterations := 40
	if testing.Short() {
		iterations = 8
	}
	changed, refused := 0, 0
	for it := 0; it < iterations; it++ {
		p := randEnvelope(t, r)
		v := p.verifier(p.env.NodeID, p.now, 0)
		if _, err := v.Verify(p.env); err != nil {
			t.Fatalf("iteration %d: a freshly signed envelope is refused: %v", it, err)
		}
		want, err := p.env.CanonicalBytes()
		if err != nil {
			t.Fatal(err)
		}
		wire, err := json.Marshal(p.env)
		if err != nil {
			t.Fatal(err)
		}
		for pos := range wire {
			mut := bytes.Clone(wire)
			mut[pos] ^= byte(1 + r.Intn(255)) // never the same byte
			var back Envelope
			if json.Unmarshal(mut, &back) != nil {
				continue // the host cannot even decode it: nothing runs
			}
			changed++
			got, cerr := back.CanonicalBytes()
			same := cerr == nil && bytes.Equal(got, want) && bytes.Equal(back.Signature, p.env.Signature)
			_, verr := v.Verify(&back)
			switch {
			case same && verr != nil:
				t.Fatalf("iteration %d byte %d: an equivalent envelope is refused: %v\n%s", it, pos, verr, mut)
			case !same && verr == nil:
				t.Fatalf("iteration %d byte %d (%q -> %q): a changed envelope verified\n%s", it, pos, wire[pos], mut[pos], mut)
			case !same:
				refused++
			}
		}
		// The signed fields changed directly (not through JSON): every one is covered.
		for name, mutate := range map[string]func(e *Envelope){
			"task_id":   func(e *Envelope) { e.TaskID += "x" },
			"node_id":   func(e *Envelope) { e.NodeID = "x" + e.NodeID },
			"type":      func(e *Envelope) { e.Type = TypeReconcile + TypeVMRelease },
			"issued_at": func(e *Envelope) { e.IssuedAt = e.IssuedAt.Add(-time.Nanosecond) },
			"not_after": func(e *Envelope) { e.NotAfter = e.NotAfter.Add(time.Nanosecond) },
			"attempt":   func(e *Envelope) { e.Attempt++ },
			"payload": func(e *Envelope) {
				e.Payload = append(bytes.Clone(bytes.TrimSuffix(e.Payload, []byte("}"))), []byte(`,"x":1}`)...)
			},
			"signature": func(e *Envelope) {
				e.Signature = bytes.Clone(e.Signature)
				e.Signature[r.Intn(len(e.Signature))] ^= 0x80
			},
		} {
			e := *p.env
			mutate(&e)
			if _, err := v.Verify(&e); reasonOf(err) != RefuseBadSignature {
				t.Fatalf("iteration %d: changed %s: want %s, got %v", it, name, RefuseBadSignature, err)
			}
		}
	}
	if refused == 0 || changed < iterations {
		t.Fatalf("the mutation loop proved nothing: %d decodable changes, %d refused", changed, refused)
	}
	t.Logf("%d envelopes, %d decodable single-byte changes, %d refused, the rest equivalent", iterations, changed, refused)
}

func reasonOf(err error) string {
	if re, ok := err.(*RefusedError); ok {
		return re.Reason
	}
	return fmt.Sprintf("not a refusal: %v", err)
}

// TestPropertyNodeBinding: an envelope signed for node X verifies on X and is refused by any
// other node Y, naming both.
func TestPropertyNodeBinding(t *testing.T) {
	r := propertyRand(t)
	for it := 0; it < 300; it++ {
		p := randEnvelope(t, r)
		other := randID(r)
		if other == p.env.NodeID {
			continue
		}
		if _, err := p.verifier(p.env.NodeID, p.now, 0).Verify(p.env); err != nil {
			t.Fatalf("node %s refuses its own task: %v", p.env.NodeID, err)
		}
		_, err := p.verifier(other, p.now, 0).Verify(p.env)
		if reasonOf(err) != RefuseWrongNode || !strings.Contains(err.Error(), p.env.NodeID) || !strings.Contains(err.Error(), other) {
			t.Fatalf("node %s ran a task for %s: %v", other, p.env.NodeID, err)
		}
	}
}

// TestPropertyExpiryAndSkew: with a tolerance S, a host clock d past not_after (or d behind
// issued_at) is accepted when d <= S and refused beyond it, with a reason naming the skew.
func TestPropertyExpiryAndSkew(t *testing.T) {
	r := propertyRand(t)
	for it := 0; it < 500; it++ {
		p := randEnvelope(t, r)
		skew := time.Duration(r.Int63n(int64(10 * time.Minute)))
		d := time.Duration(r.Int63n(int64(20 * time.Minute)))
		if r.Intn(8) == 0 {
			d = skew // the boundary itself is accepted
		}
		if r.Intn(8) == 0 {
			d = skew + time.Nanosecond // one nanosecond beyond is not
		}
		// Late clock: d past expiry.
		_, err := p.verifier(p.env.NodeID, p.env.NotAfter.Add(d), skew).Verify(p.env)
		checkSkew(t, "late", d, skew, err, RefuseExpired)
		// Early clock: d before issue.
		_, err = p.verifier(p.env.NodeID, p.env.IssuedAt.Add(-d), skew).Verify(p.env)
		checkSkew(t, "early", d, skew, err, RefuseNotYetValid)
	}
}

func checkSkew(t *testing.T, which string, d, skew time.Duration, err error, reason string) {
	t.Helper()
	if d <= skew {
		if err != nil {
			t.Fatalf("%s clock %s with tolerance %s refused: %v", which, d, skew, err)
		}
		return
	}
	if reasonOf(err) != reason {
		t.Fatalf("%s clock %s beyond tolerance %s: want %s, got %v", which, d, skew, reason, err)
	}
	for _, want := range []string{d.String(), skew.String() + " clock-skew tolerance"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("%s refusal does not name %q: %v", which, want, err)
		}
	}
}

// TestPropertyReplayAcrossRestart: a task id completed once is refused the second time, also
// by a new replay store on the same directory (a restarted hostd); ids never completed are not.
func TestPropertyReplayAcrossRestart(t *testing.T) {
	r := propertyRand(t)
	dir := filepath.Join(t.TempDir(), "completed")
	rs, err := NewDiskReplayStore(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	rs.Now = func() time.Time { return time.Time{} } // before every envelope: nothing is pruned here
	type seen struct {
		p    propEnv
		done bool
	}
	var all []seen
	ids := map[string]bool{}
	for it := 0; it < 200; it++ {
		p := randEnvelope(t, r)
		if ids[p.env.TaskID] {
			continue // random ids can repeat; each must be new here
		}
		ids[p.env.TaskID] = true
		v := p.verifier(p.env.NodeID, p.now, 0)
		v.Replay = rs
		if _, err := v.Verify(p.env); err != nil {
			t.Fatalf("first delivery of %s refused: %v", p.env.TaskID, err)
		}
		done := r.Intn(2) == 0
		if done {
			if err := rs.MarkCompleted(p.env.TaskID, p.env.NotAfter); err != nil {
				t.Fatal(err)
			}
			if _, err := v.Verify(p.env); reasonOf(err) != RefuseReplay {
				t.Fatalf("second delivery of %s: want %s, got %v", p.env.TaskID, RefuseReplay, err)
			}
		}
		all = append(all, seen{p, done})
	}
	restarted, err := NewDiskReplayStore(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		v := s.p.verifier(s.p.env.NodeID, s.p.now, 0)
		v.Replay = restarted
		_, err := v.Verify(s.p.env)
		if s.done && reasonOf(err) != RefuseReplay {
			t.Fatalf("after restart, completed %s: want %s, got %v", s.p.env.TaskID, RefuseReplay, err)
		}
		if !s.done && err != nil {
			t.Fatalf("after restart, never completed %s refused: %v", s.p.env.TaskID, err)
		}
	}
}
