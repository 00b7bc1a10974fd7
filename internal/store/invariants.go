package store

import (
	"context"
	"fmt"
)

// Invariants checks, in SQL, the properties the scheduler promises and returns a description
// of each violation (empty when all hold). Tests and operators (and later the reconciler)
// run it; it never changes anything.
func (s *Store) Invariants(ctx context.Context) ([]string, error) {
	checks := []struct{ name, sql string }{
		{"slot with more than one live claim", `SELECT slot_id::text FROM allocation_resource_claims
			WHERE claim_kind = 'slot' AND status IN ` + liveClaim + ` GROUP BY slot_id HAVING count(*) > 1`},
		{"allocation whose claims span nodes", `SELECT allocation_id::text FROM allocation_resource_claims
			GROUP BY allocation_id HAVING count(DISTINCT node_id) > 1`},
		{"slice allocation whose live claim count differs from gpus_total", `SELECT a.id::text FROM allocations a
			WHERE a.capacity_shape = 'gpu_slice' AND a.status NOT IN ('released', 'failed')
			AND (SELECT count(*) FROM allocation_resource_claims c WHERE c.allocation_id = a.id AND c.status IN ` + liveClaim + `) <> a.gpus_total`},
		{"node with both a live slot claim and a live node_exclusive claim", `SELECT node_id::text FROM allocation_resource_claims
			WHERE status IN ` + liveClaim + ` GROUP BY node_id HAVING count(DISTINCT claim_kind) > 1`},
		{"slot held by a live claim but marked available", `SELECT s.id::text FROM node_resource_slots s
			JOIN allocation_resource_claims c ON c.slot_id = s.id AND c.status IN ` + liveClaim + `
			WHERE s.status IN ('available', 'disabled')`},
		{"slot reserved/provisioning/active without a live claim", `SELECT s.id::text FROM node_resource_slots s
			WHERE s.status IN ('reserved', 'provisioning', 'active')
			AND NOT EXISTS (SELECT 1 FROM allocation_resource_claims c WHERE c.slot_id = s.id AND c.status IN ` + liveClaim + `)`},
		{"fabric VF in two live claims on one node", `SELECT node_id::text || ' ' || fabric_vf_pci_address FROM allocation_resource_claims
			WHERE claim_kind = 'slot' AND fabric_vf_pci_address <> '' AND status IN ` + liveClaim + `
			GROUP BY node_id, fabric_vf_pci_address HAVING count(*) > 1`},
	}
	var out []string
	for _, c := range checks {
		rows, err := s.pool.Query(ctx, c.sql)
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
