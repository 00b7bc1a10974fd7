package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// PlacementQuery selects candidates for one request.
type PlacementQuery struct {
	SKU      string
	Region   string // "" = any region
	TenantID string
	// HeartbeatMaxAge excludes nodes whose agent has not reported within it; 0 disables the check.
	HeartbeatMaxAge time.Duration
}

// CandidateSlot is one slot that passed every slice filter.
type CandidateSlot struct {
	NodeID    string
	NodeName  string
	SlotID    string
	SlotIndex int
	NUMANode  int // -1 unknown
}

// sliceBase is the seed-000 slot filter's node-level and slot-shape parts, shared by the
// candidate query and the diagnosis query so the two can never disagree; the window's
// statement uses the same two parts (nodeOK, slotOK) on its nodes.
var sliceBase = `
	FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id
	WHERE ` + fleetWide(nodeOK) + `
	  AND ` + slotOK

// sliceBaseAnyRuntime is sliceBase without simulatedOK, for the diagnosis.
var sliceBaseAnyRuntime = `
	FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id
	WHERE ` + fleetWide(nodeLive) + `
	  AND ` + slotOK

// sliceBaseAnyHold is sliceBaseAnyRuntime with the slots capacity reservations hold, for the
// diagnosis to count them.
var sliceBaseAnyHold = strings.Replace(sliceBaseAnyRuntime, unheld, "true", 1)

// nodeOK is the filter's node-level part: what node n must meet for any of its slots to be a candidate.
const nodeOK = simulatedOK + `
	  AND ` + nodeLive

// simulatedOK keeps simulated nodes (hostd on the sim runtime) out of placement unless the
// session allows them (store.Options.AllowSimulated); the claim trigger refuses them the same
// way (migration 016), so placement never offers what the database would refuse.
const simulatedOK = `(NOT n.simulated OR coalesce(current_setting('` + AllowSimulatedParam + `', true), '') = 'on')`

// nodeLive is nodeOK without simulatedOK (the diagnosis counts what simulatedOK excludes).
const nodeLive = `n.status = 'active'
	  AND ($2 = '' OR n.region = $2)
	  AND (n.tenant_id IS NULL OR n.tenant_id::text = $3)
	  AND ($4::float8 = 0 OR n.last_heartbeat_at > now() - make_interval(secs => $4::float8))
	  AND coalesce(n.agent_facts->'prerequisites'->>'ready', 'true') = 'true'
	  AND NOT EXISTS (SELECT 1 FROM allocation_resource_claims c
	                  WHERE c.node_id = n.id AND c.claim_kind = 'node_exclusive' AND c.status IN ` + liveClaim + `
	                  ` + probeFence + `)
	  AND NOT EXISTS (SELECT 1 FROM allocations a -- index allocations_live_baremetal (migration 009)
	                  WHERE a.node_id = n.id AND a.capacity_shape = 'baremetal'
	                    AND a.status NOT IN ('released', 'failed')
	                  ` + probeFence + `)`

// slotOK is the filter's slot-level part (slot s of node n): the slot's SKU, state and shape.
// A slot a capacity reservation holds is no candidate for the fleet (reservationCandidatesSQL
// offers it inside its reservation); the database refuses such a claim anyway (migration 020).
const slotOK = `coalesce(nullif(s.capacity_metadata->>'sku', ''), n.slice_sku) = $1
	  AND s.status = 'available' AND s.health <> 'quarantined' AND ` + unheld + ` AND s.capacity_shape = 'gpu_slice' AND s.parent_slot_id IS NULL
	  AND s.sharing_model = 'exclusive_device' AND s.max_claims = 1 AND s.compute_milli >= 1000
	  AND s.pci_address <> '' AND s.nvme_device <> '' AND s.mac_address <> '' AND s.private_ip IS NOT NULL`

// unheld is slot s held by no capacity reservation.
const unheld = `s.reservation_id IS NULL`

// probeFence marks the end of each node-level check on live claims and allocations. In the
// window's statement it becomes "OFFSET 0", which keeps each check a probe of its partial
// index by node: without it PostgreSQL may flatten them into anti-joins and, seeing a tiny
// partial index in its statistics, scan every live claim of the fleet (the 16-client bench:
// 20-28 claims and 2,500-4,000 heap fetches per window; a full fleet has tens of thousands of
// live claims). The fleet-wide statements (the fallback after the windows, the diagnosis)
// read every slot, where a hashed anti-join is the right plan, so there it becomes nothing.
// The predicates are the same text either way.
const probeFence = "/*probe*/"

// fleetWide is sql with its probe fences removed (see probeFence).
func fleetWide(sql string) string { return strings.ReplaceAll(sql, probeFence, "") }

// storageOK and fabricOK are the policy parts of the filter (seed 000, seed 002 required keys):
// the slot's own fabric fields (fabricShape), no live claim on its VF, and no other enabled
// slot of its node with the same VF. The window's statement states the last two over the
// window's rows (windowSQL); TestWindowAgreesWithFleetWideFilter holds the two forms equal.
const storageOK = `(s.capacity_metadata->>'storage_ownership' = 'slice'
	  AND coalesce(s.capacity_metadata->>'destructive_wipe_policy', '') <> '')`

const fabricShape = `s.capacity_metadata->>'fabric_claim_mode' = 'per_slot_vf'
	  AND coalesce(s.capacity_metadata->>'fabric_vf_pci_address', '') <> ''`

const fabricOK = `(` + fabricShape + `
	  AND NOT EXISTS (SELECT 1 FROM allocation_resource_claims c -- index claims_one_live_per_fabric_vf
	                  WHERE c.node_id = n.id AND c.claim_kind = 'slot' AND c.status IN ` + liveClaim + `
	                    AND c.fabric_vf_pci_address <> ''
	                    AND c.fabric_vf_pci_address = s.capacity_metadata->>'fabric_vf_pci_address')
	  AND NOT EXISTS (SELECT 1 FROM node_resource_slots o
	                  WHERE o.node_id = s.node_id AND o.id <> s.id AND o.status <> 'disabled'
	                    AND o.capacity_metadata->>'fabric_vf_pci_address' = s.capacity_metadata->>'fabric_vf_pci_address'))`

func (pq PlacementQuery) args() []any {
	return []any{pq.SKU, pq.Region, pq.TenantID, pq.HeartbeatMaxAge.Seconds()}
}

// SliceCandidates returns every slot passing the full filter, ordered by node name and slot index.
func (t *Tx) SliceCandidates(ctx context.Context, pq PlacementQuery) ([]CandidateSlot, error) {
	return sliceCandidates(ctx, t.tx, pq)
}

// SliceCandidates outside a transaction (dry runs, capacity).
func (s *Store) SliceCandidates(ctx context.Context, pq PlacementQuery) ([]CandidateSlot, error) {
	return sliceCandidates(ctx, s.pool, pq)
}

