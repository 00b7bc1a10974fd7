package store

import (
	"context"
	"fmt"
	"sort"
	"strings"
)

// Device identities are unique among enabled slots (migration 017 enforces it with the
// slot_identity triggers): a GPU or fabric VF PCI function, an NVMe device and a private IP
// within a node, a MAC address in the whole fleet. The store checks a slot map's MACs against
// other nodes before writing, so a dry run reports a conflict too and every conflicting slot is
// named at once; the triggers remain the guarantee.

// identityTriggers are the deferrable constraint triggers of migration 017.
const identityTriggers = `slot_identity_insert, slot_identity_update`

// MACKey is a MAC address as the database compares it: lower case, separators dropped.
func MACKey(mac string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(mac) {
		if r >= '0' && r <= '9' || r >= 'a' && r <= 'f' {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// MACHolders returns, for each of macs held by an enabled slot of a node other than nodeID,
// that slot ("slot 3 on node h200-02"), keyed by MACKey.
func (s *Store) MACHolders(ctx context.Context, nodeID string, macs []string) (map[string]string, error) {
	return macHolders(ctx, s.pool, nodeID, macs)
}

func macHolders(ctx context.Context, q querier, nodeID string, macs []string) (map[string]string, error) {
	keys := make([]string, 0, len(macs))
	for _, m := range macs {
		if k := MACKey(m); k != "" {
			keys = append(keys, k)
		}
	}
	out := map[string]string{}
	if len(keys) == 0 {
		return out, nil
	}
	rows, err := q.Query(ctx, `SELECT slot_identity_mac_key(o.mac_address), format('slot %s on node %s', o.slot_index, n.name)
		FROM node_resource_slots o JOIN nodes n ON n.id = o.node_id
		WHERE o.mac_address <> '' AND slot_identity_mac_key(o.mac_address) = ANY($2::text[])
		  AND o.status <> 'disabled' AND o.node_id <> $1::uuid
		ORDER BY n.name, o.slot_index`, nodeID, keys)
	if err != nil {
		return nil, translate(err)
	}
	defer rows.Close()
	for rows.Next() {
		var k, holder string
		if err := rows.Scan(&k, &holder); err != nil {
			return nil, translate(err)
		}
		if _, ok := out[k]; !ok {
			out[k] = holder
		}
	}
	return out, translate(rows.Err())
}

// checkMACs refuses a slot map whose enabled slots name a MAC another node's enabled slot
// holds, naming every such slot and its holder.
func (t *Tx) checkMACs(ctx context.Context, nodeID, nodeName string, macByIndex map[int]string) error {
	macs := make([]string, 0, len(macByIndex))
	for _, m := range macByIndex {
		macs = append(macs, m)
	}
	held, err := macHolders(ctx, t.tx, nodeID, macs)
	if err != nil || len(held) == 0 {
		return err
	}
	idx := make([]int, 0, len(macByIndex))
	for i := range macByIndex {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	var msgs []string
	for _, i := range idx {
		if h, ok := held[MACKey(macByIndex[i])]; ok {
			msgs = append(msgs, fmt.Sprintf("slot %d on node %s: mac_address %s is already held by %s", i, nodeName, macByIndex[i], h))
		}
	}
	return &DBError{Kind: ErrConflict, Constraint: "slot_identity_mac",
		Detail: strings.Join(msgs, "; ") + " (a MAC address is unique in the fleet)"}
}

// lockMACs takes the advisory locks the identity trigger takes for each MAC, in one order, so
// two slot maps naming the same MACs queue instead of deadlocking.
func (t *Tx) lockMACs(ctx context.Context, macs []string) error {
	keys := make([]string, 0, len(macs))
	for _, m := range macs {
		if k := MACKey(m); k != "" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	_, err := t.tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('gpuaas slot mac ' || u.k, 0))
		FROM (SELECT k FROM unnest($1::text[]) WITH ORDINALITY AS a(k, i) ORDER BY i) u`, keys)
	return translate(err)
}
