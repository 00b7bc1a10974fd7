package slicevm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// imagePinFile, in a slice's directory, names the digest of the image the slice was (or is
// being) written from. It is written before the image is fetched and goes with the
// directory at release, so the host's image cache never evicts an image that a provision is
// writing or that a live slice booted from (the cache's Pinned hook is ImagesInUse).
const imagePinFile = "image.sha256"

// pinImage records digest as the image of allocationID's slice, creating the slice
// directory if needed.
func (h *Host) pinImage(allocationID, digest string) error {
	dir := h.SliceDir(allocationID)
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, imagePinFile), []byte(digest+"\n"), 0o600)
}

// ImagesInUse returns the digests of the images the slices on this host use: one per slice
// directory, and each image staged (or being staged) on an idle slot's disk (staging.go). A slice directory that does not say which image it holds (made by an older
// hostd, or half written) is an error: the cache then evicts nothing rather than guess.
func (h *Host) ImagesInUse() (map[string]bool, error) {
	root := filepath.Join(h.cfg.DataDir, "slices")
	des, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		out := map[string]bool{}
		return out, h.stagedImages(out)
	}
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, de := range des {
		if !de.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, de.Name(), imagePinFile))
		if err != nil {
			return nil, fmt.Errorf("slice %s: which image it uses is unknown: %w", de.Name(), err)
		}
		d := strings.TrimSpace(string(b))
		if len(d) != 64 {
			return nil, fmt.Errorf("slice %s: %s holds %q, not a sha256 digest", de.Name(), imagePinFile, d)
		}
		out[d] = true
	}
	return out, h.stagedImages(out)
}