func sliceCandidates(ctx context.Context, q querier, pq PlacementQuery) ([]CandidateSlot, error) {
	return queryAll(ctx, q, func(r pgx.Row, c *CandidateSlot) error {
		return r.Scan(&c.NodeID, &c.NodeName, &c.SlotID, &c.SlotIndex, &c.NUMANode)
	}, `SELECT n.id::text, n.name, s.id::text, s.slot_index, coalesce(s.numa_node, -1) `+
		sliceBase+` AND NOT n.draining AND `+storageOK+` AND `+fabricOK+`
		ORDER BY n.name, s.slot_index`, pq.args()...)
}

// capacityOfN is node n's best-fit hints as a row (free, grp, allocs): its available slots
// that no capacity reservation holds (those are not the fleet's), the most of them in one NUMA
// group, a slot of unknown NUMA node being a group of its own (as internal/sched groups them),
// and the live allocations holding slots on it. One read of the node's slots and one of its
// live claims (index claims_live_node).
const capacityOfN = `(SELECT coalesce(sum(k), 0)::int AS free, coalesce(max(k), 0)::int AS grp,
	  (SELECT count(DISTINCT c.allocation_id)::int FROM allocation_resource_claims c
	   WHERE c.node_id = n.id AND c.claim_kind = 'slot' AND c.status IN ` + liveClaim + `) AS allocs
	FROM (SELECT count(*) AS k FROM node_resource_slots s WHERE s.node_id = n.id AND s.status = 'available' AND s.health <> 'quarantined' AND ` + unheld + `
	      GROUP BY s.numa_node, CASE WHEN s.numa_node IS NULL THEN s.id END) g)`

// lockNodesInOrder ends a SELECT of nodes n that a statement updating many nodes runs first:
// it locks the rows in id order. Every replica's heartbeat flush and hint refresh update
// nodes many at a time, in the background; locked in whatever order a plan reads them, two
// sharing two nodes can each hold one and wait for the other, and PostgreSQL breaks that
// deadlock after a second by failing one (the flush's heartbeats, or the refresh, lost).
const lockNodesInOrder = `ORDER BY n.id FOR NO KEY UPDATE OF n`

// refreshCapacitySQL recounts the hints of the nodes marked dirty, locking them in id order,
// and updates those that changed. The dirty nodes are looked up by id as an array: joined to
// the dirty rows (or to the locked ones, for the update), the planner, estimating the dirty
// rows from the table's size, hashed them and scanned every node of the fleet, twice a
// refresh, every 10 ms under load (5,000 nodes: 730 buffers and 4 ms a refresh, against 330
// and 1.3 ms; TestCapacityRefreshCostIgnoresFleetSize).
const refreshCapacitySQL = `WITH d AS (DELETE FROM node_capacity_dirty RETURNING node_id),
	locked AS MATERIALIZED (SELECT n.id, c.free, c.grp, c.allocs FROM nodes n, LATERAL ` + capacityOfN + ` c
	      WHERE n.id = ANY (ARRAY(SELECT DISTINCT node_id FROM d))
	        AND (n.available_slots, n.group_available, n.slice_allocations) <> (c.free, c.grp, c.allocs)
	      ` + lockNodesInOrder + `)
	UPDATE nodes n SET available_slots = l.free, group_available = l.grp, slice_allocations = l.allocs FROM locked l
	WHERE n.id = ANY (ARRAY(SELECT id FROM locked)) AND n.id = l.id`

// RefreshCapacity recounts the best-fit hints (available_slots and slice_allocations, the
// nodes_best_fit index's keys, and group_available) of nodes whose slots changed since the
// last refresh and returns how many nodes it changed.
func (s *Store) RefreshCapacity(ctx context.Context) (int, error) {
	tag, err := s.pool.Exec(ctx, refreshCapacitySQL)
	if err != nil {
		return 0, translate(err)
	}
	return int(tag.RowsAffected()), nil
}

// WindowKey is where a best-fit node window ends; the next window starts after it.
type WindowKey struct {
	Available   int
	Allocations int // the node's live slice allocations (nodes.slice_allocations)
	Name        string
}

// windowNodes is the best-fit window as two CTEs: start, the first node after the key ($6,
// $10, $7) in best-fit order whose largest free NUMA group has $9 available slots (the request's
// WindowRequest.Group); and win, the $8 nodes of the best-fit order from start on (id,
// available_slots, neg_allocs, name, and fits: whether its largest group has $9 and it is one of
// the first $11 of the window's nodes with its best-fit key, $11 = 0 for no such limit, or,
// when the key holds no allocation and $12 > 0, one of $12 of them after the first $13, or the
// last $12 when fewer follow: WindowRequest.EmptyTies and EmptySkip). Best-fit
// order is fewest available slots, then most live slice allocations (neg_allocs, their count
// negated: the nodes_best_fit index's key), then name. $1-$4 are PlacementQuery.args(), $5
// the GPUs. Only the nodes that fit are read further, so a window spans the same best-fit
// positions a window of every node would, from the first node that could settle the request,
// and ranks the same nodes that could (the policy the placement benchmark measures), while a
// run of nodes that cannot (2 + 2 free for a 4-GPU request) costs index entries, not slot
// reads and windows.
const windowNodes = `start AS MATERIALIZED (SELECT n.available_slots, -n.slice_allocations AS neg_allocs, n.name ` + windowFrom + `
		  AND n.group_available >= $9 AND (n.available_slots, -n.slice_allocations, n.name) > ($6, $10, $7)
		ORDER BY n.available_slots, -n.slice_allocations, n.name LIMIT 1),
	win AS MATERIALIZED (SELECT w.id, w.available_slots, w.neg_allocs, w.name,
		         w.group_available >= $9 AND CASE
		           WHEN w.neg_allocs = 0 AND $12 > 0 THEN row_number() OVER tie - least($13, greatest(count(*) OVER key - $12, 0)) BETWEEN 1 AND $12
		           WHEN $11 > 0 THEN row_number() OVER tie <= $11
		           ELSE true END AS fits
		FROM start f, LATERAL (SELECT n.id, n.available_slots, -n.slice_allocations AS neg_allocs, n.name, n.group_available ` + windowFrom + `
		  AND (n.available_slots, -n.slice_allocations, n.name) >= (f.available_slots, f.neg_allocs, f.name)
		ORDER BY n.available_slots, -n.slice_allocations, n.name LIMIT $8) w
		WINDOW key AS (PARTITION BY w.available_slots, w.neg_allocs), tie AS (key ORDER BY w.name))`

const windowFrom = `FROM nodes n
		WHERE n.slice_sku = $1 AND n.status = 'active' AND NOT n.draining AND n.available_slots >= $5
		  AND ($2 = '' OR n.region = $2) AND (n.tenant_id IS NULL OR n.tenant_id::text = $3)
		  AND ($4::float8 = 0 OR n.last_heartbeat_at > now() - make_interval(secs => $4::float8))`

