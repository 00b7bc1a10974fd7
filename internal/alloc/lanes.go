package alloc

import (
	"sync"

	"github.com/gpuaas/gpuaas/internal/sched"
)

// lanes numbers this replica's creates in a transaction: each takes the lowest number no
// other create holds and gives it back when its transaction has ended. A create's windows read the nodes alike that
// hold no allocation of its lane (emptySkip): on an empty fleet concurrent creates rank the
// same windows, and each needs a node of its own to land on. Reading the same first empty
// nodes, one more for each create under way, they raced for them and read each other's slot
// rows (a 16-client window was most of PostgreSQL's CPU per pair beyond the raw script's);
// in lanes each reads two nodes nobody else in this replica is taking. A create alone is lane
// 0, which reads what a window always read for one: the first two.
type lanes struct {
	mu   sync.Mutex
	used []bool
}

// take returns the lowest free lane, now held.
func (l *lanes) take() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, u := range l.used {
		if !u {
			l.used[i] = true
			return i
		}
	}
	l.used = append(l.used, true)
	return len(l.used) - 1
}

// give frees lane n.
func (l *lanes) give(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.used[n] = false
}

// emptySkip is store.WindowRequest.EmptySkip for lane n: the empty nodes of the lanes before
// it. A window spans sched.WindowNodes positions, so lanes beyond that many pairs share (a
// replica's tenant pool, 8 connections by default, gives it 8 lanes at most); a window with
// fewer empty nodes than a lane skips reads its last ones (store.WindowRequest.EmptySkip).
func emptySkip(n int) int {
	return n % (sched.WindowNodes / sched.WindowEmptyTies) * sched.WindowEmptyTies
}
