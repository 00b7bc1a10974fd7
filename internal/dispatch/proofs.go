package dispatch

import (
	"context"
	"encoding/json"
	"time"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/disk"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
	"github.com/gpuaas/gpuaas/internal/wipeproof"
)

// checkProof turns a host's wipe proof for slot, reported in task tr, into the proof the
// allocation service records. It counts as verified only if the host said so, the task
// succeeded, and its signature checks against the reporting node's enrolled certificate
// (internal/wipeproof): a proof signed with another node's key, altered, unsigned, or
// replayed from another task is recorded as unverified with the reason, and the slot stays
// behind the wipe gate.
func (d *Dispatcher) checkProof(ctx context.Context, tr store.TaskRecord, slot string, p task.WipeProof) alloc.WipeProof {
	out := alloc.WipeProof{Verified: p.Verified && tr.Status == "succeeded", Method: p.Method, Evidence: p.Evidence, Error: p.Error,
		NodeID: tr.NodeID, TaskID: tr.ID}
	chk, err := wipeproof.Verify(p, wipeproof.Expect{NodeID: tr.NodeID, TaskID: tr.ID, SlotID: slot, Roots: d.cfg.NodeCA,
		Enrolled: func(serial string) (string, error) { return d.st.CredentialNode(ctx, serial) }, Now: d.now()})
	if err != nil {
		if out.Verified {
			d.log.Warn("wipe proof refused", "task", tr.ID, "node", tr.NodeID, "slot", slot, "err", err)
			out.Verified, out.Error = false, err.Error()
		}
		return out
	}
	out.Document, out.Signature, out.SignerSerial, out.SignerCert = p.Document, p.Signature, chk.SignerSerial, p.SignerCert
	var ev struct {
		Identity   disk.Identity `json:"identity"`
		FinishedAt time.Time     `json:"finished_at"`
	}
	if len(chk.Document.Details) > 0 && json.Unmarshal(chk.Document.Details, &ev) == nil {
		out.DeviceIdentity, out.FinishedAt = ev.Identity.String(), ev.FinishedAt
	}
	if out.FinishedAt.IsZero() {
		out.FinishedAt = chk.Document.SignedAt
	}
	return out
}
