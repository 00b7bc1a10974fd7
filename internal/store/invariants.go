package store

import (
	"context"
	"fmt"
	"time"
)

// Deadlines bound how long an allocation may stay in motion (the controller's provisioning
// and release deadlines plus the reaper's slack); a zero field skips that check.
type Deadlines struct {
	Provision time.Duration // requested/provisioning -> active or terminal, from creation
	Release   time.Duration // releasing -> released or failed, from the release request
}

// Invariants checks, in SQL, the properties the scheduler promises and returns a description
// of each violation (empty when all hold). Tests and operators (and later the reconciler)
// run it; it never changes anything. Each check is one statement, so it sees one snapshot.
func (s *Store) Invariants(ctx context.Context) ([]string, error) {
	return s.InvariantsWithin(ctx, Deadlines{})
}

// InvariantsWithin is Invariants plus the deadline checks d asks for: an allocation still
// requested or provisioning after d.Provision, or still releasing after d.Release, is a
// violation (the reaper should have ended it).
func (s *Store) InvariantsWithin(ctx context.Context, d Deadlines) ([]string, error) {
	type check struct {
		name, sql string
		args      []any
	}
	checks := []check{
		{"slot with more than one live claim", `SELECT slot_id::text FROM allocation_resource_claims
			WHERE claim_kind = 'slot' AND status IN ` + liveClaim + ` GROUP BY slot_id HAVING count(*) > 1`, nil},
		{"allocation whose claims span nodes", `SELECT allocation_id::text FROM allocation_resource_claims
			GROUP BY allocation_id HAVING count(DISTINCT node_id) > 1`, nil},
		{"slice allocation whose live claim count differs from gpus_total", `SELECT a.id::text FROM allocations a
			WHERE a.capacity_shape = 'gpu_slice' AND a.status NOT IN ('released', 'failed')
			AND (SELECT count(*) FROM allocation_resource_claims c WHERE c.allocation_id = a.id AND c.status IN ` + liveClaim + `) <> a.gpus_total`, nil},
		{"node with both a live slot claim and a live node_exclusive claim", `SELECT node_id::text FROM allocation_resource_claims
			WHERE status IN ` + liveClaim + ` GROUP BY node_id HAVING count(DISTINCT claim_kind) > 1`, nil},
		{"slot held by a live claim but marked available", `SELECT s.id::text FROM node_resource_slots s
			JOIN allocation_resource_claims c ON c.slot_id = s.id AND c.status IN ` + liveClaim + `
			WHERE s.status IN ('available', 'disabled')`, nil},
		{"slot reserved/provisioning/active without a live claim", `SELECT s.id::text FROM node_resource_slots s
			WHERE s.status IN ('reserved', 'provisioning', 'active')
			AND NOT EXISTS (SELECT 1 FROM allocation_resource_claims c WHERE c.slot_id = s.id AND c.status IN ` + liveClaim + `)`, nil},
		{"fabric VF in two live claims on one node", `SELECT node_id::text || ' ' || fabric_vf_pci_address FROM allocation_resource_claims
			WHERE claim_kind = 'slot' AND fabric_vf_pci_address <> '' AND status IN ` + liveClaim + `
			GROUP BY node_id, fabric_vf_pci_address HAVING count(*) > 1`, nil},
		{"live allocation with a live claim in another state", `SELECT DISTINCT a.id::text || ' ' || a.status || '/' || c.status FROM allocations a
			JOIN allocation_resource_claims c ON c.allocation_id = a.id AND c.status IN ` + liveClaim + `
			WHERE c.status <> CASE a.status WHEN 'requested' THEN 'reserved' ELSE a.status END`, nil},
		{"released or failed allocation still holding a live claim", `SELECT DISTINCT a.id::text || ' ' || a.status FROM allocations a
			JOIN allocation_resource_claims c ON c.allocation_id = a.id AND c.status IN ` + liveClaim + `
			WHERE a.status IN ('released', 'failed')`, nil},
		// Migration 017 refuses these on every write; rows from before it are reported here.
		{"device identity held by two enabled slots", `SELECT k || ' ' || string_agg(n.name || '/' || s.slot_index, ', ' ORDER BY n.name, s.slot_index)
			FROM (SELECT id, 'mac ' || slot_identity_mac_key(mac_address) AS k FROM node_resource_slots
			      WHERE status <> 'disabled' AND mac_address <> ''
			      UNION ALL SELECT id, 'node ' || node_id || ' pci ' || lower(a) FROM node_resource_slots,
			        unnest(ARRAY[pci_address, coalesce(capacity_metadata->>'fabric_vf_pci_address', '')]) AS a
			      WHERE status <> 'disabled' AND a <> ''
			      UNION ALL SELECT id, 'node ' || node_id || ' nvme ' || regexp_replace(nvme_device, '-part[0-9]+$', '') FROM node_resource_slots
			      WHERE status <> 'disabled' AND nvme_device <> ''
			      UNION ALL SELECT id, 'node ' || node_id || ' ip ' || host(private_ip) FROM node_resource_slots
			      WHERE status <> 'disabled' AND private_ip IS NOT NULL) i
			JOIN node_resource_slots s ON s.id = i.id JOIN nodes n ON n.id = s.node_id
			GROUP BY k HAVING count(DISTINCT i.id) > 1`, nil},
		{"slot whose state disagrees with its live claim", `SELECT s.id::text || ' slot ' || s.status || ', claim ' || c.status FROM node_resource_slots s
			JOIN allocation_resource_claims c ON c.slot_id = s.id AND c.status IN ` + liveClaim + `
			WHERE NOT (s.status = c.status OR (c.status = 'releasing' AND s.status IN ('failed', 'cleanup', 'cleanup_blocked')))`, nil},
		// Migration 020 refuses these on every write.
		{"slot a reservation holds claimed by an allocation outside it", `SELECT s.id::text || ' held by ' || s.reservation_id::text || ', claimed by ' || a.id::text
			FROM node_resource_slots s
			JOIN allocation_resource_claims c ON c.slot_id = s.id AND c.status IN ` + liveClaim + `
			JOIN allocations a ON a.id = c.allocation_id
			WHERE s.reservation_id IS NOT NULL AND a.reservation_id IS DISTINCT FROM s.reservation_id`, nil},
		{"slot held by an ended reservation or one of another node", `SELECT s.id::text || ' held by ' || r.id::text || ' (' || r.status || ')'
			FROM node_resource_slots s JOIN capacity_reservations r ON r.id = s.reservation_id
			WHERE r.status <> 'active' OR r.node_id <> s.node_id`, nil},
		// Migration 034 keeps these on every write.
		{"slot whose current device snapshot is not of its devices", `SELECT s.id::text FROM node_resource_slots s
			LEFT JOIN slot_device_snapshots d ON d.id = s.device_snapshot_id
			WHERE d.snapshot IS DISTINCT FROM slot_device_snapshot(s)`, nil},
		{"slot claim recording another slot's devices", `SELECT c.id::text FROM allocation_resource_claims c
			JOIN slot_device_snapshots d ON d.id = c.device_snapshot_id
			WHERE d.slot_id IS DISTINCT FROM c.slot_id`, nil},
		// While allocation_snapshots_apart is off (migration 035) a new allocation's record is in
		// both places, and the previous release reads its own columns: they must say the same.
		{"allocation whose own snapshot columns differ from its snapshot row", `SELECT a.id::text FROM allocations a
			JOIN allocation_snapshots x ON x.allocation_id = a.id JOIN allocation_terms t ON t.id = x.terms_id
			WHERE a.price_snapshot <> '{}' AND (a.resolved_profile, a.image_snapshot, a.price_snapshot, a.ssh_public_keys)
				IS DISTINCT FROM (t.resolved_profile, t.image_snapshot, t.price_snapshot, x.ssh_public_keys)`, nil},
	}
	if d.Provision > 0 {
		checks = append(checks, check{"allocation neither active nor ended within the provisioning deadline", `SELECT id::text || ' ' || status || ' since ' || created_at::text
			FROM allocations WHERE status IN ('requested', 'provisioning') AND created_at < now() - $1::interval`, []any{d.Provision}})
	}
	if d.Release > 0 {
		checks = append(checks, check{"allocation still releasing past the release deadline", `SELECT id::text || ' releasing since ' || releasing_at::text
			FROM allocations WHERE status = 'releasing' AND releasing_at < now() - $1::interval`, []any{d.Release}})
	}
	var out []string
	for _, c := range checks {
		rows, err := s.pool.Query(ctx, c.sql, c.args...)
		if err != nil {
			return nil, translate(err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return nil, translate(err)
			}
			out = append(out, fmt.Sprintf("%s: %s", c.name, id))
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, translate(err)
		}
	}
	return out, nil
}

// TransitionTables returns the database's copies of the state machines (from -> [to]).
func (s *Store) TransitionTables(ctx context.Context) (slots, allocations map[string][]string, err error) {
	read := func(table string) (map[string][]string, error) {
		rows, err := s.pool.Query(ctx, `SELECT from_status, to_status FROM `+table+` ORDER BY 1, 2`)
		if err != nil {
			return nil, translate(err)
		}
		defer rows.Close()
		m := map[string][]string{}
		for rows.Next() {
			var f, t string
			if err := rows.Scan(&f, &t); err != nil {
				return nil, translate(err)
			}
			m[f] = append(m[f], t)
		}
		return m, translate(rows.Err())
	}
	if slots, err = read("slot_transitions"); err != nil {
		return nil, nil, err
	}
	allocations, err = read("allocation_transitions")
	return slots, allocations, err
}
