package task

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
)

var taskIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// Replay store bounds (defaults of DiskReplayStore).
const (
	// DefaultReplayMax is the most completed task ids kept; far above what a host completes
	// within any task's validity window.
	DefaultReplayMax = 100_000
	// DefaultPruneEvery is how often expired records are swept while tasks complete.
	DefaultPruneEvery = 10 * time.Minute
	// legacyKeep is how long a record written without an expiry (an older hostd) is kept
	// after it was written: longer than any validity window the controller signs.
	legacyKeep = 30 * 24 * time.Hour
)

// watermarkFile holds the latest not_after of any record dropped (pruned or evicted). Task
// ids never start with a dot, so it cannot collide with a record.
const watermarkFile = ".dropped-until"

// ErrOutsideReplayWindow is a task whose not_after is at or before the newest expiry the
// store has dropped: the store can no longer tell whether it ran, so it is never run.
var ErrOutsideReplayWindow = errors.New("task expires within the window the replay store has dropped")

// DiskReplayStore remembers completed task ids as 0600 files in a directory (each holding
// the task's not_after), so a replayed task is refused even after hostd restarts.
//
// It stays small: a record is pruned once its task's not_after plus the clock skew has
// passed (the verifier refuses that task as expired from then on), and at most Max records
// are kept; past that the records expiring soonest are evicted. Whatever is dropped raises
// a durable watermark, and a task expiring at or before it is refused
// (ErrOutsideReplayWindow), never run: a replay is never accepted, not after pruning, not
// after eviction, not after the host clock steps back.
type DiskReplayStore struct {
	Dir string
	// Skew is the verifier's clock-skew tolerance: records live until not_after + Skew.
	Skew time.Duration
	// Max bounds the number of records (DefaultReplayMax when 0).
	Max int
	// PruneEvery spaces sweeps for expired records (DefaultPruneEvery when 0).
	PruneEvery time.Duration
	Now        func() time.Time

	mu        sync.Mutex
	count     int
	watermark time.Time
	lastPrune time.Time
}

// NewDiskReplayStore creates the directory (0700) if needed and loads the watermark; the
// first MarkCompleted sweeps expired records.
func NewDiskReplayStore(dir string, skew time.Duration) (*DiskReplayStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("replay store: %w", err)
	}
	d := &DiskReplayStore{Dir: dir, Skew: skew}
	if b, err := os.ReadFile(filepath.Join(dir, watermarkFile)); err == nil {
		w, perr := time.Parse(time.RFC3339Nano, strings.TrimSpace(string(b)))
		if perr != nil {
			return nil, fmt.Errorf("replay store: watermark %s is corrupt (refusing to guess): %w", filepath.Join(dir, watermarkFile), perr)
		}
		d.watermark = w
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("replay store: %w", err)
	}
	return d, nil
}

func (d *DiskReplayStore) now() time.Time {
	if d.Now != nil {
		return d.Now()
	}
	return time.Now()
}

func (d *DiskReplayStore) max() int {
	if d.Max > 0 {
		return d.Max
	}
	return DefaultReplayMax
}

func (d *DiskReplayStore) path(id string) (string, error) {
	if !taskIDRE.MatchString(id) {
		return "", fmt.Errorf("task id %q is not a safe file name", id)
	}
	return filepath.Join(d.Dir, id), nil
}

