package slicevm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/internal/disk"
	"github.com/gpuaas/gpuaas/internal/task"
)

// Warm slots (docs/images.md): once a slot's disk is wiped and its wipe proof recorded, the
// controller may ask the host (slot.image_stage) to write its SKU's default image onto that
// idle disk. The host keeps a record of what it wrote, DATA/staged/<slot>.json, and a
// provision of the same image onto the same disk skips image_write_convert. The record is
// the host's own word about the disk: it is written only after the image is on the disk,
// dropped before any wipe of that slot, and taken (removed) by the next provision of the
// slot whatever its image, so a disk is never trusted to hold an image after anything else
// could have written it. While a record exists (writing or staged) the host's image cache
// never evicts its image.

// StagedImage is a host's record of an image it wrote onto an idle slot's disk.
type StagedImage struct {
	SlotID       string    `json:"slot_id"`
	Device       string    `json:"device"` // the slot's /dev/disk/by-id path
	Disk         string    `json:"disk"`   // what it resolved to when written
	Image        string    `json:"image"`
	DigestSHA256 string    `json:"digest_sha256"`
	State        string    `json:"state"` // writing, staged
	StagedAt     time.Time `json:"staged_at,omitzero"`
}

// Stager is a runtime that stages images on idle slots' disks and forgets them when a slot's
// disk is wiped outside a release (a standalone slot.wipe_verify).
type Stager interface {
	Stage(ctx context.Context, p *task.ImageStage, rec *Recorder) (task.StageOutput, error)
	DropStaged(slotID string)
}

// staging is the stagings running on a host, by slot: a provision or release of the slot
// cancels its staging and waits for it to end before it touches the disk.
type staging struct {
	mu      sync.Mutex
	running map[string]*stageRun
}

type stageRun struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (h *Host) stagedDir() string { return filepath.Join(h.cfg.DataDir, "staged") }

func (h *Host) stagedPath(slotID string) string { return filepath.Join(h.stagedDir(), slotID+".json") }

func (h *Host) writeStaged(s StagedImage) error {
	if err := os.MkdirAll(h.stagedDir(), 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	tmp := h.stagedPath(s.SlotID) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, h.stagedPath(s.SlotID))
}

