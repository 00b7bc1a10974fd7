package store

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// ReservationRecord is a capacity reservation as stored, with its node (id and name, which
// callers show to admins only) and how many of its held slots are in use and free.
type ReservationRecord struct {
	apiv1.Reservation
	NodeID   string
	NodeName string
}

// reservationSQL reads reservations r with their node and held-slot counts; callers add the
// WHERE. in_use counts held slots claimed by live allocations; free counts available ones.
const reservationSQL = `SELECT r.id::text, r.tenant_id::text, r.sku, r.region, r.gpus, r.status, r.node_id::text, n.name,
		r.price_snapshot, r.created_at, r.ends_at, r.ended_at,
		(SELECT count(*) FROM node_resource_slots s WHERE s.reservation_id = r.id AND s.status NOT IN ('available', 'disabled')),
		(SELECT count(*) FROM node_resource_slots s WHERE s.reservation_id = r.id AND s.status = 'available')
	FROM capacity_reservations r JOIN nodes n ON n.id = r.node_id `

func scanReservation(row pgx.Row, r *ReservationRecord) error {
	var price []byte
	err := row.Scan(&r.ID, &r.TenantID, &r.SKU, &r.Region, &r.GPUs, &r.Status, &r.NodeID, &r.NodeName,
		&price, &r.CreatedAt, &r.EndsAt, &r.EndedAt, &r.InUse, &r.Free)
	if err == nil && len(price) > 0 {
		var snap struct {
			apiv1.Price
			Policy string `json:"policy"`
		}
		if json.Unmarshal(price, &snap) == nil {
			r.Price, r.PricePolicy = snap.Price, snap.Policy
		}
	}
	return err
}

// NewReservation is a capacity reservation about to be written: its row and the slots it holds
// (locked by the caller, available, of NodeID).
type NewReservation struct {
	TenantID string
	SKU      string
	Region   string // "" = the node's
	NodeID   string
	GPUs     int
	Price    apiv1.Price
	Policy   string
	EndsAt   *time.Time
	SlotIDs  []string
	Audit    AuditRecord
}

