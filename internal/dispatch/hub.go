// Package dispatch turns allocation events into signed node tasks and delivers them: the
// outbox worker queues typed tasks, long polls wait on an in-process hub woken after commit
// (and across controller replicas through PostgreSQL LISTEN/NOTIFY), tasks are leased with a
// visibility timeout, and results drive the allocation and slot state machines.
package dispatch

import (
	"sync"
	"time"
)

// Hub wakes long polls waiting for a node's tasks. No per-host database polling: a waiting
// poll sleeps on its channel until a task for its node is committed or its wait ends.
type Hub struct {
	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{}
	nodes   map[string]*nodeWakes
}

// nodeWakes lets a renewed long poll skip the database: gen counts wakes for the node;
// emptyGen/emptyAt record the last time a lease query found nothing and the gen it saw then.
type nodeWakes struct {
	gen, emptyGen uint64
	emptyAt       time.Time
}

// NewHub returns an empty hub.
func NewHub() *Hub {
	return &Hub{waiters: map[string]map[chan struct{}]struct{}{}, nodes: map[string]*nodeWakes{}}
}

func (h *Hub) node(id string) *nodeWakes {
	n := h.nodes[id]
	if n == nil {
		n = &nodeWakes{}
		h.nodes[id] = n
	}
	return n
}

// Gen is the node's wake count, read before a lease query.
func (h *Hub) Gen(node string) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.node(node).gen
}

// Empty records that a lease query begun at wake count gen found nothing runnable.
func (h *Hub) Empty(node string, gen uint64, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.node(node)
	n.emptyGen, n.emptyAt = gen, at
}

// NothingNew reports whether the node has had no wake since a lease query found nothing,
// within maxAge (past it, a query runs anyway: a lease that expired wakes nobody).
func (h *Hub) NothingNew(node string, now time.Time, maxAge time.Duration) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.nodes[node]
	return n != nil && !n.emptyAt.IsZero() && n.gen == n.emptyGen && now.Sub(n.emptyAt) < maxAge
}

// Subscribe returns a channel signalled when node may have work, and a cancel func.
func (h *Hub) Subscribe(node string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	if h.waiters[node] == nil {
		h.waiters[node] = map[chan struct{}]struct{}{}
	}
	h.waiters[node][ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.waiters[node], ch)
		if len(h.waiters[node]) == 0 {
			delete(h.waiters, node)
		}
		h.mu.Unlock()
	}
}

// Wake signals every poll waiting for node (non-blocking).
func (h *Hub) Wake(node string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.node(node).gen++
	for ch := range h.waiters[node] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// WakeAll signals every waiting poll and makes every node's next poll query the database:
// wake-ups may have been lost (this replica's LISTEN connection was down).
func (h *Hub) WakeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, n := range h.nodes {
		n.gen++
	}
	for _, chs := range h.waiters {
		for ch := range chs {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}

// Waiting reports how many polls wait for node (metrics, tests).
func (h *Hub) Waiting(node string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.waiters[node])
}