// Stage writes p.Image onto the slot's disk: the image is fetched into the cache and
// verified (signature first when required), the disk resolved (a block device, not mounted)
// and refused when a lease holds the slot or its disk, then converted onto it. The record
// says "writing" from before the fetch (the cache keeps the image) and "staged" only once
// the write finished.
func (h *Host) Stage(ctx context.Context, p *task.ImageStage, rec *Recorder) (task.StageOutput, error) {
	out := task.StageOutput{SlotID: p.SlotID, DigestSHA256: p.Image.DigestSHA256}
	if p.SlotID == "" || !safeSlotID(p.SlotID) || len(p.Image.DigestSHA256) != 64 {
		return out, errors.New("image_stage: a slot id and a sha256 digest are required")
	}
	ctx, run := h.startStaging(ctx, p.SlotID)
	defer run()
	var diskPath, imagePath string
	steps := []struct {
		name string
		fn   func() (string, error)
	}{
		{"stage_check", func() (string, error) {
			held, err := h.cfg.Leases.Held()
			if err != nil {
				return "", err
			}
			if owner := leasedToOther(held, task.Bundle{SlotID: p.SlotID, NVMeDevice: p.Device}, ""); owner != "" {
				return "", fmt.Errorf("slot %s is leased to allocation %s: its disk is not idle", p.SlotID, owner)
			}
			w := disk.Wiper{FS: h.cfg.FS, Run: h.cfg.Run}
			if diskPath, err = w.Resolve(p.Device); err != nil {
				return "", err
			}
			return p.Device + " -> " + diskPath + ", idle", nil
		}},
		{"image_stat_download", func() (string, error) {
			signed, err := verifyImageSignature(&task.VMProvision{Image: p.Image, ImageKeys: p.ImageKeys})
			if err != nil {
				return "", err
			}
			if err := h.writeStaged(StagedImage{SlotID: p.SlotID, Device: p.Device, Disk: diskPath, Image: p.Image.Slug,
				DigestSHA256: p.Image.DigestSHA256, State: "writing"}); err != nil {
				return "", err
			}
			var fresh bool
			if imagePath, fresh, err = h.cfg.Images.Get(ctx, p.Image.SourceRef, p.Image.DigestSHA256); err != nil {
				return "", err
			}
			if _, err := h.cfg.Images.Verify(p.Image.DigestSHA256); err != nil {
				return "", err
			}
			return fmt.Sprintf("%s (%s)%s", p.Image.Slug, map[bool]string{true: "downloaded", false: "cached"}[fresh], signed), nil
		}},
		{"image_write_convert", func() (string, error) {
			format := p.Image.Format
			if format == "" {
				format = "qcow2"
			}
			if _, err := h.cfg.Run.Run(ctx, "qemu-img", "convert", "-q", "-f", format, "-O", "raw", "-n", imagePath, diskPath); err != nil {
				return "", fmt.Errorf("qemu-img convert onto %s: %w", diskPath, err)
			}
			if err := ctx.Err(); err != nil {
				return "", err // cancelled by a provision or release of the slot: not staged
			}
			if err := h.writeStaged(StagedImage{SlotID: p.SlotID, Device: p.Device, Disk: diskPath, Image: p.Image.Slug,
				DigestSHA256: p.Image.DigestSHA256, State: "staged", StagedAt: time.Now().UTC()}); err != nil {
				return "", err
			}
			out.Disk = diskPath
			return fmt.Sprintf("%s -> %s (raw), staged", p.Image.Slug, diskPath), nil
		}},
	}
	for _, s := range steps {
		if err := rec.RunDetail(s.name, s.fn); err != nil {
			_ = os.Remove(h.stagedPath(p.SlotID)) // never leave a half-written disk looking staged
			return out, fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return out, nil
}

// startStaging registers a staging of slotID, ending any earlier one first; the returned
// function marks it finished.
func (h *Host) startStaging(ctx context.Context, slotID string) (context.Context, func()) {
	h.stopStaging(slotID)
	ctx, cancel := context.WithCancel(ctx)
	r := &stageRun{cancel: cancel, done: make(chan struct{})}
	h.stages.mu.Lock()
	if h.stages.running == nil {
		h.stages.running = map[string]*stageRun{}
	}
	h.stages.running[slotID] = r
	h.stages.mu.Unlock()
	return ctx, func() {
		cancel()
		h.stages.mu.Lock()
		if h.stages.running[slotID] == r {
			delete(h.stages.running, slotID)
		}
		h.stages.mu.Unlock()
		close(r.done)
	}
}

// stopStaging cancels a staging of slotID in progress and waits until it has ended.
func (h *Host) stopStaging(slotID string) {
	h.stages.mu.Lock()
	r := h.stages.running[slotID]
	h.stages.mu.Unlock()
	if r != nil {
		r.cancel()
		<-r.done
	}
}

// DropStaged forgets what was staged on slotID's disk (its staging, if running, is stopped
// first): the disk is about to be wiped or written.
func (h *Host) DropStaged(slotID string) {
	if !safeSlotID(slotID) {
		return
	}
	h.stopStaging(slotID)
	_ = os.Remove(h.stagedPath(slotID))
}

// takeStaged stops any staging on the bundles' slots and removes their records, returning
// the finished ones by slot: the provision that calls it owns those disks from now on.
func (h *Host) takeStaged(bs []task.Bundle) map[string]StagedImage {
	out := map[string]StagedImage{}
	for _, b := range bs {
		if !safeSlotID(b.SlotID) {
			continue
		}
		h.stopStaging(b.SlotID)
		raw, err := os.ReadFile(h.stagedPath(b.SlotID))
		_ = os.Remove(h.stagedPath(b.SlotID))
		var s StagedImage
		if err == nil && json.Unmarshal(raw, &s) == nil && s.State == "staged" && s.SlotID == b.SlotID && s.Device == b.NVMeDevice {
			out[b.SlotID] = s
		}
	}
	return out
}

// stagedSkip says why image_write_convert may skip the boot disk ("" when it may not): the
// slot's record, taken by this provision, says this very image was written onto this very
// disk after the slot's last wipe.
func stagedSkip(staged map[string]StagedImage, boot task.Bundle, disk, digest string) string {
	s, ok := staged[boot.SlotID]
	if !ok || s.DigestSHA256 != digest || s.Disk != disk {
		return ""
	}
	return fmt.Sprintf("image staged on this disk after its wipe proof (%s, %s, staged %s)", s.Image, disk, s.StagedAt.Format(time.RFC3339))
}

// stagedImages are the digests the staged records name (writing or staged): the cache keeps them.
func (h *Host) stagedImages(out map[string]bool) error {
	des, err := os.ReadDir(h.stagedDir())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, de := range des {
		if filepath.Ext(de.Name()) != ".json" {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(h.stagedDir(), de.Name()))
		if errors.Is(err, os.ErrNotExist) {
			continue // taken meanwhile
		}
		var s StagedImage
		if err != nil || json.Unmarshal(raw, &s) != nil || len(s.DigestSHA256) != 64 {
			return fmt.Errorf("staged record %s is unreadable: %v", de.Name(), err)
		}
		out[s.DigestSHA256] = true
	}
	return nil
}

// safeSlotID is a slot id fit for a file name (slot ids are UUIDs).
func safeSlotID(id string) bool {
	return id != "" && len(id) <= 128 && !strings.ContainsAny(id, "/\\") && !strings.HasPrefix(id, ".")
}

// Stage on the sim runtime writes nothing: its one phase says simulated, and the output says
// so (the controller records it only when it allows simulated hosts).
func (s Sim) Stage(ctx context.Context, p *task.ImageStage, rec *Recorder) (task.StageOutput, error) {
	rec.Simulated = true
	out := task.StageOutput{SlotID: p.SlotID, DigestSHA256: p.Image.DigestSHA256, Simulated: true}
	return out, rec.Run("image_write_convert", func() error {
		if err := s.pause(ctx, rec, "image_write_convert"); err != nil {
			return err
		}
		if len(p.Image.DigestSHA256) != 64 {
			return fmt.Errorf("image %s has no sha256 digest", p.Image.Slug)
		}
		_, err := verifyImageSignature(&task.VMProvision{Image: p.Image, ImageKeys: p.ImageKeys})
		return err
	})
}

// DropStaged on the sim runtime has nothing to forget.
func (Sim) DropStaged(string) {}