// InsertReservation writes the reservation, marks its slots held, queues the node's best-fit
// hints for a recount (held slots leave the fleet's count) and writes the audit record, in one
// round trip of the caller's transaction. The quota trigger may refuse it (ErrQuota).
func (t *Tx) InsertReservation(ctx context.Context, nr NewReservation) (string, error) {
	id := NewID()
	price, err := json.Marshal(struct {
		apiv1.Price
		Policy string `json:"policy"`
	}{nr.Price, nr.Policy})
	if err != nil {
		return "", err
	}
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO capacity_reservations (id, tenant_id, sku, region, node_id, gpus, price_snapshot, ends_at)
		VALUES ($1, $2::uuid, $3, coalesce(nullif($4::text, ''), (SELECT region FROM nodes WHERE id = $5::uuid)), $5::uuid, $6, $7, $8)`,
		id, uuidArg(nr.TenantID), nr.SKU, nr.Region, uuidArg(nr.NodeID), nr.GPUs, price, nr.EndsAt)
	b.Queue(`WITH s AS (UPDATE node_resource_slots SET reservation_id = $1
			WHERE id = ANY($2::uuid[]) AND node_id = $3::uuid AND status = 'available' AND reservation_id IS NULL RETURNING node_id)
		, d AS (INSERT INTO node_capacity_dirty (node_id) SELECT DISTINCT node_id FROM s)
		SELECT count(*) FROM s`, id, uuidsArg(nr.SlotIDs), uuidArg(nr.NodeID))
	rec := nr.Audit
	rec.TargetID = id
	if err := queueAudit(b, rec); err != nil {
		return "", err
	}
	br := t.tx.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return "", translate(err)
	}
	var held int
	if err := br.QueryRow().Scan(&held); err != nil {
		return "", translate(err)
	}
	if held != len(nr.SlotIDs) {
		return "", &DBError{Kind: ErrConflict, Detail: "a slot to hold is no longer available", Err: errors.New("slot taken")}
	}
	if _, err := br.Exec(); err != nil {
		return "", translate(err)
	}
	return id, translate(br.Close())
}

// GetReservation reads one reservation; tenantID != "" restricts it to that tenant's (another
// tenant's is ErrNotFound).
func (s *Store) GetReservation(ctx context.Context, id, tenantID string) (ReservationRecord, error) {
	return getReservation(ctx, s.pool, id, tenantID)
}

// GetReservation inside a transaction.
func (t *Tx) GetReservation(ctx context.Context, id, tenantID string) (ReservationRecord, error) {
	return getReservation(ctx, t.tx, id, tenantID)
}

func getReservation(ctx context.Context, q querier, id, tenantID string) (ReservationRecord, error) {
	var r ReservationRecord
	err := scanReservation(q.QueryRow(ctx, reservationSQL+`WHERE r.id = $1::uuid AND ($2::uuid IS NULL OR r.tenant_id = $2::uuid)`,
		uuidArg(id), optUUID(tenantID)), &r)
	return r, translate(err)
}

// ListReservations returns tenantID's reservations ("" = every tenant's), newest first; with
// activeOnly, only those still holding capacity.
func (s *Store) ListReservations(ctx context.Context, tenantID string, activeOnly bool) ([]ReservationRecord, error) {
	return queryAll(ctx, s.pool, scanReservation, reservationSQL+`WHERE ($1::uuid IS NULL OR r.tenant_id = $1::uuid)
		AND (NOT $2 OR r.status = 'active') ORDER BY r.created_at DESC, r.id LIMIT 1000`, optUUID(tenantID), activeOnly)
}

// endReservationsSQL ends the active reservations that $1 (a uuid array, or NULL for every one
// whose end has come) selects, with status $2: their slots are no longer held (each returns to
// the fleet now if available, or when its allocation's release is wiped), and their nodes' hints
// are queued for a recount. The row lock makes two controllers ending one reservation end it
// once: the second's update finds it no longer active.
const endReservationsSQL = `WITH r AS (UPDATE capacity_reservations SET status = $2, ended_at = now()
		WHERE status = 'active' AND CASE WHEN $1::uuid[] IS NULL THEN ends_at <= now() ELSE id = ANY($1::uuid[]) END
		RETURNING id),
	s AS (UPDATE node_resource_slots SET reservation_id = NULL WHERE reservation_id IN (SELECT id FROM r) RETURNING node_id),
	d AS (INSERT INTO node_capacity_dirty (node_id) SELECT DISTINCT node_id FROM s)
	SELECT id::text FROM r`

// CancelReservation ends an active reservation now. tenantID != "" restricts it to that
// tenant's. ErrNotFound when there is none; ErrConflict when it has already ended.
func (t *Tx) CancelReservation(ctx context.Context, id, tenantID string, audit AuditRecord) (ReservationRecord, error) {
	r, err := getReservation(ctx, t.tx, id, tenantID)
	if err != nil {
		return r, err
	}
	if r.Status != apiv1.ReservationActive {
		return r, &DBError{Kind: ErrConflict, Detail: "the reservation has already ended (" + r.Status + ")", Err: errors.New("ended")}
	}
	ids, err := queryAll(ctx, t.tx, func(row pgx.Row, s *string) error { return row.Scan(s) }, endReservationsSQL,
		uuidsArg([]string{id}), apiv1.ReservationCancelled)
	if err != nil {
		return r, err
	}
	if len(ids) == 0 {
		return r, &DBError{Kind: ErrConflict, Detail: "the reservation has already ended", Err: errors.New("ended")}
	}
	if err := t.Audit(ctx, audit); err != nil {
		return r, err
	}
	return getReservation(ctx, t.tx, id, tenantID)
}

// ExpireReservations ends every active reservation whose end has come and returns their ids.
// Safe to run from every controller replica at once.
func (s *Store) ExpireReservations(ctx context.Context) ([]string, error) {
	return queryAll(ctx, s.pool, func(row pgx.Row, s *string) error { return row.Scan(s) }, endReservationsSQL,
		nil, apiv1.ReservationExpired)
}

// reservationCandidatesSQL is SliceCandidates' filter for the slots reservation $5 holds,
// instead of the fleet's: the same node and slot checks, draining nodes included (the slots are
// the tenant's until the reservation ends).
var reservationCandidatesSQL = `SELECT n.id::text, n.name, s.id::text, s.slot_index, coalesce(s.numa_node, -1) ` +
	strings.Replace(sliceBase, unheld, `s.reservation_id = $5::uuid`, 1) +
	` AND ` + storageOK + ` AND ` + fabricOK + ` ORDER BY n.name, s.slot_index`

// ReservationCandidates returns the candidate slots inside reservation id, ordered as
// SliceCandidates orders them.
func (t *Tx) ReservationCandidates(ctx context.Context, pq PlacementQuery, id string) ([]CandidateSlot, error) {
	return reservationCandidates(ctx, t.tx, pq, id)
}

// ReservationCandidates outside a transaction (explain).
func (s *Store) ReservationCandidates(ctx context.Context, pq PlacementQuery, id string) ([]CandidateSlot, error) {
	return reservationCandidates(ctx, s.pool, pq, id)
}

func reservationCandidates(ctx context.Context, q querier, pq PlacementQuery, id string) ([]CandidateSlot, error) {
	return queryAll(ctx, q, func(r pgx.Row, c *CandidateSlot) error {
		return r.Scan(&c.NodeID, &c.NodeName, &c.SlotID, &c.SlotIndex, &c.NUMANode)
	}, reservationCandidatesSQL, append(pq.args(), uuidArg(id))...)
}
