package dispatch_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/dispatch"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
	"github.com/gpuaas/gpuaas/internal/wipeproof"
)

// nodeKeys is a controller CA and an enrolled node identity (key + certificate recorded in
// node_credentials), as enrolment makes them.
type nodeKeys struct {
	ca     *pki.CA
	signer wipeproof.Signer
}

func newCA(t *testing.T) *pki.CA {
	t.Helper()
	dir := t.TempDir()
	if _, err := pki.Init(pki.InitOptions{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func (w *world) enroll(ca *pki.CA, nodeID string) wipeproof.Signer {
	w.t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		w.t.Fatal(err)
	}
	certPEM, err := ca.IssueClientCert(&key.PublicKey, "node:"+nodeID, time.Hour, time.Now())
	if err != nil {
		w.t.Fatal(err)
	}
	blk, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		w.t.Fatal(err)
	}
	if err := w.st.InTx(w.ctx, func(tx *store.Tx) error {
		return tx.RecordCredential(w.ctx, hex.EncodeToString(cert.SerialNumber.Bytes()), nodeID, cert.NotAfter)
	}); err != nil {
		w.t.Fatal(err)
	}
	return wipeproof.Signer{Key: key, CertDER: blk.Bytes}
}

// signedSetup is a world whose dispatcher trusts ca for node certificates, with the node
// enrolled.
func signedSetup(t *testing.T) (*world, *pki.CA, wipeproof.Signer) {
	ca := newCA(t)
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	w := setup(t, dispatch.Config{NodeCA: pool})
	return w, ca, w.enroll(ca, w.node.ID)
}

func signProof(t *testing.T, s wipeproof.Signer, p task.WipeProof, slot, node, taskID, alloc string) task.WipeProof {
	t.Helper()
	if err := wipeproof.Sign(s, &p, slot, node, taskID, alloc, time.Now()); err != nil {
		t.Fatal(err)
	}
	return p
}

// releaseTask runs an allocation to active, releases it, and returns the release task with
// its slot.
func (w *world) releaseTask() (allocID, taskID, slot string) {
	w.t.Helper()
	a := w.allocate(1)
	env := w.poll(time.Second)
	if _, err := w.d.Result(w.ctx, w.node.ID, env.TaskID, task.Result{TaskID: env.TaskID, Attempt: 1, Status: "succeeded"}); err != nil {
		w.t.Fatal(err)
	}
	if _, err := w.svc.Release(w.ctx, w.tenant, a.ID); err != nil {
		w.t.Fatal(err)
	}
	if _, err := w.d.ProcessOutbox(w.ctx, 10); err != nil {
		w.t.Fatal(err)
	}
	rel := w.poll(time.Second)
	if rel == nil || rel.Type != task.TypeVMRelease {
		w.t.Fatalf("release task = %+v", rel)
	}
	p, err := (&task.Verifier{Key: w.pub, NodeID: w.node.ID}).Verify(rel)
	if err != nil {
		w.t.Fatal(err)
	}
	return a.ID, rel.TaskID, p.(*task.VMRelease).Bundles[0].SlotID
}

// A verified wipe proof reopens the slot only if the reporting node's enrolled key signed it
// for this slot and this task: another node's key, an altered document, no signature, or a
// proof replayed from another task leaves the slot cleanup_blocked behind the wipe gate.
func TestWipeProofsCountOnlySignedByTheReportingNode(t *testing.T) {
	proof := task.WipeProof{Verified: true, Method: "nvme-sanitize-crypto-erase", Details: json.RawMessage(`{"identity":{"serial":"S64ANS0T512345K","source":"nvme id-ctrl/id-ns"}}`)}
	cases := map[string]func(w *world, ca *pki.CA, s wipeproof.Signer, taskID, slot, alloc string) task.WipeProof{
		"unsigned": func(*world, *pki.CA, wipeproof.Signer, string, string, string) task.WipeProof { return proof },
		"another node's key": func(w *world, ca *pki.CA, _ wipeproof.Signer, taskID, slot, alloc string) task.WipeProof {
			var other string
			if err := w.st.InTx(w.ctx, func(tx *store.Tx) error {
				n, err := tx.CreateNode(w.ctx, apiv1.NodeCreate{Name: "n2", Region: "lab", SliceSKU: "h200-sxm-slice"})
				other = n.ID
				return err
			}); err != nil {
				t.Fatal(err)
			}
			return signProof(t, w.enroll(ca, other), proof, slot, w.node.ID, taskID, alloc)
		},
		"a key of another CA": func(w *world, _ *pki.CA, _ wipeproof.Signer, taskID, slot, alloc string) task.WipeProof {
			return signProof(t, w.enroll(newCA(t), w.node.ID), proof, slot, w.node.ID, taskID, alloc)
		},
		"altered after signing": func(w *world, _ *pki.CA, s wipeproof.Signer, taskID, slot, alloc string) task.WipeProof {
			p := signProof(t, s, task.WipeProof{Verified: false, Method: "wipefs+blkdiscard-zeroout", Error: "3 non-zero regions"}, slot, w.node.ID, taskID, alloc)
			p.Verified, p.Error = true, ""
			p.Document = strings.Replace(p.Document, `"verified":false`, `"verified":true`, 1)
			return p
		},
		"replayed from another task": func(w *world, _ *pki.CA, s wipeproof.Signer, _, slot, alloc string) task.WipeProof {
			return signProof(t, s, proof, slot, w.node.ID, "018f0000-0000-7000-8000-000000000000", alloc)
		},
	}
	for name, forge := range cases {
		t.Run(name, func(t *testing.T) {
			w, ca, s := signedSetup(t)
			allocID, taskID, slot := w.releaseTask()
			out, _ := json.Marshal(task.ReleaseOutput{Released: true, Wiped: map[string]task.WipeProof{slot: forge(w, ca, s, taskID, slot, allocID)}})
			if _, err := w.d.Result(w.ctx, w.node.ID, taskID, task.Result{Status: "succeeded", Output: out}); err != nil {
				t.Fatal(err)
			}
			slots, _ := w.st.ListSlots(w.ctx, w.node.ID)
			if slots[0].Status != "cleanup_blocked" || !slots[0].NeedsWipe {
				t.Fatalf("slot after a %s proof = %s (needs_wipe %v), want cleanup_blocked behind the gate", name, slots[0].Status, slots[0].NeedsWipe)
			}
		})
	}
	t.Run("signed by the node", func(t *testing.T) {
		w, _, s := signedSetup(t)
		allocID, taskID, slot := w.releaseTask()
		out, _ := json.Marshal(task.ReleaseOutput{Released: true, Wiped: map[string]task.WipeProof{slot: signProof(t, s, proof, slot, w.node.ID, taskID, allocID)}})
		if _, err := w.d.Result(w.ctx, w.node.ID, taskID, task.Result{Status: "succeeded", Output: out}); err != nil {
			t.Fatal(err)
		}
		slots, _ := w.st.ListSlots(w.ctx, w.node.ID)
		if slots[0].Status != "available" || slots[0].NeedsWipe {
			t.Fatalf("slot after a signed proof = %s (needs_wipe %v)", slots[0].Status, slots[0].NeedsWipe)
		}
		kept, err := w.st.WipeProofs(w.ctx, slot, 5)
		if err != nil || len(kept) != 1 || !kept[0].Verified || kept[0].Signature == "" || kept[0].SignerCert == "" ||
			kept[0].DeviceIdentity != "serial:S64ANS0T512345K" || kept[0].TaskID != taskID || kept[0].AllocationID != allocID {
			t.Fatalf("stored proof = %+v, %v", kept, err)
		}
	})
}

// A slot an operator disabled while it was blocked keeps needing a wipe: a repair wipe's
// signed proof clears it (the slot stays disabled), and only then does enable succeed.
func TestRepairWipeOfADisabledSlotThenEnable(t *testing.T) {
	w, _, s := signedSetup(t)
	_, taskID, slot := w.releaseTask()
	out, _ := json.Marshal(task.ReleaseOutput{Wiped: map[string]task.WipeProof{}})
	if _, err := w.d.Result(w.ctx, w.node.ID, taskID, task.Result{Status: "failed", Output: out, Error: "wipe_verify: 1 non-zero region"}); err != nil {
		t.Fatal(err)
	}
	enable := func(on bool) error {
		return w.st.InTx(w.ctx, func(tx *store.Tx) error {
			_, err := tx.SetSlotEnabled(w.ctx, w.node.ID, 0, on, "")
			return err
		})
	}
	if err := enable(false); err != nil {
		t.Fatal(err)
	}
	if err := enable(true); err == nil {
		t.Fatal("an unwiped disabled slot was enabled")
	}
	id, err := w.d.QueueTask(w.ctx, w.node.ID, task.TypeWipeVerify, task.WipeVerify{SlotID: slot, Device: "/dev/disk/by-id/nvme-eui.0000000000010000", Apply: true}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if env := w.poll(time.Second); env == nil || env.TaskID != id {
		t.Fatalf("repair task not delivered: %+v", env)
	}
	proof := signProof(t, s, task.WipeProof{Verified: true, Method: "wipefs+blkdiscard-zeroout"}, slot, w.node.ID, id, "")
	res, _ := json.Marshal(map[string]any{"verified": true, "method": "wipefs+blkdiscard-zeroout", "proof": proof})
	if _, err := w.d.Result(w.ctx, w.node.ID, id, task.Result{Status: "succeeded", Output: res}); err != nil {
		t.Fatal(err)
	}
	slots, _ := w.st.ListSlots(w.ctx, w.node.ID)
	if slots[0].Status != "disabled" || slots[0].NeedsWipe {
		t.Fatalf("after the repair wipe: %s (needs_wipe %v), want disabled and clean", slots[0].Status, slots[0].NeedsWipe)
	}
	if err := enable(true); err != nil {
		t.Fatalf("enable after a verified repair wipe: %v", err)
	}
}
