package agent

import (
	"crypto"
	"encoding/json"
	"fmt"
	"time"

	"github.com/gpuaas/gpuaas/internal/disk"
	"github.com/gpuaas/gpuaas/internal/task"
	"github.com/gpuaas/gpuaas/internal/wipeproof"
)

// signer is this host's node identity for signing wipe proofs: the enrolled certificate and
// its private key (the same pair the host authenticates with).
func (a *Agent) signer() (wipeproof.Signer, error) {
	c := a.cert.Load()
	if c == nil || len(c.Certificate) == 0 {
		return wipeproof.Signer{}, fmt.Errorf("no node certificate loaded")
	}
	key, ok := c.PrivateKey.(crypto.Signer)
	if !ok {
		return wipeproof.Signer{}, fmt.Errorf("the node key cannot sign")
	}
	return wipeproof.Signer{Key: key, CertDER: c.Certificate[0]}, nil
}

// signProofs signs each slot's wipe proof of a release with the node key. A proof that
// cannot be signed goes out unsigned, and the controller does not count it.
func (a *Agent) signProofs(env *task.Envelope, allocationID string, wiped map[string]task.WipeProof) {
	if len(wiped) == 0 {
		return
	}
	s, err := a.signer()
	for slot, p := range wiped {
		if err == nil {
			err = wipeproof.Sign(s, &p, slot, env.NodeID, env.TaskID, allocationID, time.Now())
		}
		if err != nil {
			a.log.Error("wipe proof left unsigned: the controller will not count it", "task", env.TaskID, "slot", slot, "err", err)
			continue
		}
		wiped[slot] = p
	}
}

// wipeVerifyOutput is slot.wipe_verify's output: the wipe's evidence and, for an applied
// wipe, the signed proof of it.
type wipeVerifyOutput struct {
	disk.Evidence
	Proof *task.WipeProof `json:"proof,omitempty"`
}

func (a *Agent) signedWipe(env *task.Envelope, p *task.WipeVerify, ev disk.Evidence, werr error) wipeVerifyOutput {
	out := wipeVerifyOutput{Evidence: ev}
	if !p.Apply {
		return out
	}
	proof := task.WipeProof{Verified: werr == nil && ev.Verified, Method: ev.Method, Error: ev.Error,
		Evidence: fmt.Sprintf("%s (%s, %s): %d bytes, %d sampled, %d non-zero regions", p.Device, ev.Resolved, ev.Identity, ev.Bytes, ev.SampledBytes, ev.NonZeroRegions)}
	if werr != nil && proof.Error == "" {
		proof.Error = werr.Error()
	}
	proof.Details, _ = json.Marshal(ev)
	wiped := map[string]task.WipeProof{p.SlotID: proof}
	a.signProofs(env, "", wiped)
	proof = wiped[p.SlotID]
	out.Proof = &proof
	return out
}
