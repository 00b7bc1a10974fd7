package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// ListTokens returns every API token without its secret (only the hash is stored anyway),
// newest first.
func (s *Store) ListTokens(ctx context.Context) ([]apiv1.Token, error) {
	return queryAll(ctx, s.pool, func(r pgx.Row, t *apiv1.Token) error {
		var tenant *string
		var created time.Time
		if err := r.Scan(&t.ID, &t.Name, &t.Role, &tenant, &created, &t.ExpiresAt, &t.LastUsedAt, &t.RevokedAt); err != nil {
			return err
		}
		t.CreatedAt = &created
		if tenant != nil {
			t.TenantID = *tenant
		}
		return nil
	}, `SELECT id::text, name, role, tenant_id::text, created_at, expires_at, last_used_at, revoked_at
		FROM api_tokens ORDER BY created_at DESC, api_tokens.id`)
}

// RevokeToken marks an API token revoked. Unknown ids are ErrNotFound; an already revoked
// token is ErrConflict (nothing changes).
func (t *Tx) RevokeToken(ctx context.Context, id string) (apiv1.Token, error) {
	var out apiv1.Token
	var tenant *string
	err := t.tx.QueryRow(ctx, `SELECT id::text, name, role, tenant_id::text, expires_at, revoked_at
		FROM api_tokens WHERE id = $1 FOR UPDATE`, id).Scan(&out.ID, &out.Name, &out.Role, &tenant, &out.ExpiresAt, &out.RevokedAt)
	if err != nil {
		return out, translate(err)
	}
	if tenant != nil {
		out.TenantID = *tenant
	}
	if out.RevokedAt != nil {
		return out, &DBError{Kind: ErrConflict, Detail: fmt.Sprintf("token %s was already revoked at %s", id, out.RevokedAt.UTC().Format(time.RFC3339))}
	}
	err = t.tx.QueryRow(ctx, `UPDATE api_tokens SET revoked_at = now() WHERE id = $1 RETURNING revoked_at`, id).Scan(&out.RevokedAt)
	return out, translate(err)
}

// RevokeNodeCredentials revokes every live certificate and every unused bootstrap token of a
// node: the host can no longer call the agent API and must be enrolled again with a new
// bootstrap token.
func (t *Tx) RevokeNodeCredentials(ctx context.Context, nodeID string) (apiv1.NodeRevocation, error) {
	out := apiv1.NodeRevocation{NodeID: nodeID}
	tag, err := t.tx.Exec(ctx, `UPDATE node_credentials SET revoked_at = now()
		WHERE node_id = $1 AND (revoked_at IS NULL OR revoked_at > now()) AND not_after > now()`, nodeID)
	if err != nil {
		return out, translate(err)
	}
	out.RevokedCertificates = int(tag.RowsAffected())
	// A spent token is marked expired now so it cannot be told apart from a revoked one.
	tag, err = t.tx.Exec(ctx, `UPDATE node_bootstrap_tokens SET expires_at = now()
		WHERE node_id = $1 AND used_at IS NULL AND expires_at > now()`, nodeID)
	if err != nil {
		return out, translate(err)
	}
	out.RevokedBootstrapTokens = int(tag.RowsAffected())
	return out, nil
}

// SupersedeCredential schedules the end of a node certificate that a renewal replaced: it is
// refused from at on (a short grace lets requests already in flight on the old certificate,
// and a retry of a renewal whose answer was lost, finish). It never extends an earlier end.
func (t *Tx) SupersedeCredential(ctx context.Context, serial, nodeID string, at time.Time) error {
	_, err := t.tx.Exec(ctx, `UPDATE node_credentials SET revoked_at = $3
		WHERE serial = $1 AND node_id = $2 AND (revoked_at IS NULL OR revoked_at > $3)`, serial, nodeID, at)
	return translate(err)
}

// CredentialRevokedAt returns when a certificate serial stops (or stopped) being accepted;
// nil when it has not been revoked or superseded.
func (s *Store) CredentialRevokedAt(ctx context.Context, serial string) (*time.Time, error) {
	var at *time.Time
	err := s.pool.QueryRow(ctx, `SELECT revoked_at FROM node_credentials WHERE serial = $1`, serial).Scan(&at)
	return at, translate(err)
}
