package task

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"testing"
	"time"
)

// fuzzKey is fixed so that signed entries in testdata/fuzz stay valid.
var fuzzKey = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, ed25519.SeedSize))

func fuzzVerifier() *Verifier {
	return &Verifier{Key: fuzzKey.Public().(ed25519.PublicKey), NodeID: "node-1", Now: func() time.Time { return t0.Add(time.Minute) }, Skew: time.Minute}
}

func signedWire(tb testing.TB, typ Type, payload any) []byte {
	tb.Helper()
	e, err := New(fuzzKey, "task-1", "node-1", typ, payload, t0, time.Hour, 1)
	if err != nil {
		tb.Fatal(err)
	}
	b, err := json.Marshal(e)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// FuzzVerify feeds arbitrary bytes to the host's decode + verify path. It never panics, every
// refusal is a RefusedError, and an accepted envelope is genuinely signed for this node: it
// round-trips through JSON, and a changed signature or another node is refused.
func FuzzVerify(f *testing.F) {
	numa := 1
	f.Add(signedWire(f, TypeVMRelease, VMRelease{AllocationID: "a1", Wipe: true}))
	f.Add(signedWire(f, TypeVMProvision, VMProvision{AllocationID: "a1", Bundles: []Bundle{{SlotID: "s0", GPUPCI: "0000:1b:00.0",
		FabricVFPCI: "0000:1a:00.2", NVMeDevice: "/dev/disk/by-id/nvme-eui.1", NUMANode: &numa, MACAddress: "52:54:00:00:00:01", PrivateIP: "10.100.0.10"}}}))
	f.Add(signedWire(f, TypeStorageTransit, StorageTransition{Devices: []string{"/dev/disk/by-id/nvme-eui.2"}, To: "slice", Node: "n1"}))
	f.Add(signedWire(f, TypeWipeVerify, WipeVerify{SlotID: "s1", Device: "/dev/disk/by-id/nvme-eui.3"}))
	f.Add([]byte(`{"task_id":"t","node_id":"node-1","type":"slice.vm_release","payload":{},"attempt":1,"signature":"AAAA"}`))
	f.Add([]byte(`{"payload":1e999999}`))
	f.Add([]byte(`null`))
	v := fuzzVerifier()
	f.Fuzz(func(t *testing.T, wire []byte) {
		var e Envelope
		if json.Unmarshal(wire, &e) != nil {
			return
		}
		payload, err := v.Verify(&e)
		if err != nil {
			var re *RefusedError
			if !errors.As(err, &re) || re.Reason == "" {
				t.Fatalf("not a refusal: %v", err)
			}
			if payload != nil {
				t.Fatalf("refused but returned a payload: %v", err)
			}
			return
		}
		if payload == nil {
			t.Fatal("accepted without a payload")
		}
		again, err := json.Marshal(&e)
		if err != nil {
			t.Fatal(err)
		}
		var back Envelope
		if err := json.Unmarshal(again, &back); err != nil {
			t.Fatal(err)
		}
		if _, err := v.Verify(&back); err != nil {
			t.Fatalf("an accepted envelope does not survive a JSON round trip: %v", err)
		}
		back.Signature = bytes.Clone(back.Signature)
		back.Signature[len(back.Signature)-1] ^= 1
		if _, err := v.Verify(&back); reasonOf(err) != RefuseBadSignature {
			t.Fatalf("a changed signature: %v", err)
		}
		other := *v
		other.NodeID = "node-2"
		if _, err := other.Verify(&e); reasonOf(err) != RefuseWrongNode {
			t.Fatalf("node-2 ran node-1's task: %v", err)
		}
	})
}

// FuzzSignedMutation signs an envelope built from fuzzed fields, then changes one byte of its
// JSON form: the host accepts the changed envelope exactly when it still means the same signed
// task, and the unchanged one always.
func FuzzSignedMutation(f *testing.F) {
	f.Add("task-1", string(TypeVMRelease), []byte(`{"allocation_id":"a1","wipe":true}`), 1, uint(10), byte(1))
	f.Add("t.2", string(TypePrereqCheck), []byte(`{"hugepages_gib":123456789012345678901234567890,"bridge":"br<0>&"}`), 3, uint(200), byte(0x20))
	f.Add("t3", string(TypeTopologyDiscover), []byte(`{"include_hugepages":false}`), 1, uint(0), byte('T'^'t'))
	f.Add("t4", string(TypeReconcile), []byte(`{"allocations":[{"allocation_id":"a\u00e9","status":"active","bundles":[]}]}`), 2, uint(77), byte(3))
	v := fuzzVerifier()
	f.Fuzz(func(t *testing.T, taskID, typ string, payload []byte, attempt int, pos uint, flip byte) {
		if !json.Valid(payload) {
			return
		}
		e := &Envelope{TaskID: taskID, NodeID: "node-1", Type: Type(typ), Payload: payload, IssuedAt: t0, NotAfter: t0.Add(time.Hour), Attempt: attempt}
		if err := e.Sign(fuzzKey); err != nil {
			return // not canonicalisable: never signed, never sent
		}
		want, _ := e.CanonicalBytes()
		_, origErr := v.Verify(e)
		wire, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		var back Envelope
		if err := json.Unmarshal(wire, &back); err != nil {
			t.Fatal(err)
		}
		if _, err := v.Verify(&back); reasonOf(err) != reasonOf(origErr) && !(err == nil && origErr == nil) {
			t.Fatalf("a JSON round trip changed the verdict: %v, then %v", origErr, err)
		}
		if flip == 0 {
			return
		}
		wire[pos%uint(len(wire))] ^= flip
		var mut Envelope
		if json.Unmarshal(wire, &mut) != nil {
			return
		}
		got, cerr := mut.CanonicalBytes()
		same := cerr == nil && bytes.Equal(got, want) && bytes.Equal(mut.Signature, e.Signature)
		_, err = v.Verify(&mut)
		if !same && err == nil {
			t.Fatalf("a changed envelope verified:\n%s", wire)
		}
		if same && reasonOf(err) != reasonOf(origErr) && !(err == nil && origErr == nil) {
			t.Fatalf("an equivalent envelope changed the verdict: %v, then %v", origErr, err)
		}
	})
}
