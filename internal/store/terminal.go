package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// NewTerminalSession is a session being opened.
type NewTerminalSession struct {
	AllocationID, TenantID, NodeID string
	Actor, ActorRole, TokenID      string
	Mode, Command                  string
	ClientTokenHash, HostTokenHash string
	ExpiresAt                      time.Time
	OwnerURL                       string // the replica splicing it (--advertise-url)
}

// TerminalSessionRecord is a session row (Recording is the controller-side file).
type TerminalSessionRecord struct {
	apiv1.TerminalSession
	NodeID    string
	TokenID   string
	Recording string
	OwnerURL  string // the replica that splices the session ("" = a pre-relay controller)
}

const sessionColumns = `id::text, allocation_id::text, tenant_id::text, node_id::text, actor, actor_role, token_id, mode, command,
	status, created_at, started_at, ended_at, bytes_in, bytes_out, exit_status, end_reason, recording, owner_url`

func scanSession(r pgx.Row, s *TerminalSessionRecord) error {
	err := r.Scan(&s.ID, &s.AllocationID, &s.TenantID, &s.NodeID, &s.Actor, &s.ActorRole, &s.TokenID, &s.Mode, &s.Command,
		&s.Status, &s.CreatedAt, &s.StartedAt, &s.EndedAt, &s.BytesIn, &s.BytesOut, &s.ExitStatus, &s.EndReason, &s.Recording, &s.OwnerURL)
	s.Recorded = s.Recording != ""
	return err
}

// CountLiveSessions counts a tenant's sessions that are pending or open.
func (t *Tx) CountLiveSessions(ctx context.Context, tenantID string) (int, error) {
	var n int
	err := t.tx.QueryRow(ctx, `SELECT count(*) FROM terminal_sessions WHERE tenant_id = $1 AND status <> 'ended'
		AND (status = 'open' OR expires_at > now())`, tenantID).Scan(&n)
	return n, translate(err)
}

// InsertTerminalSession records a new pending session.
func (t *Tx) InsertTerminalSession(ctx context.Context, s NewTerminalSession) (string, error) {
	var id string
	err := t.tx.QueryRow(ctx, `INSERT INTO terminal_sessions (allocation_id, tenant_id, node_id, actor, actor_role, token_id, mode, command,
			client_token_hash, host_token_hash, expires_at, owner_url) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12) RETURNING id::text`,
		s.AllocationID, s.TenantID, s.NodeID, s.Actor, s.ActorRole, s.TokenID, s.Mode, s.Command, s.ClientTokenHash, s.HostTokenHash, s.ExpiresAt,
		s.OwnerURL).Scan(&id)
	return id, translate(err)
}

// SetSessionTask records the terminal.open task of a session.
func (t *Tx) SetSessionTask(ctx context.Context, id, taskID string) error {
	_, err := t.tx.Exec(ctx, `UPDATE terminal_sessions SET task_id = $2 WHERE id = $1`, id, taskID)
	return translate(err)
}

// UseClientToken spends a session's client token: it must match, be unexpired and unused,
// and belong to the same API token that opened the session. ErrNotFound otherwise.
func (s *Store) UseClientToken(ctx context.Context, id, hash, tokenID string) (TerminalSessionRecord, error) {
	var rec TerminalSessionRecord
	err := scanSession(s.pool.QueryRow(ctx, `UPDATE terminal_sessions SET client_used_at = now()
		WHERE id = $1::uuid AND client_token_hash = $2 AND token_id = $3 AND client_used_at IS NULL AND expires_at > now() AND status <> 'ended'
		RETURNING `+sessionColumns, uuidArg(id), hash, tokenID), &rec)
	return rec, translate(err)
}

// UseHostToken spends a session's host token, presented by the node it was sent to.
func (s *Store) UseHostToken(ctx context.Context, id, hash, nodeID string) (TerminalSessionRecord, error) {
	var rec TerminalSessionRecord
	err := scanSession(s.pool.QueryRow(ctx, `UPDATE terminal_sessions SET host_used_at = now()
		WHERE id = $1::uuid AND host_token_hash = $2 AND node_id = $3::uuid AND host_used_at IS NULL AND expires_at > now() AND status <> 'ended'
		RETURNING `+sessionColumns, uuidArg(id), hash, uuidArg(nodeID)), &rec)
	return rec, translate(err)
}

