package task

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// Envelope carries one signed task.
type Envelope struct {
	TaskID   string          `json:"task_id"`
	NodeID   string          `json:"node_id"`
	Type     Type            `json:"type"`
	Payload  json.RawMessage `json:"payload"`
	IssuedAt time.Time       `json:"issued_at"`
	NotAfter time.Time       `json:"not_after"`
	Attempt  int             `json:"attempt"`
	// SchemaVersion is the payload's schema version for its type (schema.go); 0 and 1 both
	// mean version 1, which is left out of the JSON and of the signed bytes.
	SchemaVersion int    `json:"schema_version,omitempty"`
	Signature     []byte `json:"signature"`
}

// signed is the exact field set covered by the signature, in a fixed order.
type signed struct {
	TaskID   string          `json:"task_id"`
	NodeID   string          `json:"node_id"`
	Type     Type            `json:"type"`
	Payload  json.RawMessage `json:"payload"`
	IssuedAt string          `json:"issued_at"`
	NotAfter string          `json:"not_after"`
	Attempt  int             `json:"attempt"`
	// SchemaVersion is signed when above 1: version 1 tasks sign the same bytes as before
	// versioning, which hosts that predate it verify.
	SchemaVersion int `json:"schema_version,omitempty"`
}

// CanonicalBytes is what gets signed: the envelope fields (not the signature) as JSON with a
// fixed field order, timestamps in UTC RFC 3339 with nanoseconds, and the payload in
// canonical form (object keys sorted, no insignificant space, numbers kept verbatim), so both
// sides produce the same bytes for the same task however the payload was re-encoded.
func (e *Envelope) CanonicalBytes() ([]byte, error) {
	// JSON replaces invalid UTF-8, so such a field would not survive the trip to the host
	// byte for byte: it is never signed (the fuzzer found a task id that was).
	for _, f := range []string{e.TaskID, e.NodeID, string(e.Type)} {
		if !utf8.ValidString(f) {
			return nil, fmt.Errorf("task id, node id and type must be valid UTF-8")
		}
	}
	payload, err := canonicalJSON(e.Payload)
	if err != nil {
		return nil, fmt.Errorf("task payload is not JSON: %w", err)
	}
	return json.Marshal(signed{TaskID: e.TaskID, NodeID: e.NodeID, Type: e.Type, Payload: payload,
		IssuedAt: e.IssuedAt.UTC().Format(time.RFC3339Nano), NotAfter: e.NotAfter.UTC().Format(time.RFC3339Nano), Attempt: e.Attempt,
		SchemaVersion: signedSchema(e.SchemaVersion)})
}

func signedSchema(v int) int {
	if v <= 1 {
		return 0
	}
	return v
}

// Sign sets the envelope's signature.
func (e *Envelope) Sign(key ed25519.PrivateKey) error {
	b, err := e.CanonicalBytes()
	if err != nil {
		return err
	}
	e.Signature = ed25519.Sign(key, b)
	return nil
}

// New builds and signs an envelope for payload, valid for ttl from now.
func New(key ed25519.PrivateKey, taskID, nodeID string, t Type, payload any, now time.Time, ttl time.Duration, attempt int) (*Envelope, error) {
	if !Known(t) {
		return nil, fmt.Errorf("unknown task type %q", t)
	}
	raw, err := json.Marshal(payload)
	if err != nil {
		return nil, err
	}
	e := &Envelope{TaskID: taskID, NodeID: nodeID, Type: t, Payload: raw, IssuedAt: now.UTC(), NotAfter: now.Add(ttl).UTC(), Attempt: attempt}
	return e, e.Sign(key)
}

// Refusal reasons, reported back to the controller and logged by hostd.
const (
	RefuseUnsigned     = "unsigned"
	RefuseBadSignature = "bad_signature"
	RefuseWrongNode    = "wrong_node"
	RefuseExpired      = "expired"
	RefuseNotYetValid  = "not_yet_valid"
	RefuseUnknownType  = "unknown_type"
	RefuseBadPayload   = "bad_payload"
	RefuseReplay       = "replay"
	RefuseReplayWindow = "replay_window"
	RefuseMalformed    = "malformed"
	// RefuseUnsupportedSchema is a known type at a schema version this build does not decode
	// (the controller should not have sent it: hosts report what they decode).
	RefuseUnsupportedSchema = "unsupported_schema"
)

// RefusedError says why a task was not run.
type RefusedError struct {
	Reason string
	Detail string
}

func (e *RefusedError) Error() string { return "task refused: " + e.Reason + ": " + e.Detail }