// windowSQL is a best-fit window, the full slot filter on its nodes and their topology in one
// statement (so one snapshot: the window cannot move between reading its nodes and their
// slots when a hint refresh commits in between), reading each node once and its slots and
// their live claims through indexes, so its cost grows with neither the fleet nor the
// allocation history (TestWindowCostIgnoresAllocationHistory). It returns, first, one row per
// window node in window order (kind 0: its best-fit key, whether it fits (windowNodes) and its
// live slot claims and allocations), then one row per enabled slice slot of the placeable
// nodes that fit (kind 1, in no order: the node, the slot, its NUMA node, whether it is a
// candidate and its live holder). The node-level checks run once per node, and the VF checks
// over the node's slots and live claims already read: as a NOT EXISTS per candidate slot (the
// fleet-wide form, fabricOK) they were 3-4 index probes per slot and most of the statement's
// buffers. Each slot's live claim is one probe of claims_one_live_per_slot behind a fence
// (OFFSET 0, so the planner cannot turn it into a scan of every live claim); it names the
// slot's node too (a slot claim's node is its slot's, checked on insert), so that with
// statistics taken while no claim was live, when every live-claim index looks empty and
// claims_live_node as good as the slot's own, the planner's other choice is a probe of the
// node's live claims, not a scan of the fleet's for every slot
// (TestWindowCostIgnoresOtherNodesClaimsAfterAnEmptyAnalyze), and the claim
// counts and VFs in use come from those rows. Slot rows are not joined back to the window's
// nodes: with the planner's one-row estimates for every CTE that join, and a holder looked up
// per slot row, were nested loops over the window's rows, most of a busy window's time (22
// nodes, 127 rows: 2.0 ms against 1.2 ms now). The window's nodes are looked up by id behind a
// fence (OFFSET 0): joined to nodes, a table without statistics (just onboarded, or just
// upgraded) had the planner find each of them by scanning the best-fit index from its start,
// running the node checks on every node it passed (TestWindowCostIgnoresFullNodes).
var windowSQL = strings.ReplaceAll(`WITH `+windowNodes+`,
	placeable AS MATERIALIZED (SELECT n.id, n.name, n.slice_sku
		FROM (SELECT id, name, slice_sku, draining, status, region, tenant_id, last_heartbeat_at, agent_facts, simulated
		      FROM nodes WHERE id = ANY (ARRAY(SELECT id FROM win WHERE fits)) OFFSET 0) n
		WHERE NOT n.draining AND `+nodeOK+`),
	slots AS MATERIALIZED (SELECT s.id, s.node_id, s.slot_index, s.numa_node, s.status,
		         s.capacity_shape = 'gpu_slice' AND s.parent_slot_id IS NULL AND s.status <> 'disabled' AS slice,
		         s.capacity_metadata->>'fabric_vf_pci_address' AS vf,
		         coalesce(`+slotOK+` AND `+storageOK+` AND `+fabricShape+`, false) AS ok,
		         c.allocation_id AS holder, c.fabric_vf_pci_address AS claim_vf
		FROM placeable n JOIN node_resource_slots s ON s.node_id = n.id
		LEFT JOIN LATERAL (SELECT c.allocation_id, c.fabric_vf_pci_address FROM allocation_resource_claims c -- index claims_one_live_per_slot
		                   WHERE c.slot_id = s.id AND c.node_id = s.node_id AND c.claim_kind = 'slot' AND c.status IN `+liveClaim+` `+probeFence+`) c ON true),
	taken_vf AS MATERIALIZED (SELECT node_id, vf FROM slots WHERE status <> 'disabled' GROUP BY 1, 2 HAVING count(*) > 1
		UNION ALL SELECT node_id, claim_vf FROM slots WHERE claim_vf <> ''),
	claimed AS MATERIALIZED (SELECT node_id, count(*) AS n, count(DISTINCT holder) AS a FROM slots WHERE holder IS NOT NULL GROUP BY node_id)
	SELECT 0 AS kind, w.id::text, w.available_slots, w.neg_allocs, w.name, w.fits, coalesce(cl.n, 0), coalesce(cl.a, 0),
	       NULL::text, NULL::int, NULL::int, NULL::bool, NULL::text
	FROM win w LEFT JOIN claimed cl ON cl.node_id = w.id
	UNION ALL
	SELECT 1, s.node_id::text, NULL, NULL, NULL, NULL, NULL, NULL, s.id::text, s.slot_index, coalesce(s.numa_node, -1),
	       s.ok AND NOT EXISTS (SELECT 1 FROM taken_vf t WHERE t.node_id = s.node_id AND t.vf = s.vf), s.holder::text
	FROM slots s WHERE s.slice
	ORDER BY 1, 3, 4, 5`, probeFence, "OFFSET 0")

// Window is one best-fit window: its nodes, where the next window starts, the nodes'
// candidate slots (the full filter) and their topology.
type Window struct {
	NodeIDs []string
	// Read is the nodes of NodeIDs whose slots were read: those whose largest free NUMA group
	// could hold the request (WindowRequest.Group, by the hint). The others have no candidates.
	Read       []string
	Next       WindowKey
	Candidates []CandidateSlot
	Topology   map[string]NodeTopology
	// SentAt is when the window's statement was sent: a reservation whose commit returned
	// after it may not show here (its slots read as free).
	SentAt time.Time
}

// SliceWindow reads a best-fit window, its candidates and their topology in one round trip:
// up to w.Limit placeable nodes of the query's slice SKU with at least w.GPUs available slots
// and w.Group of them in one NUMA group (both hints, as of the last refresh), best fit first
// (fewest available slots, then most live slice allocations, then name), after w.After (nil:
// from the start), read through the nodes_best_fit index so the cost does not grow with the fleet; then the full
// slot filter and NodeTopology on those nodes (the later statements re-select the window by
// index). Nodes whose slots override the SKU are not found here: callers fall back to
// SliceCandidates when the windows yield nothing.
func (t *Tx) SliceWindow(ctx context.Context, w WindowRequest) (Window, error) {
	b := &pgx.Batch{}
	w.queue(b)
	sent := time.Now()
	br := t.tx.SendBatch(ctx, b)
	defer br.Close()
	win, err := w.read(br)
	win.SentAt = sent
	return win, err
}

// WindowRequest is SliceWindow's arguments, for callers that read a window in the same round
// trip as other statements (SKUWithSliceImage).
type WindowRequest struct {
	Query PlacementQuery
	GPUs  int
	// Group is the available slots one NUMA group of a window node must have
	// (sched.WindowGroup: the request's GPUs, or 0 for a whole host); 0 reads every node.
	Group int
	After *WindowKey // nil: the first window
	Limit int        // best-fit positions the window spans
	// Ties is the most nodes of the window with one best-fit key (available slots, live
	// allocations) whose slots are read (sched.WindowTies); 0 reads every one. Nodes equal on
	// both are mostly alike (on an empty fleet, all of them), and this keeps a wide window's
	// cost on such a fleet that of a narrow one.
	Ties int
	// EmptyTies, when not 0, replaces Ties for the nodes holding no allocation
	// (sched.WindowEmptyTies): those alike in available slots differ in nothing the ranking
	// sees but their names, so reading more of them only costs slot rows.
	EmptyTies int
	// EmptySkip passes over that many of the window's nodes alike that hold no allocation
	// before the EmptyTies it reads (when fewer than EmptySkip + EmptyTies are in the window,
	// it reads the last EmptyTies of them): concurrent creates of one replica each read empty
	// nodes of their own (internal/alloc's lanes) instead of all reading, and racing for, the
	// same first ones.
	EmptySkip int
}

