package store

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// liveClaim is the SQL list of claim states that hold a resource.
const liveClaim = `('reserved', 'provisioning', 'active', 'releasing')`

const nodeColumns = `n.id::text, n.name, n.status, n.draining, n.region, coalesce(n.tenant_id::text, ''),
	coalesce(n.sku, ''), coalesce(n.slice_sku, ''), n.profile_tags, n.hardware_tags, n.firmware_profile,
	n.agent_facts, n.last_heartbeat_at, n.created_at, n.simulated`

func scanNode(row pgx.Row, n *apiv1.Node) error {
	return row.Scan(&n.ID, &n.Name, &n.Status, &n.Draining, &n.Region, &n.TenantID, &n.SKU, &n.SliceSKU,
		&n.ProfileTags, &n.HardwareTags, &n.FirmwareProfile, &n.AgentFacts, &n.LastHeartbeatAt, &n.CreatedAt, &n.Simulated)
}

// CreateNode registers a node.
func (t *Tx) CreateNode(ctx context.Context, in apiv1.NodeCreate) (apiv1.Node, error) {
	if in.ProfileTags == nil {
		in.ProfileTags = []string{}
	}
	if in.HardwareTags == nil {
		in.HardwareTags = []string{}
	}
	var id string
	err := t.tx.QueryRow(ctx, `INSERT INTO nodes (name, region, tenant_id, sku, slice_sku, profile_tags, hardware_tags)
		VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id::text`,
		in.Name, in.Region, nullIfEmpty(in.TenantID), nullIfEmpty(in.SKU), nullIfEmpty(in.SliceSKU),
		in.ProfileTags, in.HardwareTags).Scan(&id)
	if err != nil {
		return apiv1.Node{}, translate(err)
	}
	return getNode(ctx, t.tx, id)
}

// nodeWhere is the predicate finding a node by id or name ($1), index-friendly on both: a
// UUID-shaped key may be either (node names are free-form), anything else only a name.
func nodeWhere(idOrName, alias string) string {
	if IsUUID(idOrName) {
		return "(" + alias + "id = $1::text::uuid OR " + alias + "name = $1::text)"
	}
	return alias + "name = $1"
}

// GetNode finds a node by id or name, with its slot summary.
func (s *Store) GetNode(ctx context.Context, idOrName string) (apiv1.Node, error) {
	return getNode(ctx, s.pool, idOrName)
}

// GetNode inside a transaction.
func (t *Tx) GetNode(ctx context.Context, idOrName string) (apiv1.Node, error) {
	return getNode(ctx, t.tx, idOrName)
}

func getNode(ctx context.Context, q querier, idOrName string) (apiv1.Node, error) {
	var n apiv1.Node
	err := scanNode(q.QueryRow(ctx, `SELECT `+nodeColumns+` FROM nodes n
		WHERE `+nodeWhere(idOrName, "n."), idOrName), &n)
	if err != nil {
		return n, translate(err)
	}
	sums, err := slotSummaries(ctx, q, []string{n.ID})
	if err != nil {
		return n, err
	}
	n.SlotSummary = sums[n.ID]
	return n, nil
}

// ListNodes returns every node with slot summaries.
func (s *Store) ListNodes(ctx context.Context) ([]apiv1.Node, error) {
	out, err := queryAll(ctx, s.pool, scanNode, `SELECT `+nodeColumns+` FROM nodes n ORDER BY n.name`)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(out))
	for i, n := range out {
		ids[i] = n.ID
	}
	sums, err := slotSummaries(ctx, s.pool, ids)
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i].SlotSummary = sums[out[i].ID]
	}
	return out, nil
}

func emptySummary() apiv1.SlotSummary {
	return apiv1.SlotSummary{ByStatus: map[string]int{}, BySKU: []apiv1.SKUSlots{}}
}

