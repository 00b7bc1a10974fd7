package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/gpuaas/gpuaas/internal/imagesig"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
)

// Warm slots (docs/images.md): once a slot is back on sale after its wipe proof (and its
// validation, when its SKU asks for one), a SKU with warm_slots has its host write the SKU's
// default image onto the slot's idle disk (slot.image_stage); the host's report is recorded
// on the slot. The order on a release is wipe -> proof -> validation -> staging.

// stageTTL bounds a staging task: writing a several-GiB image onto a disk.
const stageTTL = 30 * time.Minute

// stageAfter queues stagings on the node of a result that may have put slots back on sale
// (a release, a repair wipe, a validation). Best effort: the result is already applied, and
// a slot left unstaged is only a slower next provision.
func (d *Dispatcher) stageAfter(ctx context.Context, tr store.TaskRecord) {
	switch task.Type(tr.Type) {
	case task.TypeVMRelease, task.TypeWipeVerify, task.TypeSlotValidate:
	default:
		return
	}
	if err := d.queueStaging(ctx, tr.NodeID); err != nil {
		d.log.Warn("warm slots: staging not queued", "node", tr.NodeID, "err", err)
	}
}

// StageSKU queues stagings on every node whose slices are sku (its warm-slot policy was
// just turned on).
func (d *Dispatcher) StageSKU(ctx context.Context, sku string) error {
	nodes, err := d.st.NodesOfSliceSKU(ctx, sku)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if err := d.queueStaging(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

// queueStaging queues slot.image_stage for each of nodeID's idle slots a warm SKU's default
// image is not staged on yet (store.StageCandidates).
func (d *Dispatcher) queueStaging(ctx context.Context, nodeID string) error {
	cands, err := d.st.StageCandidates(ctx, nodeID)
	if err != nil || len(cands) == 0 {
		return err
	}
	for _, c := range cands {
		var img task.Image
		raw, _ := json.Marshal(c.Image) // ResolvedImage and task.Image share their JSON form (the image snapshot)
		if err := json.Unmarshal(raw, &img); err != nil {
			return err
		}
		var keys []imagesig.Key
		if img.SignatureRequired {
			keys = d.cfg.ImageKeys
		}
		p := task.ImageStage{SlotID: c.SlotID, Device: c.NVMeDevice, DiskIdentity: c.DiskIdentity, Image: img, ImageKeys: keys,
			AfterWipeProof: c.AfterProof}
		if _, err := d.QueueTask(ctx, nodeID, task.TypeImageStage, p, stageTTL); err != nil {
			return err
		}
	}
	return nil
}

// applyStaging records a finished staging on its slot. A simulated one (sim runtime: nothing
// written) is recorded only where simulated hosts are allowed; a failed one records nothing.
func (d *Dispatcher) applyStaging(ctx context.Context, tr store.TaskRecord) error {
	if tr.Status != "succeeded" {
		return nil
	}
	var p task.ImageStage
	if err := json.Unmarshal(tr.Payload, &p); err != nil {
		return err
	}
	var out task.StageOutput
	if err := json.Unmarshal(tr.Output, &out); err != nil || out.SlotID != p.SlotID || out.DigestSHA256 != p.Image.DigestSHA256 {
		d.log.Warn("warm slots: staging report does not match its task", "task", tr.ID, "err", err)
		return nil
	}
	if out.Simulated && !d.cfg.AllowSimulated {
		return nil
	}
	ok, err := d.st.RecordStaged(ctx, p.SlotID, p.Image.ID, p.Image.DigestSHA256, p.AfterWipeProof)
	if err == nil && !ok {
		d.log.Info("warm slots: slot no longer idle or wiped again since; staging not recorded", "slot", p.SlotID, "task", tr.ID)
	}
	if errors.Is(err, store.ErrInvalid) || errors.Is(err, store.ErrConflict) {
		d.log.Warn("warm slots: staging refused", "slot", p.SlotID, "err", err)
		return nil
	}
	return err
}