// Completed reports whether id was marked done. A task expiring at or before the watermark
// is ErrOutsideReplayWindow: its record may have been dropped.
func (d *DiskReplayStore) Completed(id string, notAfter time.Time) (bool, error) {
	p, err := d.path(id)
	if err != nil {
		return false, err
	}
	_, err = os.Stat(p)
	if err == nil {
		return true, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	d.mu.Lock()
	w := d.watermark
	d.mu.Unlock()
	if !w.IsZero() && !notAfter.After(w) {
		return false, fmt.Errorf("%w (task expires %s, records up to %s dropped)", ErrOutsideReplayWindow,
			notAfter.UTC().Format(time.RFC3339), w.UTC().Format(time.RFC3339))
	}
	return false, nil
}

// MarkCompleted records id, valid until notAfter, durably (file written and synced,
// directory synced). It sweeps expired records every PruneEvery and evicts the records
// expiring soonest when the store is full.
func (d *DiskReplayStore) MarkCompleted(id string, notAfter time.Time) error {
	p, err := d.path(id)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	every := d.PruneEvery
	if every <= 0 {
		every = DefaultPruneEvery
	}
	if d.now().Sub(d.lastPrune) >= every || d.count >= d.max() {
		if err := d.prune(); err != nil {
			return err
		}
	}
	if d.count >= d.max() {
		if err := d.evict(d.count - d.max() + 1 + d.max()/10); err != nil {
			return err
		}
	}
	_, statErr := os.Stat(p)
	if err := writeSynced(p, []byte(notAfter.UTC().Format(time.RFC3339Nano))); err != nil {
		return err
	}
	if errors.Is(statErr, os.ErrNotExist) {
		d.count++
	}
	return syncDir(d.Dir)
}

// Prune drops the records whose task has expired beyond the clock skew.
func (d *DiskReplayStore) Prune() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.prune()
}

// Len is the number of records kept.
func (d *DiskReplayStore) Len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.count
}

type record struct {
	id      string
	expires time.Time // the task's not_after
}

func (d *DiskReplayStore) records() ([]record, error) {
	entries, err := os.ReadDir(d.Dir)
	if err != nil {
		return nil, fmt.Errorf("replay store: %w", err)
	}
	out := make([]record, 0, len(entries))
	for _, e := range entries {
		if !taskIDRE.MatchString(e.Name()) || !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d.Dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("replay store: %w", err)
		}
		exp, perr := time.Parse(time.RFC3339Nano, strings.TrimSpace(string(b)))
		if perr != nil {
			// Written without an expiry (an older hostd) or damaged: kept for legacyKeep
			// after it was written, which outlives any task validity the controller signs.
			fi, err := e.Info()
			if err != nil {
				return nil, fmt.Errorf("replay store: %w", err)
			}
			exp = fi.ModTime().Add(legacyKeep)
		}
		out = append(out, record{id: e.Name(), expires: exp})
	}
	return out, nil
}

func (d *DiskReplayStore) prune() error {
	rs, err := d.records()
	if err != nil {
		return err
	}
	now := d.now()
	d.lastPrune = now
	var drop []record
	for _, r := range rs {
		if now.After(r.expires.Add(d.Skew)) {
			drop = append(drop, r)
		}
	}
	if err := d.drop(drop); err != nil {
		return err
	}
	d.count = len(rs) - len(drop)
	return nil
}

// evict drops the n records expiring soonest (the store is full of live records).
func (d *DiskReplayStore) evict(n int) error {
	rs, err := d.records()
	if err != nil {
		return err
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].expires.Before(rs[j].expires) })
	n = min(n, len(rs))
	if err := d.drop(rs[:n]); err != nil {
		return err
	}
	d.count = len(rs) - n
	return nil
}

// drop raises the watermark to the latest expiry among rs (durably, first), then removes
// them: a crash in between leaves records the watermark already covers, never the reverse.
func (d *DiskReplayStore) drop(rs []record) error {
	if len(rs) == 0 {
		return nil
	}
	w := d.watermark
	for _, r := range rs {
		if r.expires.After(w) {
			w = r.expires
		}
	}
	if w.After(d.watermark) {
		if err := writeSynced(filepath.Join(d.Dir, watermarkFile), []byte(w.UTC().Format(time.RFC3339Nano))); err != nil {
			return fmt.Errorf("replay store watermark: %w", err)
		}
		if err := syncDir(d.Dir); err != nil {
			return err
		}
		d.watermark = w
	}
	for _, r := range rs {
		if err := os.Remove(filepath.Join(d.Dir, r.id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("replay store: %w", err)
		}
	}
	return nil
}

// writeSynced writes b to p (0600) through a temporary file renamed into place (its name
// starts with a dot, so it is never taken for a record).
func writeSynced(p string, b []byte) error {
	tmp := filepath.Join(filepath.Dir(p), "."+filepath.Base(p)+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