// slotSummaries aggregates slots and live claims for the given nodes in two queries.
func slotSummaries(ctx context.Context, q querier, ids []string) (map[string]apiv1.SlotSummary, error) {
	out := make(map[string]apiv1.SlotSummary, len(ids))
	for _, id := range ids {
		out[id] = emptySummary()
	}
	rows, err := q.Query(ctx, `SELECT s.node_id::text, s.status, coalesce(nullif(s.capacity_metadata->>'sku', ''), n.slice_sku, ''), count(*)
		FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id
		WHERE s.node_id = ANY($1::uuid[]) GROUP BY 1, 2, 3 ORDER BY 1, 3`, uuidsArg(ids))
	if err != nil {
		return nil, translate(err)
	}
	defer rows.Close()
	for rows.Next() {
		var node, status, sku string
		var c int
		if err := rows.Scan(&node, &status, &sku, &c); err != nil {
			return nil, translate(err)
		}
		sum := out[node]
		sum.Total += c
		sum.ByStatus[status] += c
		if status == "available" && sku != "" {
			found := false
			for i := range sum.BySKU {
				if sum.BySKU[i].SKU == sku {
					sum.BySKU[i].Available += c
					found = true
				}
			}
			if !found {
				sum.BySKU = append(sum.BySKU, apiv1.SKUSlots{SKU: sku, Available: c})
			}
		}
		out[node] = sum
	}
	if err := rows.Err(); err != nil {
		return nil, translate(err)
	}
	crow, err := q.Query(ctx, `SELECT node_id::text, claim_kind, count(*) FROM allocation_resource_claims
		WHERE node_id = ANY($1::uuid[]) AND status IN `+liveClaim+` GROUP BY 1, 2`, uuidsArg(ids))
	if err != nil {
		return nil, translate(err)
	}
	defer crow.Close()
	for crow.Next() {
		var node, kind string
		var c int
		if err := crow.Scan(&node, &kind, &c); err != nil {
			return nil, translate(err)
		}
		sum := out[node]
		if kind == "slot" {
			sum.LiveSlotClaims = c
		} else {
			sum.LiveExclusiveClaims = c
		}
		out[node] = sum
	}
	return out, translate(crow.Err())
}

// SetDraining sets or clears the drain flag. Drain is non-disruptive: live claims continue.
func (t *Tx) SetDraining(ctx context.Context, idOrName string, draining bool) (apiv1.Node, error) {
	tag, err := t.tx.Exec(ctx, `UPDATE nodes SET draining = $2, updated_at = now() WHERE `+nodeWhere(idOrName, ""), idOrName, draining)
	if err != nil {
		return apiv1.Node{}, translate(err)
	}
	if tag.RowsAffected() == 0 {
		return apiv1.Node{}, ErrNotFound
	}
	return getNode(ctx, t.tx, idOrName)
}

// HeartbeatRecord is one node's latest heartbeat, buffered for a batched write.
type HeartbeatRecord struct {
	NodeID   string
	At       time.Time
	Facts    json.RawMessage
	Firmware json.RawMessage // empty: keep the stored evidence
}

// RecordHeartbeats writes many heartbeats in one statement (coalesced by the caller).
func (s *Store) RecordHeartbeats(ctx context.Context, hbs []HeartbeatRecord) error {
	if len(hbs) == 0 {
		return nil
	}
	ids := make([]string, len(hbs))
	ats := make([]time.Time, len(hbs))
	facts := make([]string, len(hbs))
	fws := make([]*string, len(hbs))
	for i, h := range hbs {
		ids[i], ats[i] = h.NodeID, h.At
		facts[i] = "{}"
		if len(h.Facts) > 0 {
			facts[i] = string(h.Facts)
		}
		if len(h.Firmware) > 0 && string(h.Firmware) != "null" {
			fw := string(h.Firmware)
			fws[i] = &fw
		}
	}
	// The rows are locked in id order first (lockNodesInOrder) so this flush and a hint
	// refresh that share nodes cannot deadlock.
	_, err := s.pool.Exec(ctx, `WITH h AS MATERIALIZED (SELECT * FROM unnest($1::uuid[], $2::timestamptz[], $3::text[], $4::text[]) AS h(id, at, facts, fw)),
		locked AS MATERIALIZED (SELECT n.id FROM nodes n JOIN h ON h.id = n.id
			WHERE n.last_heartbeat_at IS NULL OR n.last_heartbeat_at < h.at
			`+lockNodesInOrder+`)
		UPDATE nodes n SET last_heartbeat_at = h.at, agent_facts = h.facts::jsonb,
			firmware_profile = coalesce(h.fw::jsonb, n.firmware_profile)
		FROM h JOIN locked l ON l.id = h.id
		WHERE n.id = h.id AND (n.last_heartbeat_at IS NULL OR n.last_heartbeat_at < h.at)`, ids, ats, facts, fws)
	return translate(err)
}
