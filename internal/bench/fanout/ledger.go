package fanout

import (
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
)

// ledger matches committed tasks with receipts, both timed by this process's clock.
type ledger struct {
	mu         sync.Mutex
	committed  map[string]time.Time
	received   map[string][]time.Time
	pending    int         // committed, not yet received
	empty      []time.Time // polls answered 204 (a wait ran out: the host polls again)
	refused    int
	pollErrors int
	firstError string
}

func newLedger() *ledger {
	return &ledger{committed: map[string]time.Time{}, received: map[string][]time.Time{}}
}

func (l *ledger) commit(id string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.committed[id] = at
	if len(l.received[id]) == 0 {
		l.pending++
	}
}

// receive records a delivery; ok is false when the envelope failed verification.
func (l *ledger) receive(id string, at time.Time, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.received[id] = append(l.received[id], at)
	if _, c := l.committed[id]; c && len(l.received[id]) == 1 {
		l.pending--
	}
	if !ok {
		l.refused++
	}
}

// pollEmpty records a poll whose wait ran out with nothing to do.
func (l *ledger) pollEmpty(at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.empty = append(l.empty, at)
}

func (l *ledger) pollError(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pollErrors == 0 {
		l.firstError = err.Error()
	}
	l.pollErrors++
}

// outstanding is how many committed tasks have not arrived yet.
func (l *ledger) outstanding() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pending
}

type summary struct {
	committed, lost, duplicates, unexpected int
	latencies                               []time.Duration // first receipt minus commit
	series                                  []Second        // from start, one a second
}

// Second is one second of the task stream: tasks committed in it, their latency, and the
// polls whose wait ran out in it (each is followed by a fresh poll: authentication and a
// lease query on the controller).
type Second struct {
	At         int     `json:"t"`
	Tasks      int     `json:"tasks"`
	P99ms      float64 `json:"p99_ms"`
	MaxMs      float64 `json:"max_ms"`
	EmptyPolls int     `json:"empty_polls"`
}

// summary matches commits with receipts; the series covers seconds [0, seconds) after start.
func (l *ledger) summary(start time.Time, seconds int) summary {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := summary{committed: len(l.committed)}
	per := map[int][]time.Duration{}
	for id, at := range l.committed {
		got := l.received[id]
		if len(got) == 0 {
			s.lost++
			continue
		}
		s.duplicates += len(got) - 1
		s.latencies = append(s.latencies, got[0].Sub(at))
		if sec := int(at.Sub(start) / time.Second); sec >= 0 && sec < seconds {
			per[sec] = append(per[sec], got[0].Sub(at))
		}
	}
	empty := map[int]int{}
	for _, at := range l.empty {
		empty[int(at.Sub(start)/time.Second)]++
	}
	for sec := 0; sec < seconds; sec++ {
		s.series = append(s.series, Second{At: sec, Tasks: len(per[sec]), P99ms: benchenv.Percentile(per[sec], 99),
			MaxMs: benchenv.Percentile(per[sec], 100), EmptyPolls: empty[sec]})
	}
	for id := range l.received {
		if _, ok := l.committed[id]; !ok {
			s.unexpected++
		}
	}
	return s
}
