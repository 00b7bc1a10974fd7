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
// outage loses nothing. One 0600 file per task, written atomically. Acknowledged results
// are kept a while longer in delivered/ (see Acknowledged).
type Spool struct {
	dir string

	mu     sync.Mutex
	pruned time.Time // last sweep of delivered/
}

// deliveredKeep is how long an acknowledged result is kept: longer than a task can be handed
// out again (its deadline: 20 minutes for provisioning, 30 for a release by default).
const deliveredKeep = 2 * time.Hour

// NewSpool creates the spool directory.
func NewSpool(dir string) (*Spool, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	return &Spool{dir: dir}, nil
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

func (s *Spool) deliveredPath(taskID string) string {
	return filepath.Join(s.dir, "delivered", taskID+".json")
}

// Acknowledged moves a result the controller acknowledged to delivered/. A database that
// loses it afterwards (a failover to an asynchronous standby that had not received it) hands
// the task out again; the host refuses to run it twice and sends this result again instead
// (Resend), so the result is not lost with the database's copy.
func (s *Spool) Acknowledged(taskID string) error {
	if err := os.MkdirAll(filepath.Dir(s.deliveredPath(taskID)), 0o700); err != nil {
		return err
	}
	err := os.Rename(s.path(taskID), s.deliveredPath(taskID))
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	s.pruneDelivered()
	return err
}

// Resend puts an acknowledged result back in the spool, reporting whether one was kept.
func (s *Spool) Resend(taskID string) bool {
	return os.Rename(s.deliveredPath(taskID), s.path(taskID)) == nil
}

// pruneDelivered drops acknowledged results older than deliveredKeep, at most every ten
// minutes.
func (s *Spool) pruneDelivered() {
	s.mu.Lock()
	if time.Since(s.pruned) < 10*time.Minute {
		s.mu.Unlock()
		return
	}
	s.pruned = time.Now()
	s.mu.Unlock()
	dir := filepath.Join(s.dir, "delivered")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > deliveredKeep {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// Remove drops a result the controller refused (it will never accept it).
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
