// Package telemetry is hostd's guest telemetry endpoint (seed 000: GPUAAS_TELEMETRY_ADDR,
// default :9110, POST /internal/v1/guest-telemetry). Each slice VM's helper authenticates
// with the per-allocation token registered at provision time; bodies are bounded JSON
// objects. The tokens are kept in hostd's state directory (OpenRegistry), so a guest's
// token still works after hostd restarts and a retried provision hands out the same one.
// The latest report per allocation is kept in memory; reconcile reports when each slice's
// guest last reported (readiness does not wait for it: the SSH gate decides).
package telemetry

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
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
	file    string // where the tokens are kept ("" keeps them in memory only)
	// OnReport, when set (before the handler serves), is called with each accepted report,
	// after it is stored: hostd forwards the health part of it (docs/health.md).
	OnReport func(allocationID string, body []byte)
}

// NewRegistry returns an empty registry that keeps its tokens in memory only.
func NewRegistry() *Registry {
	return &Registry{tokens: map[string]string{}, reports: map[string]Report{}}
}

// TokensFile is the tokens' file inside the registry's directory.
const TokensFile = "tokens.json"

// OpenRegistry returns a registry whose tokens are kept in dir/tokens.json (0600, dir
// 0700), loading the tokens a previous hostd issued. A tokens file that group or others
// may read is refused: it holds secrets.
func OpenRegistry(dir string) (*Registry, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("telemetry tokens: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("telemetry tokens: %w", err)
	}
	r := NewRegistry()
	r.file = filepath.Join(dir, TokensFile)
	fi, err := os.Stat(r.file)
	if errors.Is(err, os.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry tokens: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("telemetry tokens: %s is mode %v; it holds secrets and must be 0600", r.file, fi.Mode().Perm())
	}
	b, err := os.ReadFile(r.file)
	if err != nil {
		return nil, fmt.Errorf("telemetry tokens: %w", err)
	}
	if err := json.Unmarshal(b, &r.tokens); err != nil || r.tokens == nil {
		return nil, fmt.Errorf("telemetry tokens: %s is corrupt (refusing to guess): %v", r.file, err)
	}
	return r, nil
}

// save writes the tokens (with r.mu held): temporary file, fsync, rename.
func (r *Registry) save() error {
	if r.file == "" {
		return nil
	}
	b, err := json.Marshal(r.tokens)
	if err != nil {
		return err
	}
	tmp := r.file + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("telemetry tokens: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("telemetry tokens: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("telemetry tokens: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("telemetry tokens: %w", err)
	}
	if err := os.Rename(tmp, r.file); err != nil {
		return fmt.Errorf("telemetry tokens: %w", err)
	}
	return nil
}

// Register issues (or returns the existing) token of an allocation: provisioning is
// idempotent. A new token is kept on disk before it is returned.
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
	if err := r.save(); err != nil {
		delete(r.tokens, allocationID)
		return "", err
	}
	return t, nil
}

// Has reports whether the allocation has a token (a guest may already carry it).
func (r *Registry) Has(allocationID string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	_, ok := r.tokens[allocationID]
	return ok
}

// Unregister revokes an allocation's token and forgets its reports (release). The token
// stops working at once; the error says if the revocation could not be kept on disk.
func (r *Registry) Unregister(allocationID string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.tokens[allocationID]; !ok {
		delete(r.reports, allocationID)
		return nil
	}
	delete(r.tokens, allocationID)
	delete(r.reports, allocationID)
	return r.save()
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
		_, still := r.tokens[alloc]
		if still {
			r.reports[alloc] = Report{AllocationID: alloc, ReceivedAt: time.Now().UTC(), Body: body}
		}
		r.mu.Unlock()
		if still && r.OnReport != nil {
			r.OnReport(alloc, body)
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}