// queue appends the window's statements to b.
func (w WindowRequest) queue(b *pgx.Batch) {
	// The statement runs with a different window every time: a generic plan saves the
	// planner's milliseconds on each reservation (its best plan does not depend on values).
	b.Queue(`SET LOCAL plan_cache_mode = force_generic_plan`)
	b.Queue(windowSQL, w.sqlArgs()...)
}

// sqlArgs is windowSQL's arguments ($1-$13).
func (w WindowRequest) sqlArgs() []any {
	k := w.key()
	return append(w.Query.args(), w.GPUs, k.Available, k.Name, w.Limit, w.Group, -k.Allocations, w.Ties, w.EmptyTies, w.EmptySkip)
}

func (w WindowRequest) key() WindowKey {
	if w.After != nil {
		return *w.After
	}
	// The first window starts at the request's size, not at the index's start: on a busy
	// fleet the full and nearly full nodes sort first, and a start of -1 walked their index
	// entries on every create (3,000 full nodes: 36 buffers and 0.4 ms a window, 7 buffers and
	// 0.03 ms from here). Node names are never empty (migration 001), so (GPUs, "") precedes
	// every node with GPUs or more available slots; and no node holds MaxInt32 allocations.
	return WindowKey{Available: w.GPUs, Allocations: math.MaxInt32}
}

// read reads the results of the statements queue appended. Candidates come ordered by node
// name and slot index, as SliceCandidates orders them.
func (w WindowRequest) read(br pgx.BatchResults) (Window, error) {
	win := Window{Next: w.key(), Topology: map[string]NodeTopology{}}
	if _, err := br.Exec(); err != nil {
		return win, translate(err)
	}
	rows, err := br.Query()
	if err != nil {
		return win, translate(err)
	}
	defer rows.Close()
	// Value types, not pointers, for the nullable columns: 64 rows a window, and a pointer per
	// column per row was most of this reader's allocations.
	var (
		kind       int
		node, name pgtype.Text
		avail      pgtype.Int4
		negAllocs  pgtype.Int4
		fits       pgtype.Bool
		claimed    pgtype.Int8
		allocs     pgtype.Int8
		slotID     pgtype.Text
		slotIndex  pgtype.Int4
		numa       pgtype.Int4
		candidate  pgtype.Bool
		holder     pgtype.Text
	)
	names := map[string]string{}
	held := map[string]map[string]int{} // node -> allocation -> its index in Occupants
	for rows.Next() {
		if err := rows.Scan(&kind, &node, &avail, &negAllocs, &name, &fits, &claimed, &allocs, &slotID, &slotIndex, &numa, &candidate, &holder); err != nil {
			return win, translate(err)
		}
		if kind == 0 {
			// The window's nodes, in window order, before any slot.
			if !node.Valid || !avail.Valid || !negAllocs.Valid || !name.Valid || !fits.Valid || !claimed.Valid || !allocs.Valid {
				return win, fmt.Errorf("window: a node row with NULL columns")
			}
			win.NodeIDs = append(win.NodeIDs, node.String)
			if fits.Bool {
				win.Read = append(win.Read, node.String)
			}
			win.Next = WindowKey{Available: int(avail.Int32), Allocations: -int(negAllocs.Int32), Name: name.String}
			names[node.String] = name.String
			win.Topology[node.String] = NodeTopology{GroupSize: map[int]int{}, ClaimedSlots: int(claimed.Int64), Allocations: int(allocs.Int64)}
			continue
		}
		nt, seen := win.Topology[node.String]
		if !seen || !slotID.Valid || !slotIndex.Valid || !numa.Valid || !candidate.Valid {
			return win, fmt.Errorf("window: a slot row for a node the window did not return, or with NULL columns")
		}
		nt.GroupSize[int(numa.Int32)]++
		nt.ApprovedSlots++
		if holder.Valid {
			nt.Occupants = addOccupant(held, nt.Occupants, node.String, holder.String, int(numa.Int32))
		}
		if candidate.Bool {
			win.Candidates = append(win.Candidates, CandidateSlot{NodeID: node.String, NodeName: names[node.String],
				SlotID: slotID.String, SlotIndex: int(slotIndex.Int32), NUMANode: int(numa.Int32)})
		}
		win.Topology[node.String] = nt
	}
	if err := rows.Err(); err != nil {
		return win, translate(err)
	}
	sortOccupants(win.Topology)
	sort.SliceStable(win.Candidates, func(i, j int) bool {
		a, b := win.Candidates[i], win.Candidates[j]
		return a.NodeName < b.NodeName || a.NodeName == b.NodeName && a.SlotIndex < b.SlotIndex
	})
	return win, nil
}

// Blockers counts available slots of the SKU that the policy filters exclude (diagnosis).
type Blockers struct {
	OnDrainingNodes int // otherwise-eligible slots on draining nodes
	FabricPolicy    int // excluded by fabric_claim_mode / VF rules
	StoragePolicy   int // excluded by storage_ownership / wipe policy
	MaxDrainingNode int // most otherwise-eligible slots on one draining node
	// OnSimulatedNodes counts otherwise-eligible slots on simulated nodes that this session
	// may not sell (simulatedOK).
	OnSimulatedNodes int
	// HeldByReservations counts otherwise-eligible slots that capacity reservations hold
	// (for their tenants' creates inside them only).
	HeldByReservations int
}

// SliceBlockers explains why fewer slots than requested are candidates.
func (s *Store) SliceBlockers(ctx context.Context, pq PlacementQuery) (Blockers, error) {
	return sliceBlockers(ctx, s.pool, pq)
}

// SliceBlockers inside a transaction.
func (t *Tx) SliceBlockers(ctx context.Context, pq PlacementQuery) (Blockers, error) {
	return sliceBlockers(ctx, t.tx, pq)
}

