// Package telemetry is hostd's guest telemetry endpoint (seed 000: GPUAAS_TELEMETRY_ADDR,
// default :9110, POST /internal/v1/guest-telemetry). Each slice VM's helper authenticates
// with the per-allocation token registered at provision time; bodies are bounded JSON
// objects; the latest report per allocation is kept for readiness and reconcile.
package telemetry

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// MaxBody bounds a telemetry report.
const MaxBody = 64 << 10

// Report is the latest telemetry of one allocation.
type Report struct {
	AllocationID string          `json:"allocation_id"`
	ReceivedAt   time.Time       `json:"received_at"`
	Body         json.RawMessage `json:"body"`
}

// Registry holds per-allocation tokens and reports.
type Registry struct {
	mu      sync.RWMutex
	tokens  map[string]string // allocation -> token
	reports map[string]Report
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{tokens: map[string]string{}, reports: map[string]Report{}}
}

// Register issues (or returns the existing) token of an allocation: provisioning is idempotent.
func (r *Registry) Register(allocationID string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.tokens[allocationID]; ok {
		return t, nil
	}
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	t := "gpt_" + base64.RawURLEncoding.EncodeToString(b[:])
	r.tokens[allocationID] = t
	return t, nil
}

// Unregister revokes an allocation's token and forgets its reports (release).
func (r *Registry) Unregister(allocationID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.tokens, allocationID)
	delete(r.reports, allocationID)
}

// Latest returns the allocation's last report.
func (r *Registry) Latest(allocationID string) (Report, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	rep, ok := r.reports[allocationID]
	return rep, ok
}

func (r *Registry) allocationFor(token string) (string, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for a, t := range r.tokens {
		if subtle.ConstantTimeCompare([]byte(t), []byte(token)) == 1 {
			return a, true
		}
	}
	return "", false
}

// Handler serves POST /internal/v1/guest-telemetry.
func (r *Registry) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /internal/v1/guest-telemetry", func(w http.ResponseWriter, req *http.Request) {
		tok, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
		alloc, known := r.allocationFor(strings.TrimSpace(tok))
		if !ok || !known {
			http.Error(w, `{"code":"unauthorized","message":"unknown telemetry token"}`, http.StatusUnauthorized)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, MaxBody))
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			http.Error(w, `{"code":"payload_too_large","message":"telemetry body over 64 KiB"}`, http.StatusRequestEntityTooLarge)
			return
		}
		var obj map[string]any
		if err != nil || json.Unmarshal(body, &obj) != nil || obj == nil {
			http.Error(w, `{"code":"invalid_request","message":"body must be a JSON object"}`, http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		if _, still := r.tokens[alloc]; still {
			r.reports[alloc] = Report{AllocationID: alloc, ReceivedAt: time.Now().UTC(), Body: body}
		}
		r.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}
