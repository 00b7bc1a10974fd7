package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// CreateTenant inserts a tenant.
func (t *Tx) CreateTenant(ctx context.Context, name string) (apiv1.Tenant, error) {
	var out apiv1.Tenant
	err := t.tx.QueryRow(ctx, `INSERT INTO tenants (name) VALUES ($1) RETURNING id::text, name, created_at`, name).
		Scan(&out.ID, &out.Name, &out.CreatedAt)
	return out, translate(err)
}

// ListTenants returns all tenants by name.
func (s *Store) ListTenants(ctx context.Context) ([]apiv1.Tenant, error) {
	return queryAll(ctx, s.pool, func(r pgx.Row, tn *apiv1.Tenant) error {
		return r.Scan(&tn.ID, &tn.Name, &tn.CreatedAt)
	}, `SELECT id::text, name, created_at FROM tenants ORDER BY name`)
}

// TokenRecord is a stored API token (hash only).
type TokenRecord struct {
	ID        string
	Name      string
	Role      string
	TenantID  string
	ExpiresAt *time.Time
	RevokedAt *time.Time
}

// CreateToken stores the hash of a new token.
func (t *Tx) CreateToken(ctx context.Context, name, hash, role, tenantID string, expiresAt *time.Time) (string, error) {
	var id string
	err := t.tx.QueryRow(ctx, `INSERT INTO api_tokens (name, token_hash, role, tenant_id, expires_at)
		VALUES ($1, $2, $3, $4, $5) RETURNING id::text`, name, hash, role, nullIfEmpty(tenantID), expiresAt).Scan(&id)
	return id, translate(err)
}

// LookupToken finds a token by hash. Expiry and revocation are the caller's to judge.
func (s *Store) LookupToken(ctx context.Context, hash string) (TokenRecord, error) {
	var r TokenRecord
	var tenant *string
	err := s.pool.QueryRow(ctx, `SELECT id::text, name, role, tenant_id::text, expires_at, revoked_at
		FROM api_tokens WHERE token_hash = $1`, hash).Scan(&r.ID, &r.Name, &r.Role, &tenant, &r.ExpiresAt, &r.RevokedAt)
	if tenant != nil {
		r.TenantID = *tenant
	}
	return r, translate(err)
}

// TouchToken records use, at most once a minute per token to keep the hot path cheap.
func (s *Store) TouchToken(ctx context.Context, id string) error {
	_, err := s.pool.Exec(ctx, `UPDATE api_tokens SET last_used_at = now()
		WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute')`, id)
	return translate(err)
}

// HasAdminToken reports whether any unrevoked admin token exists (first-start bootstrap).
func (s *Store) HasAdminToken(ctx context.Context) (bool, error) {
	var ok bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM api_tokens WHERE role = 'admin' AND revoked_at IS NULL)`).Scan(&ok)
	return ok, translate(err)
}

// TokenHashExists reports whether a token with this hash is stored.
func (s *Store) TokenHashExists(ctx context.Context, hash string) (bool, error) {
	var ok bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM api_tokens WHERE token_hash = $1)`, hash).Scan(&ok)
	return ok, translate(err)
}