func sliceBlockers(ctx context.Context, q querier, pq PlacementQuery) (Blockers, error) {
	var b Blockers
	err := q.QueryRow(ctx, `WITH anyhold AS (SELECT n.id AS node_id, n.draining, `+storageOK+` AS storage_ok, `+fabricOK+` AS fabric_ok,
		          `+simulatedOK+` AS sim_ok, s.reservation_id IS NOT NULL AS held `+sliceBaseAnyHold+`),
		every AS (SELECT * FROM anyhold WHERE NOT held),
		base AS (SELECT * FROM every WHERE sim_ok)
		SELECT count(*) FILTER (WHERE draining AND storage_ok AND fabric_ok),
		       count(*) FILTER (WHERE NOT fabric_ok),
		       count(*) FILTER (WHERE fabric_ok AND NOT storage_ok),
		       coalesce((SELECT max(c) FROM (SELECT count(*) AS c FROM base WHERE draining AND storage_ok AND fabric_ok GROUP BY node_id) x), 0),
		       (SELECT count(*) FROM every WHERE NOT sim_ok AND NOT draining AND storage_ok AND fabric_ok),
		       (SELECT count(*) FROM anyhold WHERE held AND sim_ok AND NOT draining AND storage_ok AND fabric_ok)
		FROM base`, pq.args()...).Scan(&b.OnDrainingNodes, &b.FabricPolicy, &b.StoragePolicy, &b.MaxDrainingNode, &b.OnSimulatedNodes,
		&b.HeldByReservations)
	return b, translate(err)
}

// NodeTopology is what the ranking needs to judge fragmentation on a node.
type NodeTopology struct {
	GroupSize     map[int]int // NUMA node (-1 unknown) -> approved slots
	ApprovedSlots int
	ClaimedSlots  int
	Allocations   int // live allocations holding slot claims on the node
	// Occupants is each of those allocations' slots on the node, as their NUMA nodes (-1
	// unknown), each ascending and the list in slices.Compare order (sched.Node.Occupants).
	Occupants [][]int
}

// sortOccupants puts each node's NodeTopology.Occupants in their order.
func sortOccupants(topo map[string]NodeTopology) {
	for _, nt := range topo {
		for _, o := range nt.Occupants {
			slices.Sort(o)
		}
		slices.SortFunc(nt.Occupants, slices.Compare)
	}
}

// addOccupant adds a slot of NUMA node numa, held by allocation alloc on node, to occ (node's
// NodeTopology.Occupants); held indexes them by node and allocation.
func addOccupant(held map[string]map[string]int, occ [][]int, node, alloc string, numa int) [][]int {
	byAlloc := held[node]
	if byAlloc == nil {
		byAlloc = map[string]int{}
		held[node] = byAlloc
	}
	i, ok := byAlloc[alloc]
	if !ok {
		i = len(occ)
		byAlloc[alloc] = i
		occ = append(occ, nil)
	}
	occ[i] = append(occ[i], numa)
	return occ
}

// NodeTopologies returns approved-slot topology and live slot-claim counts per node.
func (t *Tx) NodeTopologies(ctx context.Context, nodeIDs []string) (map[string]NodeTopology, error) {
	return nodeTopologies(ctx, t.tx, nodeIDs)
}

// NodeTopologies outside a transaction.
func (s *Store) NodeTopologies(ctx context.Context, nodeIDs []string) (map[string]NodeTopology, error) {
	return nodeTopologies(ctx, s.pool, nodeIDs)
}

func nodeTopologies(ctx context.Context, q querier, nodeIDs []string) (map[string]NodeTopology, error) {
	out := make(map[string]NodeTopology, len(nodeIDs))
	for _, id := range nodeIDs {
		out[id] = NodeTopology{GroupSize: map[int]int{}}
	}
	rows, err := q.Query(ctx, topologySQL("$1::uuid[]"), uuidsArg(nodeIDs))
	if err != nil {
		return nil, translate(err)
	}
	return out, scanTopology(rows, out)
}

// topologySQL reads the NodeTopology of the nodes in the uuid array expression nodes in one
// query: approved slots per NUMA group (kind 0), then live slot claims and the allocations
// holding them (kind 1, the count of allocations in the third column), then each live
// allocation's slots per NUMA node (kind 2, the allocation in the last column).
func topologySQL(nodes string) string {
	return `SELECT 0, node_id::text, coalesce(numa_node, -1), count(*), '' FROM node_resource_slots
		WHERE node_id = ANY(` + nodes + `) AND capacity_shape = 'gpu_slice' AND parent_slot_id IS NULL AND status <> 'disabled'
		GROUP BY 2, 3
		UNION ALL
		SELECT 1, node_id::text, count(DISTINCT allocation_id)::int, count(*), '' FROM allocation_resource_claims
		WHERE node_id = ANY(` + nodes + `) AND claim_kind = 'slot' AND status IN ` + liveClaim + ` GROUP BY 2
		UNION ALL
		SELECT 2, c.node_id::text, coalesce(s.numa_node, -1), count(*), c.allocation_id::text
		FROM allocation_resource_claims c JOIN node_resource_slots s ON s.id = c.slot_id
		WHERE c.node_id = ANY(` + nodes + `) AND c.claim_kind = 'slot' AND c.status IN ` + liveClaim + `
		GROUP BY 2, 3, 5`
}

// scanTopology adds topologySQL's rows to out (closing rows).
func scanTopology(rows pgx.Rows, out map[string]NodeTopology) error {
	defer rows.Close()
	held := map[string]map[string]int{}
	for rows.Next() {
		var kind, key, c int // kind 0 and 2: key is the NUMA node; kind 1: the allocations' count
		var id, alloc string
		if err := rows.Scan(&kind, &id, &key, &c, &alloc); err != nil {
			return translate(err)
		}
		nt, ok := out[id]
		if !ok {
			nt = NodeTopology{GroupSize: map[int]int{}}
		}
		switch kind {
		case 0:
			nt.GroupSize[key] += c
			nt.ApprovedSlots += c
		case 1:
			nt.ClaimedSlots, nt.Allocations = c, key
		default:
			for range c {
				nt.Occupants = addOccupant(held, nt.Occupants, id, alloc, key)
			}
		}
		out[id] = nt
	}
	sortOccupants(out)
	return translate(rows.Err())
}

// LockedSlot is a slot locked for reservation, with the device snapshot for its claim.
type LockedSlot struct {
	ID        string
	NodeID    string
	SlotIndex int
	FabricVF  string
	Snapshot  json.RawMessage // the claim's device snapshot, as the database built it
}