// MarkSessionOpen records that both ends attached.
func (s *Store) MarkSessionOpen(ctx context.Context, id string, at time.Time) error {
	_, err := s.pool.Exec(ctx, `UPDATE terminal_sessions SET status = 'open', started_at = $2 WHERE id = $1::uuid AND status = 'pending'`, uuidArg(id), at)
	return translate(err)
}

// EndSession records how a session ended.
func (t *Tx) EndSession(ctx context.Context, id string, started, ended time.Time, in, out int64, exit *int, reason, recording string) error {
	_, err := t.tx.Exec(ctx, `UPDATE terminal_sessions SET status = 'ended', started_at = coalesce(started_at, $2), ended_at = $3,
		bytes_in = $4, bytes_out = $5, exit_status = $6, end_reason = $7, recording = $8 WHERE id = $1::uuid`,
		uuidArg(id), started, ended, in, out, exit, reason, recording)
	return translate(err)
}

// EndLiveSession ends a session that is not ended yet (its owning replica is gone), saying
// why; it reports whether it did. A session already ended keeps its record.
func (t *Tx) EndLiveSession(ctx context.Context, id, reason string) (bool, error) {
	tag, err := t.tx.Exec(ctx, `UPDATE terminal_sessions SET status = 'ended', ended_at = now(), end_reason = $2
		WHERE id = $1::uuid AND status <> 'ended'`, uuidArg(id), reason)
	return tag.RowsAffected() == 1, translate(err)
}

// EndOwnedSessions ends every live session owned by ownerURL: a replica starting again at
// the same address holds none of them in memory any more.
func (t *Tx) EndOwnedSessions(ctx context.Context, ownerURL, reason string) ([]TerminalSessionRecord, error) {
	return queryAll(ctx, t.tx, scanSession, `UPDATE terminal_sessions SET status = 'ended', ended_at = now(), end_reason = $2
		 WHERE owner_url = $1 AND owner_url <> '' AND status <> 'ended' RETURNING `+sessionColumns, ownerURL, reason)
}

// ExpireSessions ends pending sessions nobody attached to in time.
func (s *Store) ExpireSessions(ctx context.Context) ([]string, error) {
	return queryAll(ctx, s.pool, func(r pgx.Row, id *string) error { return r.Scan(id) },
		`UPDATE terminal_sessions SET status = 'ended', ended_at = now(), end_reason = 'not attached in time'
		 WHERE status = 'pending' AND expires_at < now() - interval '5 seconds' RETURNING id::text`)
}

// ListSessions returns sessions newest first (tenantID "" = all, for admins).
func (s *Store) ListSessions(ctx context.Context, tenantID, allocationID string, limit int) ([]TerminalSessionRecord, error) {
	if limit <= 0 || limit > 1000 {
		limit = 100
	}
	return queryAll(ctx, s.pool, scanSession, `SELECT `+sessionColumns+` FROM terminal_sessions
		WHERE ($1::uuid IS NULL OR tenant_id = $1::uuid) AND ($2::uuid IS NULL OR allocation_id = $2::uuid) ORDER BY created_at DESC LIMIT $3`,
		optUUID(tenantID), optUUID(allocationID), limit)
}

// GetSession returns one session (tenantID "" = any tenant).
func (s *Store) GetSession(ctx context.Context, id, tenantID string) (TerminalSessionRecord, error) {
	var rec TerminalSessionRecord
	err := scanSession(s.pool.QueryRow(ctx, `SELECT `+sessionColumns+` FROM terminal_sessions WHERE id = $1::uuid
		AND ($2::uuid IS NULL OR tenant_id = $2::uuid)`, uuidArg(id), optUUID(tenantID)), &rec)
	return rec, translate(err)
}
