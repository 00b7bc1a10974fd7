package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// ErrWebhookLimit is CreateWebhook refusing a tenant's webhook past MaxWebhooksPerTenant.
var ErrWebhookLimit = fmt.Errorf("%w: a tenant has at most %d webhooks; delete one first", ErrConflict, MaxWebhooksPerTenant)

// MaxWebhooksPerTenant bounds a tenant's live webhooks (each event is one delivery per
// webhook).
const MaxWebhooksPerTenant = 10

// CreateWebhook registers a tenant's endpoint. Its fan-out starts at the log's readable head:
// it receives the events from now on, not the tenant's history. The tenant's row is locked
// while its webhooks are counted, so concurrent creates cannot pass the limit together (NO KEY
// UPDATE: allocation inserts, which take KEY SHARE through their foreign key, never wait).
func (t *Tx) CreateWebhook(ctx context.Context, tenantID, url, secret string) (apiv1.Webhook, error) {
	w := apiv1.Webhook{TenantID: tenantID, URL: url}
	var live int
	if err := t.tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM webhooks WHERE tenant_id = t.id AND deleted_at IS NULL)
		FROM tenants t WHERE t.id = $1::uuid FOR NO KEY UPDATE`, uuidArg(tenantID)).Scan(&live); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return w, fmt.Errorf("%w: no tenant %s", ErrInvalid, tenantID)
		}
		return w, translate(err)
	}
	if live >= MaxWebhooksPerTenant {
		return w, ErrWebhookLimit
	}
	err := t.tx.QueryRow(ctx, `INSERT INTO webhooks (tenant_id, url, secret, cursor_xid, cursor_id)
		SELECT $1::uuid, $2, $3, coalesce(h.xid, '0'), coalesce(h.id, 0)
		FROM (SELECT NULL) one LEFT JOIN LATERAL (
			SELECT xid, id FROM events WHERE xid < pg_snapshot_xmin(pg_current_snapshot())
			ORDER BY xid DESC, id DESC LIMIT 1) h ON true
		RETURNING id::text, created_at`, uuidArg(tenantID), url, secret).Scan(&w.ID, &w.CreatedAt)
	return w, translate(err)
}

const webhookColumns = `w.id::text, w.tenant_id::text, w.url, w.created_at,
	(SELECT count(*) FILTER (WHERE status = 'pending') FROM webhook_deliveries d WHERE d.webhook_id = w.id),
	(SELECT count(*) FILTER (WHERE status = 'delivered') FROM webhook_deliveries d WHERE d.webhook_id = w.id),
	(SELECT count(*) FILTER (WHERE status = 'dead') FROM webhook_deliveries d WHERE d.webhook_id = w.id)`

func scanWebhook(r pgx.Row, w *apiv1.Webhook) error {
	return r.Scan(&w.ID, &w.TenantID, &w.URL, &w.CreatedAt, &w.Pending, &w.Delivered, &w.Dead)
}

// ListWebhooks lists live webhooks with their delivery counts (tenantID "": every tenant's).
func (s *Store) ListWebhooks(ctx context.Context, tenantID string) ([]apiv1.Webhook, error) {
	return queryAll(ctx, s.pool, scanWebhook, `SELECT `+webhookColumns+` FROM webhooks w
		WHERE w.deleted_at IS NULL AND ($1::uuid IS NULL OR w.tenant_id = $1::uuid) ORDER BY w.created_at, w.id`, optUUID(tenantID))
}

// GetWebhook returns a live webhook of the tenant (tenantID "": any), or ErrNotFound.
func (s *Store) GetWebhook(ctx context.Context, id, tenantID string) (apiv1.Webhook, error) {
	var w apiv1.Webhook
	err := scanWebhook(s.pool.QueryRow(ctx, `SELECT `+webhookColumns+` FROM webhooks w
		WHERE w.id = $1::uuid AND w.deleted_at IS NULL AND ($2::uuid IS NULL OR w.tenant_id = $2::uuid)`, uuidArg(id), optUUID(tenantID)), &w)
	return w, translate(err)
}

// DeleteWebhook removes a webhook of the tenant (tenantID "": any); its pending deliveries
// end as dead ("webhook deleted"). Deleting a deleted webhook changes nothing and answers the
// same (a retried DELETE succeeds).
func (t *Tx) DeleteWebhook(ctx context.Context, id, tenantID string) (apiv1.Webhook, error) {
	var w apiv1.Webhook
	err := t.tx.QueryRow(ctx, `WITH del AS (
			UPDATE webhooks SET deleted_at = now()
			WHERE id = $1::uuid AND deleted_at IS NULL AND ($2::uuid IS NULL OR tenant_id = $2::uuid)
			RETURNING id, tenant_id, url, created_at)
		SELECT id::text, tenant_id::text, url, created_at FROM del
		UNION ALL
		SELECT id::text, tenant_id::text, url, created_at FROM webhooks
		WHERE id = $1::uuid AND deleted_at IS NOT NULL AND ($2::uuid IS NULL OR tenant_id = $2::uuid)`,
		uuidArg(id), optUUID(tenantID)).Scan(&w.ID, &w.TenantID, &w.URL, &w.CreatedAt)
	if err != nil {
		return w, translate(err)
	}
	_, err = t.tx.Exec(ctx, `UPDATE webhook_deliveries SET status = 'dead', finished_at = now(), last_error = 'webhook deleted'
		WHERE webhook_id = $1::uuid AND status = 'pending'`, w.ID)
	return w, translate(err)
}

// WebhookDeliveries lists a webhook's deliveries, newest first (status "": all), each with
// its attempts.
func (s *Store) WebhookDeliveries(ctx context.Context, webhookID, status string, limit int) ([]apiv1.WebhookDelivery, error) {
	if limit <= 0 || limit > 500 {
		limit = 100
	}
	out, err := queryAll(ctx, s.pool, func(r pgx.Row, d *apiv1.WebhookDelivery) error {
		var xid string
		var id int64
		var next time.Time
		if err := r.Scan(&d.ID, &xid, &id, &d.EventType, &d.Status, &d.Attempts, &next, &d.LastError, &d.CreatedAt, &d.FinishedAt); err != nil {
			return err
		}
		if d.Status == "pending" {
			d.NextAttemptAt = &next
		}
		x, _ := strconv.ParseUint(xid, 10, 64)
		d.EventCursor = EventCursor{XID: x, ID: id}.String()
		return nil
	}, `SELECT d.id::text, e.xid::text, e.id, e.type, d.status, d.attempts, d.next_attempt_at, d.last_error, d.created_at, d.finished_at
		FROM webhook_deliveries d JOIN events e ON e.id = d.event_id
		WHERE d.webhook_id = $1::uuid AND ($2 = '' OR d.status = $2)
		ORDER BY d.created_at DESC, e.xid DESC, e.id DESC LIMIT $3`, uuidArg(webhookID), status, limit)
	if err != nil || len(out) == 0 {
		return out, err
	}
	ids := make([]string, len(out))
	at := map[string]int{}
	for i, d := range out {
		ids[i] = d.ID
		at[d.ID] = i
	}
	type row struct {
		delivery string
		a        apiv1.WebhookDeliveryAttempt
	}
	rows, err := queryAll(ctx, s.pool, func(r pgx.Row, x *row) error {
		var code *int
		if err := r.Scan(&x.delivery, &x.a.Attempt, &x.a.At, &code, &x.a.Error, &x.a.DurationMS); err != nil {
			return err
		}
		if code != nil {
			x.a.StatusCode = *code
		}
		return nil
	}, `SELECT delivery_id::text, attempt, at, status_code, error, duration_ms FROM webhook_attempts
		WHERE delivery_id = ANY($1::uuid[]) ORDER BY webhook_attempts.delivery_id, attempt`, uuidsArg(ids))
	if err != nil {
		return nil, err
	}
	for _, x := range rows {
		d := &out[at[x.delivery]]
		d.History = append(d.History, x.a)
	}
	return out, nil
}

// FanOutWebhooks turns readable events into deliveries, in one statement: it locks the live
// webhooks that have new events (FOR UPDATE SKIP LOCKED: replicas share the work, and an
// idle fleet locks and writes nothing), inserts at most batch deliveries per webhook in log
// order, and advances each webhook's cursor in the same transaction. It returns how many
// deliveries it made.
func (s *Store) FanOutWebhooks(ctx context.Context, batch int) (int, error) {
	var made int
	err := s.pool.QueryRow(ctx, `WITH w AS (
			SELECT w.id, w.tenant_id, w.cursor_xid, w.cursor_id FROM webhooks w
			WHERE w.deleted_at IS NULL AND EXISTS (
				SELECT 1 FROM events e WHERE e.tenant_id = w.tenant_id AND (e.xid, e.id) > (w.cursor_xid, w.cursor_id)
				  AND e.xid < pg_snapshot_xmin(pg_current_snapshot()))
			FOR UPDATE OF w SKIP LOCKED),
		ev AS (
			SELECT w.id AS webhook_id, e.xid, e.id FROM w CROSS JOIN LATERAL (
				SELECT e.xid, e.id FROM events e
				WHERE e.tenant_id = w.tenant_id AND (e.xid, e.id) > (w.cursor_xid, w.cursor_id)
				  AND e.xid < pg_snapshot_xmin(pg_current_snapshot())
				ORDER BY e.xid, e.id LIMIT $1) e),
		ins AS (
			INSERT INTO webhook_deliveries (webhook_id, event_id) SELECT webhook_id, id FROM ev
			ON CONFLICT (webhook_id, event_id) DO NOTHING RETURNING 1),
		last AS (SELECT DISTINCT ON (webhook_id) webhook_id, xid, id FROM ev ORDER BY webhook_id, xid DESC, id DESC),
		moved AS (
			UPDATE webhooks SET cursor_xid = last.xid, cursor_id = last.id FROM last WHERE webhooks.id = last.webhook_id RETURNING 1)
		SELECT count(*) FROM ins`, batch).Scan(&made)
	return made, translate(err)
}

// DueDelivery is a delivery claimed for one attempt.
type DueDelivery struct {
	ID        string
	Attempt   int
	WebhookID string
	URL       string
	Secret    string
	Event     Event
}

// ClaimWebhookDeliveries claims up to n pending deliveries that are due (SKIP LOCKED, so
// replicas never claim the same one), counting the attempt and pushing its next try lease
// ahead: a replica that dies mid-attempt leaves it to be retried when the lease ends.
func (s *Store) ClaimWebhookDeliveries(ctx context.Context, n int, lease time.Duration) ([]DueDelivery, error) {
	return queryAll(ctx, s.pool, func(r pgx.Row, d *DueDelivery) error {
		var xid string
		if err := r.Scan(&d.ID, &d.Attempt, &d.WebhookID, &d.URL, &d.Secret, &xid, &d.Event.Cursor.ID, &d.Event.Type,
			&d.Event.AllocationID, rawJSON(&d.Event.Data), &d.Event.CreatedAt); err != nil {
			return err
		}
		var err error
		d.Event.Cursor.XID, err = strconv.ParseUint(xid, 10, 64)
		return err
	}, `WITH due AS (
			SELECT id FROM webhook_deliveries WHERE status = 'pending' AND next_attempt_at <= now()
			ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED),
		claimed AS (
			UPDATE webhook_deliveries d SET attempts = d.attempts + 1, next_attempt_at = now() + make_interval(secs => $2::float8)
			FROM due WHERE d.id = due.id RETURNING d.id, d.attempts, d.webhook_id, d.event_id)
		SELECT c.id::text, c.attempts, w.id::text, w.url, w.secret, e.xid::text, e.id, e.type,
			coalesce(e.allocation_id::text, ''), e.data, e.created_at
		FROM claimed c JOIN webhooks w ON w.id = c.webhook_id JOIN events e ON e.id = c.event_id
		ORDER BY e.xid, e.id`, n, lease.Seconds())
}

// WebhookAttempt is the outcome of one attempt.
type WebhookAttempt struct {
	DeliveryID string
	Attempt    int
	StatusCode int // 0: no answer
	Error      string
	Duration   time.Duration
	Delivered  bool
	// RetryIn is the wait before the next attempt; MaxAge the delivery's whole retry time:
	// a failed delivery whose next attempt would fall past created_at + MaxAge is dead.
	RetryIn, MaxAge time.Duration
}

// RecordWebhookAttempt records an attempt and moves its delivery: delivered, dead, or pending
// until its next attempt. An attempt whose claim another replica took over meanwhile (the
// delivery's attempt count moved on) only adds its row.
func (s *Store) RecordWebhookAttempt(ctx context.Context, a WebhookAttempt) (status string, err error) {
	err = s.InTx(ctx, func(tx *Tx) error {
		var code any
		if a.StatusCode != 0 {
			code = a.StatusCode
		}
		if _, err := tx.tx.Exec(ctx, `INSERT INTO webhook_attempts (delivery_id, attempt, status_code, error, duration_ms)
			VALUES ($1::uuid, $2, $3, $4, $5) ON CONFLICT DO NOTHING`, a.DeliveryID, a.Attempt, code, a.Error, a.Duration.Milliseconds()); err != nil {
			return translate(err)
		}
		err := tx.tx.QueryRow(ctx, `UPDATE webhook_deliveries SET
				status = CASE WHEN $3 THEN 'delivered'
				              WHEN now() + make_interval(secs => $4::float8) > created_at + make_interval(secs => $5::float8) THEN 'dead'
				              ELSE 'pending' END,
				next_attempt_at = CASE WHEN $3 THEN next_attempt_at ELSE now() + make_interval(secs => $4::float8) END,
				last_error = CASE WHEN $3 THEN '' ELSE $6 END,
				finished_at = CASE WHEN $3 OR now() + make_interval(secs => $4::float8) > created_at + make_interval(secs => $5::float8)
				                   THEN now() END
			WHERE id = $1::uuid AND attempts = $2 AND status = 'pending'
			RETURNING status`, a.DeliveryID, a.Attempt, a.Delivered, a.RetryIn.Seconds(), a.MaxAge.Seconds(), a.Error).Scan(&status)
		if err == pgx.ErrNoRows {
			status = ""
			return nil
		}
		return translate(err)
	})
	return status, err
}