// LockAvailableSlots locks n available slots of a node FOR UPDATE SKIP LOCKED, taken from
// alternates (which must include preferred), the preferred ones first, then by slot index, and
// re-checked under the lock to still be available. Fewer than n rows means concurrent
// schedulers hold the rest. Alternates let a request that lost its preferred slots to a
// concurrent one take equivalent slots (the same NUMA groups) instead of failing.
//
// reservation is the capacity reservation whose held slots to take ("" = the fleet's slots,
// held by none).
func (t *Tx) LockAvailableSlots(ctx context.Context, nodeID string, preferred, alternates []string, n int, reservation string) ([]LockedSlot, error) {
	// The snapshot is the slot's current one (slot_device_snapshot, kept by the database),
	// which the claims insert records.
	rows, err := t.tx.Query(ctx, `SELECT s.id::text, s.node_id::text, s.slot_index,
			coalesce(s.capacity_metadata->>'fabric_vf_pci_address', ''), d.snapshot
		FROM node_resource_slots s JOIN slot_device_snapshots d ON d.id = s.device_snapshot_id
		WHERE s.id = ANY($1::uuid[]) AND s.node_id = $2::uuid AND s.status = 'available' AND s.health <> 'quarantined'
		  AND s.reservation_id IS NOT DISTINCT FROM $5::uuid
		ORDER BY s.id = ANY($3::uuid[]) DESC, s.slot_index
		LIMIT $4
		FOR UPDATE OF s SKIP LOCKED`, uuidsArg(alternates), uuidArg(nodeID), uuidsArg(preferred), n, optUUID(reservation))
	if err != nil {
		return nil, translate(err)
	}
	defer rows.Close()
	var out []LockedSlot
	for rows.Next() {
		var l LockedSlot
		if err := rows.Scan(&l.ID, &l.NodeID, &l.SlotIndex, &l.FabricVF, rawJSON(&l.Snapshot)); err != nil {
			return nil, translate(err)
		}
		out = append(out, l)
	}
	return out, translate(rows.Err())
}

// BaremetalCandidate is a whole node eligible for a baremetal allocation.
type BaremetalCandidate struct {
	NodeID        string
	NodeName      string
	ApprovedSlots int
}

const baremetalFilter = `
	FROM nodes n
	WHERE n.status = 'active' AND NOT n.draining AND ` + simulatedOK + `
	  AND ($2 = '' OR n.region = $2)
	  AND (n.tenant_id IS NULL OR n.tenant_id::text = $3)
	  AND ($4::float8 = 0 OR n.last_heartbeat_at > now() - make_interval(secs => $4::float8))
	  AND n.sku = $1
	  AND NOT EXISTS (SELECT 1 FROM allocation_resource_claims c WHERE c.node_id = n.id AND c.status IN ` + liveClaim + `)
	  -- slices mid-release, a disk without wipe proof, a quarantined slot, or a slot a capacity
	  -- reservation holds block the whole node for baremetal
	  AND NOT EXISTS (SELECT 1 FROM node_resource_slots s WHERE s.node_id = n.id
	                  AND (s.status IN ('reserved', 'provisioning', 'active', 'releasing', 'cleanup', 'cleanup_blocked', 'failed')
	                       OR s.health = 'quarantined' OR s.reservation_id IS NOT NULL))`

// BaremetalCandidates lists whole nodes a baremetal request could take.
func (t *Tx) BaremetalCandidates(ctx context.Context, pq PlacementQuery) ([]BaremetalCandidate, error) {
	return baremetalCandidates(ctx, t.tx, pq)
}

// BaremetalCandidates outside a transaction.
func (s *Store) BaremetalCandidates(ctx context.Context, pq PlacementQuery) ([]BaremetalCandidate, error) {
	return baremetalCandidates(ctx, s.pool, pq)
}

func baremetalCandidates(ctx context.Context, q querier, pq PlacementQuery) ([]BaremetalCandidate, error) {
	return queryAll(ctx, q, func(r pgx.Row, c *BaremetalCandidate) error {
		return r.Scan(&c.NodeID, &c.NodeName, &c.ApprovedSlots)
	}, `SELECT n.id::text, n.name,
			(SELECT count(*) FROM node_resource_slots s WHERE s.node_id = n.id AND s.status <> 'disabled') `+
		baremetalFilter+` ORDER BY n.name`, pq.args()...)
}

// BaremetalDraining counts nodes that would be eligible but are draining.
func (t *Tx) BaremetalDraining(ctx context.Context, pq PlacementQuery) (int, error) {
	var n int
	err := t.tx.QueryRow(ctx, `SELECT count(*) FROM nodes n WHERE n.draining AND n.status = 'active' AND n.sku = $1
		AND ($2 = '' OR n.region = $2) AND (n.tenant_id IS NULL OR n.tenant_id::text = $3)
		AND ($4::float8 = 0 OR n.last_heartbeat_at > now() - make_interval(secs => $4::float8))`, pq.args()...).Scan(&n)
	return n, translate(err)
}

// LockNodeForBaremetal locks a node row (SKIP LOCKED) and re-checks the baremetal filter under the lock.
func (t *Tx) LockNodeForBaremetal(ctx context.Context, pq PlacementQuery, nodeID string) (bool, error) {
	var id string
	args := append(pq.args(), uuidArg(nodeID))
	err := t.tx.QueryRow(ctx, `SELECT n.id::text `+baremetalFilter+` AND n.id = $5::uuid FOR UPDATE OF n SKIP LOCKED`, args...).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, translate(err)
	}
	return true, nil
}

// Savepoint runs fn in a nested transaction (SAVEPOINT) so one failed attempt can be
// rolled back without losing the outer transaction.
func (t *Tx) Savepoint(ctx context.Context, fn func(*Tx) error) error {
	sp, err := t.tx.savepoint(ctx)
	if err != nil {
		return translate(err)
	}
	if err := fn(&Tx{tx: sp}); err != nil {
		_ = sp.rollback(ctx)
		return err
	}
	return translate(sp.commit(ctx))
}

// NewAllocation is the row written at reservation.
type NewAllocation struct {
	TenantID        string
	SKU             string
	CapacityShape   string
	GPUs            int
	Region          string
	NodeID          string
	ProfileName     string
	ResolvedProfile any
	OSImageID       string
	ImageSnapshot   any
	PriceSnapshot   any
	UsageSnapshot   any
	SSHPublicKeys   []string
	IdempotencyKey  string
	RequestHash     string
	// Audit, when set, is written with the allocation (its TargetID becomes the new id).
	Audit *AuditRecord
	// ID, when set, is the new allocation's id (made here otherwise).
	ID string
	// ReservationID, when set, is the capacity reservation the allocation is placed in.
	ReservationID string
	// Task, when set, is the allocation's provisioning task, queued in the same round trip:
	// its allocation.requested outbox event is written already dispatched and linked to it,
	// so nothing waits for the outbox worker between commit and the host.
	Task *NewTask
	// Commit commits the transaction in the insert's own round trip: set it only when the
	// insert is the transaction's last statement (a statement after it fails).
	Commit bool
}

// NewClaim is one claim row.
type NewClaim struct {
	Kind     string
	NodeID   string
	SlotID   string
	FabricVF string
	Snapshot json.RawMessage // a claim without a slot: its resource snapshot ("{}" when empty); a slot claim records its slot's stored one
}