func refuse(reason, format string, args ...any) error {
	return &RefusedError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// ReplayGuard remembers completed task ids. Completed may fail with
// ErrOutsideReplayWindow for a task expiring within what the guard no longer remembers.
type ReplayGuard interface {
	Completed(taskID string, notAfter time.Time) (bool, error)
}

// Verifier checks envelopes on the host.
type Verifier struct {
	Key    ed25519.PublicKey // the controller's pinned task-signing key
	NodeID string            // this host's node id
	Now    func() time.Time
	// Skew tolerates clock differences between controller and host.
	Skew   time.Duration
	Replay ReplayGuard
}

// Verify checks, in order: shape, signature, node binding, validity window (with skew),
// known type with a strictly decoded payload, and replay of a completed task id. It returns
// the decoded payload when the task may run.
func (v *Verifier) Verify(e *Envelope) (any, error) {
	if e == nil || e.TaskID == "" || e.NodeID == "" || e.Type == "" || e.Attempt < 1 {
		return nil, refuse(RefuseMalformed, "task_id, node_id, type and attempt >= 1 are required")
	}
	if len(e.Signature) == 0 {
		return nil, refuse(RefuseUnsigned, "task %s carries no signature", e.TaskID)
	}
	b, err := e.CanonicalBytes()
	if err != nil {
		return nil, refuse(RefuseMalformed, "%v", err)
	}
	if len(v.Key) != ed25519.PublicKeySize || !ed25519.Verify(v.Key, b, e.Signature) {
		return nil, refuse(RefuseBadSignature, "task %s signature does not verify with the pinned controller key", e.TaskID)
	}
	if e.NodeID != v.NodeID {
		return nil, refuse(RefuseWrongNode, "task %s is for node %s, this is %s", e.TaskID, e.NodeID, v.NodeID)
	}
	now := time.Now()
	if v.Now != nil {
		now = v.Now()
	}
	if now.After(e.NotAfter.Add(v.Skew)) {
		return nil, refuse(RefuseExpired, "task %s expired at %s (now %s): %s past expiry, beyond the %s clock-skew tolerance", e.TaskID,
			e.NotAfter.UTC().Format(time.RFC3339Nano), now.UTC().Format(time.RFC3339Nano), now.Sub(e.NotAfter), v.Skew)
	}
	if e.IssuedAt.After(now.Add(v.Skew)) {
		return nil, refuse(RefuseNotYetValid, "task %s issued at %s is %s ahead of this host's clock (now %s), beyond the %s clock-skew tolerance", e.TaskID,
			e.IssuedAt.UTC().Format(time.RFC3339Nano), e.IssuedAt.Sub(now), now.UTC().Format(time.RFC3339Nano), v.Skew)
	}
	if !Known(e.Type) {
		return nil, refuse(RefuseUnknownType, "task type %q is not supported by this host", e.Type)
	}
	if e.SchemaVersion < 0 {
		return nil, refuse(RefuseMalformed, "schema_version must not be negative")
	}
	if tv := (TypeVersion{e.Type, max(e.SchemaVersion, 1)}); schemas[tv] == nil {
		return nil, refuse(RefuseUnsupportedSchema, "%s is not supported by this host", tv)
	}
	payload, err := DecodePayloadVersion(e.Type, e.SchemaVersion, e.Payload)
	if err != nil {
		return nil, refuse(RefuseBadPayload, "%v", err)
	}
	if c, ok := payload.(checker); ok {
		if err := c.check(); err != nil {
			return nil, refuse(RefuseBadPayload, "%s payload: %v", e.Type, err)
		}
	}
	if v.Replay != nil {
		done, err := v.Replay.Completed(e.TaskID, e.NotAfter)
		if errors.Is(err, ErrOutsideReplayWindow) {
			return nil, refuse(RefuseReplayWindow, "task %s: %v", e.TaskID, err)
		}
		if err != nil {
			return nil, fmt.Errorf("replay check: %w", err)
		}
		if done {
			return nil, refuse(RefuseReplay, "task %s already completed on this host", e.TaskID)
		}
	}
	return payload, nil
}

func strictUnmarshal(raw json.RawMessage, v any) error {
	if len(raw) == 0 {
		return errors.New("empty payload")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after payload")
	}
	return nil
}

// canonicalJSON re-encodes JSON with sorted object keys and no whitespace; numbers keep their
// original text (json.Number), so large integers are not rounded through float64.
func canonicalJSON(raw json.RawMessage) ([]byte, error) {
	if len(raw) == 0 {
		return []byte("null"), nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("trailing data")
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}
