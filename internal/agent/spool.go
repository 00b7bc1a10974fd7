package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/internal/task"
)

// Spool keeps task results on disk until the controller acknowledges them, so a controller
// outage loses nothing. One 0600 file per task, written atomically.
//
// An acknowledged result moves to reported/ and is kept for ReportedKeep: a controller
// restored from a backup taken before the acknowledgement still has the task as leased and
// hands it out again; the host, which never runs a task twice, then reports the kept result
// again instead of leaving the task to expire (Requeue).
type Spool struct {
	dir string

	mu        sync.Mutex
	lastPrune time.Time
}

// ReportedKeep is how long acknowledged results are kept for a restored controller: longer
// than any task's deadline and a restore's duration.
const ReportedKeep = 24 * time.Hour

// NewSpool creates the spool directory.
func NewSpool(dir string) (*Spool, error) {
	if err := os.MkdirAll(filepath.Join(dir, "reported"), 0o700); err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	s := &Spool{dir: dir}
	s.prune()
	return s, nil
}

func (s *Spool) reportedPath(taskID string) string {
	return filepath.Join(s.dir, "reported", taskID+".json")
}

// Acknowledged moves a result the controller accepted to reported/ (see Spool).
func (s *Spool) Acknowledged(taskID string) error {
	err := os.Rename(s.path(taskID), s.reportedPath(taskID))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	s.mu.Lock()
	due := time.Since(s.lastPrune) > time.Hour
	s.mu.Unlock()
	if due {
		s.prune()
	}
	return err
}

// Requeue puts a reported result back in the spool for delivery, reporting whether there was
// one: the controller asked again for a task this host completed and reported.
func (s *Spool) Requeue(taskID string) bool {
	return os.Rename(s.reportedPath(taskID), s.path(taskID)) == nil
}

// prune drops reported results older than ReportedKeep.
func (s *Spool) prune() {
	s.mu.Lock()
	s.lastPrune = time.Now()
	s.mu.Unlock()
	entries, err := os.ReadDir(filepath.Join(s.dir, "reported"))
	if err != nil {
		return
	}
	for _, e := range entries {
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > ReportedKeep {
			_ = os.Remove(filepath.Join(s.dir, "reported", e.Name()))
		}
	}
}

func (s *Spool) path(taskID string) string { return filepath.Join(s.dir, taskID+".json") }

// Put stores a result.
func (s *Spool) Put(r task.Result) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return writeAtomic(s.path(r.TaskID), b, 0o600)
}

// probeSize is written by Writable: about what a task result with its phases takes.
const probeSize = 16 << 10

// Writable proves the spool can take a result now (a full or read-only state filesystem
// fails here, before a task starts, instead of after it ran). No fsync: space is reserved
// at write time, and the result's own write syncs.
func (s *Spool) Writable() error {
	f, err := os.CreateTemp(s.dir, ".probe-*") // one per task: tasks run concurrently
	if err == nil {
		_, err = f.Write(make([]byte, probeSize))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if rerr := os.Remove(f.Name()); err == nil {
			err = rerr
		}
	}
	if err != nil {
		return fmt.Errorf("state dir %s: %w", s.dir, err)
	}
	return nil
}

// Has reports whether a result for taskID is waiting.
func (s *Spool) Has(taskID string) bool {
	_, err := os.Stat(s.path(taskID))
	return err == nil
}

// Remove drops an acknowledged result.
func (s *Spool) Remove(taskID string) error {
	err := os.Remove(s.path(taskID))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// Pending lists waiting results, oldest first.
func (s *Spool) Pending() ([]task.Result, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	type item struct {
		r   task.Result
		mod int64
	}
	var items []item
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		// The sender removes acknowledged results concurrently (heartbeats list the spool
		// too): a file gone since ReadDir was delivered, not lost.
		info, err := e.Info()
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		b, err := os.ReadFile(filepath.Join(s.dir, e.Name()))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var r task.Result
		if err := json.Unmarshal(b, &r); err != nil || r.TaskID == "" {
			continue // a torn file cannot exist (atomic writes); skip anything foreign
		}
		items = append(items, item{r, info.ModTime().UnixNano()})
	}
	sort.Slice(items, func(i, j int) bool { return items[i].mod < items[j].mod })
	out := make([]task.Result, len(items))
	for i, it := range items {
		out[i] = it.r
	}
	return out, nil
}
