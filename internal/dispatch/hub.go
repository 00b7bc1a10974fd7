// Package dispatch turns allocation events into signed node tasks and delivers them: the
// outbox worker queues typed tasks, long polls wait on an in-process hub woken after commit
// (and across controller replicas through PostgreSQL LISTEN/NOTIFY), tasks are leased with a
// visibility timeout, and results drive the allocation and slot state machines.
package dispatch

import "sync"

// Hub wakes long polls waiting for a node's tasks. No per-host database polling: a waiting
// poll sleeps on its channel until a task for its node is committed or its wait ends.
type Hub struct {
	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{}
}

// NewHub returns an empty hub.
func NewHub() *Hub { return &Hub{waiters: map[string]map[chan struct{}]struct{}{}} }

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
	for ch := range h.waiters[node] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Waiting reports how many polls wait for node (metrics, tests).
func (h *Hub) Waiting(node string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.waiters[node])
}
