package task

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
)

var taskIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// DiskReplayStore remembers completed task ids as empty 0600 files in a directory, so a
// replayed task is refused even after hostd restarts.
type DiskReplayStore struct{ Dir string }

// NewDiskReplayStore creates the directory (0700) if needed.
func NewDiskReplayStore(dir string) (*DiskReplayStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("replay store: %w", err)
	}
	return &DiskReplayStore{Dir: dir}, nil
}

func (d *DiskReplayStore) path(id string) (string, error) {
	if !taskIDRE.MatchString(id) {
		return "", fmt.Errorf("task id %q is not a safe file name", id)
	}
	return filepath.Join(d.Dir, id), nil
}

// Completed reports whether id was marked done.
func (d *DiskReplayStore) Completed(id string) (bool, error) {
	p, err := d.path(id)
	if err != nil {
		return false, err
	}
	_, err = os.Stat(p)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// MarkCompleted records id durably (file created and directory synced).
func (d *DiskReplayStore) MarkCompleted(id string) error {
	p, err := d.path(id)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	dir, err := os.Open(d.Dir)
	if err != nil {
		return err
	}
	defer dir.Close()
	return dir.Sync()
}