// allocationInsertSQL writes an allocation and, in the same statement, its snapshot row: its
// terms (the resolved profile, image and price snapshots, stored once per distinct content),
// usage snapshot and SSH keys, which no status change rewrites (migration 035). The
// allocation's own columns for them stay at their defaults once no controller of the previous
// release reads them (allocation_snapshots_apart); until then they carry the same content.
// The snapshot row's foreign key is checked at the end of the statement, when the allocation
// row is in. Known terms are found by their digest here, and allocation_terms_id is called only
// for new ones; the switch is read here too (allocation_snapshots_apart() is a SQL function
// with a subquery, which PostgreSQL cannot inline and plans again at every execution:
// 0.03-0.1 ms, EXPLAIN ANALYZE).
const allocationInsertSQL = `WITH x AS (
		INSERT INTO allocation_snapshots (allocation_id, terms_id, usage_snapshot, ssh_public_keys)
		VALUES ($16, coalesce((SELECT id FROM allocation_terms WHERE digest = allocation_terms_digest($8, $10, $11)),
			allocation_terms_id($8, $10, $11)), $12, $13)),
	sw AS (SELECT coalesce((SELECT enabled FROM schema_switches WHERE name = 'allocation_snapshots_apart'), false) AS apart)
	INSERT INTO allocations (id, tenant_id, sku, capacity_shape, gpus_total, region, node_id,
		profile_name, resolved_profile, os_image_id, image_snapshot, price_snapshot, usage_snapshot,
		ssh_public_keys, idempotency_key, request_hash, created_at, updated_at, reservation_id)
	SELECT $16::uuid, $1::uuid, $2::text, $3::text, $4::int, coalesce(nullif($5::text, ''), (SELECT region FROM nodes WHERE id = $6::uuid)), $6::uuid, $7::text,
		CASE WHEN sw.apart THEN '{}' ELSE $8::jsonb END, $9::uuid, CASE WHEN sw.apart THEN '{}' ELSE $10::jsonb END,
		CASE WHEN sw.apart THEN '{}' ELSE $11::jsonb END, CASE WHEN sw.apart THEN '{}' ELSE $12::jsonb END,
		CASE WHEN sw.apart THEN '{}' ELSE $13::text[] END, $14::text, $15::text,
		clock_timestamp(), clock_timestamp(), $17::uuid
	FROM sw`

// InsertAllocation writes the allocation, its claims, marks claimed slots reserved and
// queues the outbox event, all in the caller's transaction.
func (t *Tx) InsertAllocation(ctx context.Context, a NewAllocation, claims []NewClaim) (string, error) {
	rec, _, err := t.InsertAllocationRecord(ctx, a, claims)
	return rec.ID, err
}

// InsertAllocationRecord is InsertAllocation returning the allocation as written, and its
// queued task when a.Task was set, read back in the same round trip.
func (t *Tx) InsertAllocationRecord(ctx context.Context, a NewAllocation, claims []NewClaim) (AllocationRecord, []TaskRecord, error) {
	js := func(v any) []byte {
		if v == nil {
			return []byte("{}")
		}
		b, _ := json.Marshal(v)
		return b
	}
	if a.SSHPublicKeys == nil {
		a.SSHPublicKeys = []string{}
	}
	// One round trip: the id is made here so the claims, outbox event and audit record can
	// ride in the same batch as the allocation row. created_at is the insert's own time (the
	// end of placement, just before commit), not the transaction's start.
	id := a.ID
	if id == "" {
		id = NewID()
	}
	batch := &pgx.Batch{}
	batch.Queue(`SAVEPOINT gpuaas_insert`)
	batch.Queue(allocationInsertSQL+` RETURNING `+insertedAllocColumns,
		a.TenantID, a.SKU, a.CapacityShape, a.GPUs, a.Region, a.NodeID, a.ProfileName, js(a.ResolvedProfile),
		nullIfEmpty(a.OSImageID), js(a.ImageSnapshot), js(a.PriceSnapshot), js(a.UsageSnapshot), a.SSHPublicKeys,
		nullIfEmpty(a.IdempotencyKey), a.RequestHash, id, optUUID(a.ReservationID))
	slotIDs := queueClaims(batch, id, claims)
	event := js(map[string]any{"allocation_id": id, "capacity_shape": a.CapacityShape, "slot_ids": slotIDs})
	if a.Task == nil {
		batch.Queue(`INSERT INTO outbox (topic, aggregate_id, node_id, payload) VALUES ('allocation.requested', $1, $2, $3)`,
			id, a.NodeID, event)
	} else {
		payload, err := json.Marshal(a.Task.Payload)
		if err != nil {
			return AllocationRecord{}, nil, fmt.Errorf("task payload: %w", err)
		}
		batch.Queue(`WITH ev AS (
				INSERT INTO outbox (topic, aggregate_id, node_id, payload, dispatched_at)
				VALUES ('allocation.requested', $1, $2, $3, now()) RETURNING id)
			INSERT INTO node_tasks (node_id, allocation_id, type, payload, not_after, outbox_id)
			SELECT $2, $1, $4, $5, now() + make_interval(secs => $6::float8), ev.id FROM ev
			RETURNING `+allocTaskColumns,
			id, a.NodeID, event, a.Task.Type, payload, a.Task.TTL.Seconds())
	}
	if a.Audit != nil {
		r := *a.Audit
		r.TargetID = id
		if err := queueAudit(batch, r); err != nil {
			return AllocationRecord{}, nil, err
		}
	}
	batch.Queue(`RELEASE SAVEPOINT gpuaas_insert`)
	rec, tasks, err := t.sendInsert(ctx, batch, a.Task != nil, a.Commit)
	if err != nil {
		if t.tx.committed { // the COMMIT itself failed: the transaction is gone
			return AllocationRecord{}, nil, err
		}
		// Undo this attempt only: the caller's transaction stays usable (next choice).
		if _, rerr := t.tx.Exec(ctx, `ROLLBACK TO SAVEPOINT gpuaas_insert`); rerr != nil {
			return AllocationRecord{}, nil, errors.Join(err, translate(rerr))
		}
		return AllocationRecord{}, nil, err
	}
	return rec, tasks, nil
}

// claimsInsertSQL writes an allocation's claims and reserves their slots in one statement
// (one execution instead of one per claim plus the slot update), and returns the claims as
// claimsSQL reads them (the rows it wrote, so the create's answer reads no claim back). The
// claims trigger still checks each row (node exclusion, slot on node) and the slots trigger
// each transition; a slot that is not available fails the whole statement. A slot claim
// records its devices as its slot's current snapshot (the slot is locked, so it is the one
// LockAvailableSlots read), and no copy once no controller of the previous release reads
// claims (claims_snapshot_by_reference, migration 034): the claim's row stays small for its
// insert and its status changes. The switch is read by a subquery planned with the statement,
// not by claims_snapshot_by_reference(), a SQL function PostgreSQL cannot inline (its body
// holds a subquery) and plans again at every execution.
const claimsInsertSQL = `WITH c AS (
	INSERT INTO allocation_resource_claims (allocation_id, node_id, slot_id, claim_kind, fabric_vf_pci_address,
		resource_snapshot, device_snapshot_id)
	SELECT $1, u.node_id::uuid, nullif(u.slot_id, '')::uuid, u.kind, u.vf,
		CASE WHEN s.device_snapshot_id IS NOT NULL
			AND coalesce((SELECT enabled FROM schema_switches WHERE name = 'claims_snapshot_by_reference'), false)
			THEN '{}' ELSE u.snapshot END,
		s.device_snapshot_id
	FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::jsonb[]) AS u(node_id, slot_id, kind, vf, snapshot)
	LEFT JOIN node_resource_slots s ON s.id = nullif(u.slot_id, '')::uuid
	RETURNING *),
reserved AS ( -- data-modifying CTEs always run to completion, read or not
	UPDATE node_resource_slots SET status = 'reserved', status_reason = ''
	WHERE id IN (SELECT slot_id FROM c WHERE slot_id IS NOT NULL))
SELECT ` + claimColumns + ` FROM c LEFT JOIN slot_device_snapshots d ON d.id = c.device_snapshot_id
ORDER BY (` + claimSnapshot + `->>'slot_index')::int NULLS FIRST, c.id`

// queueClaims queues claimsInsertSQL for claims and returns the claimed slot ids.
func queueClaims(batch *pgx.Batch, allocID string, claims []NewClaim) []string {
	var nodes, slots, kinds, vfs, slotIDs []string
	snaps := make([][]byte, 0, len(claims))
	for _, c := range claims {
		snap := []byte(c.Snapshot)
		if len(snap) == 0 {
			snap = []byte("{}")
		}
		nodes, slots, kinds, vfs = append(nodes, uuidArg(c.NodeID)), append(slots, c.SlotID), append(kinds, c.Kind), append(vfs, c.FabricVF)
		snaps = append(snaps, snap)
		if c.SlotID != "" {
			slotIDs = append(slotIDs, c.SlotID)
		}
	}
	for i, s := range slots {
		if s != "" {
			slots[i] = uuidArg(s)
		}
	}
	batch.Queue(claimsInsertSQL, allocID, nodes, slots, kinds, vfs, snaps)
	return slotIDs
}

// sendInsert sends InsertAllocationRecord's batch (SAVEPOINT; the allocation insert, which
// returns the row as allocColumns reads it; the claims insert, which returns the claims as
// claimsSQL reads them; the outbox event or, withTask, the event and the task, which returns
// the task as allocTasksSQL reads it; then whatever else was queued) and returns what the
// inserts returned: the allocation as a read right after the commit gives it, without reading
// it again. With commit the batch also commits the transaction (see endBatch).
func (t *Tx) sendInsert(ctx context.Context, batch *pgx.Batch, withTask, commit bool) (AllocationRecord, []TaskRecord, error) {
	queued := batch.Len()
	committing := commit && t.tx.queueCommit(batch)
	br := t.tx.SendBatch(ctx, batch)
	defer br.Close()
	var rec AllocationRecord
	if _, err := br.Exec(); err != nil { // SAVEPOINT
		return rec, nil, translate(err)
	}
	if err := scanAlloc(br.QueryRow(), &rec); err != nil {
		return rec, nil, translate(err)
	}
	rows, err := br.Query()
	if err != nil {
		return rec, nil, translate(err)
	}
	if rec.Claims, err = scanClaims(rows); err != nil {
		return rec, nil, err
	}
	var tasks []TaskRecord
	if withTask {
		tasks, err = readTasks(br)
	} else {
		_, err = br.Exec()
	}
	if err != nil {
		return rec, nil, translate(err)
	}
	if err := t.endBatch(br, 4, queued, committing); err != nil {
		return AllocationRecord{}, nil, err
	}
	return rec, tasks, nil
}

// endBatch reads the rest of a batch whose first read statements have been read, and reports
// its outcome. When committing (txConn.queueCommit queued a COMMIT behind the queued
// statements) the outcome is COMMIT's own answer (commitOutcome): the caller's last statement,
// nothing may run in the transaction after.
func (t *Tx) endBatch(br pgx.BatchResults, read, queued int, committing bool) error {
	if !committing {
		return translate(br.Close())
	}
	for ; read < queued; read++ {
		if _, err := br.Exec(); err != nil {
			return translate(err)
		}
	}
	tag, err := br.Exec() // COMMIT: it ran, so the transaction is over whatever it answered
	t.tx.committedBy()
	return commitOutcome(tag, err, br.Close())
}

// commitOutcome is the outcome of a batch whose last statement was COMMIT, from COMMIT's own
// answer (tag, err) and what closing the batch reported after it (the third argument, which it
// never returns). Once COMMIT has answered COMMIT the transaction is durable: a PostgreSQL
// fast shutdown terminating the backend right after it (its FATAL arrives behind the COMMIT's
// answer, before the batch's end) must not turn a write that happened into a reported failure:
// the client would be told to retry a create that exists (TestPostgresRestartUnderLoad caught
// one). Without COMMIT's answer the outcome is unknown, and the error says so as any lost
// connection does.
func commitOutcome(tag pgconn.CommandTag, err, _ error) error {
	if err != nil {
		return translate(err)
	}
	if tag.String() != "COMMIT" { // e.g. ROLLBACK: the transaction had failed
		return fmt.Errorf("store: the transaction did not commit (COMMIT answered %q)", tag.String())
	}
	return nil // after a durable commit nothing closing the batch says can undo the write
}

// AllocationByIdempotencyKey finds an earlier allocation created with the same key.
func (t *Tx) AllocationByIdempotencyKey(ctx context.Context, tenantID, key string) (id, requestHash string, err error) {
	err = t.tx.QueryRow(ctx, `SELECT id::text, request_hash FROM allocations WHERE tenant_id = $1 AND idempotency_key = $2`,
		tenantID, key).Scan(&id, &requestHash)
	return id, requestHash, translate(err)
}

// Replace moves a provisioning allocation to a new placement: new claims (their slots
// reserved), node and usage snapshot updated, status back to requested, and a new
// allocation.requested event. The caller has released the old claims. The new usage snapshot
// goes into the allocation's own column, which readers take over its snapshot row's (a
// snapshot row is never changed).
func (t *Tx) Replace(ctx context.Context, allocID, nodeID string, usage any, claims []NewClaim) error {
	b, _ := json.Marshal(usage)
	if _, err := t.tx.Exec(ctx, `UPDATE allocations SET status = 'requested', node_id = $2, usage_snapshot = $3 WHERE id = $1`,
		allocID, nodeID, b); err != nil {
		return translate(err)
	}
	batch := &pgx.Batch{}
	slotIDs := queueClaims(batch, allocID, claims)
	payload, _ := json.Marshal(map[string]any{"allocation_id": allocID, "capacity_shape": "gpu_slice", "slot_ids": slotIDs, "replacement": true})
	batch.Queue(`INSERT INTO outbox (topic, aggregate_id, node_id, payload) VALUES ('allocation.requested', $1, $2, $3)`, allocID, nodeID, payload)
	return translate(t.tx.SendBatch(ctx, batch).Close())
}
