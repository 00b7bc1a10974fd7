package alloc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/demand"
	"github.com/gpuaas/gpuaas/internal/sched"
	"github.com/gpuaas/gpuaas/internal/store"
)

// Config tunes the service.
type Config struct {
	// HeartbeatMaxAge excludes nodes whose agent has been silent longer; 0 disables the check.
	HeartbeatMaxAge time.Duration
	// MaxAttempts bounds how many ranked choices a reservation tries when it loses lock races.
	MaxAttempts int
	Now         func() time.Time
	// AllowSimulated says this controller sells simulated hosts (--allow-simulated-hosts); the
	// database is what enforces it (store.Options.AllowSimulated), this only explains it.
	AllowSimulated bool
}

// Service runs placement and lifecycle transitions.
type Service struct {
	st       *store.Store
	cfg      Config
	planner  TaskPlanner
	inflight inFlight
	// windows and fleetScans count how slice reservations read the fleet (placeSlice).
	windows, fleetScans atomic.Uint64
	// lanes numbers this replica's creates under way (lanes.go).
	lanes lanes
	// demand is the learned demand mix (demandmix.go).
	demand *demand.Learner
}

// PlacementStats counts how slice reservations have read the fleet since the service started:
// best-fit windows, and whole-fleet rankings (every candidate slot, after the windows settled
// nothing: no capacity, capacity only in spans, or SKU overrides on slots). Fleet scans
// growing with reservations mean placement is paying for the fleet's size.
type PlacementStats struct {
	Windows    uint64
	FleetScans uint64
}

// Stats returns the placement counters.
func (s *Service) Stats() PlacementStats {
	return PlacementStats{Windows: s.windows.Load(), FleetScans: s.fleetScans.Load()}
}

// TaskPlanner lets the create transaction queue a slice's provisioning task itself, so no
// outbox hop sits between the commit and the host: the dispatcher builds the task from the
// plan being written, and is told after the commit which node's polls to wake.
type TaskPlanner interface {
	ProvisionTask(plan store.DispatchInfo) (*store.NewTask, error)
	TaskQueued(nodeID string)
}

// SetTaskPlanner installs the planner (before the service is used). Without one, provisioning
// tasks are made from the allocation.requested outbox event.
func (s *Service) SetTaskPlanner(p TaskPlanner) { s.planner = p }

// New returns a Service.
func New(st *store.Store, cfg Config) *Service {
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 32
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	// A learner that counts in memory and serves the default mix until something runs it
	// (the controller installs its own, run and flushed: SetDemand).
	return &Service{st: st, cfg: cfg, demand: demand.New(st, demand.Config{Now: cfg.Now})}
}

// Actor is who asks.
type Actor struct {
	TokenID   string
	Name      string
	Role      string // admin | tenant
	TenantID  string
	RequestID string
}

func (a Actor) isAdmin() bool { return a.Role == "admin" }

func (a Actor) audit(action, kind, id string, details any) store.AuditRecord {
	return store.AuditRecord{Actor: a.Name + " (" + a.TokenID + ")", ActorRole: a.Role, TenantID: a.TenantID,
		Action: action, TargetKind: kind, TargetID: id, RequestID: a.RequestID, Details: details}
}

func invalid(format string, args ...any) *apiv1.Error {
	return &apiv1.Error{Code: apiv1.CodeInvalidRequest, Message: fmt.Sprintf(format, args...)}
}

func unavailable(reason, msg string, details map[string]any) *apiv1.Error {
	if details == nil {
		details = map[string]any{}
	}
	details["reason"] = reason
	return &apiv1.Error{Code: apiv1.CodeSKUUnavailable, Message: msg, Details: details}
}

// request is a validated placement request.
type request struct {
	sku    apiv1.SKU
	gpus   int
	region string
	tenant string
	policy sched.Policy
	// emptySkip is store.WindowRequest.EmptySkip for its windows (the create's lane: emptySkip).
	emptySkip int
	// reservation is the capacity reservation to place inside ("" = the fleet).
	reservation string
	// mix is the demand mix the ranking protects (mixFor; nil: sched.DefaultMix).
	mix []sched.MixEntry
}

func (s *Service) query(r request) store.PlacementQuery {
	return store.PlacementQuery{SKU: r.sku.SKU, Region: r.region, TenantID: r.tenant, HeartbeatMaxAge: s.cfg.HeartbeatMaxAge}
}

// validate checks the SKU and count (count_not_allowed is a sku_unavailable reason, per seed 000).
func validateRequest(sku apiv1.SKU, gpus int) error {
	if gpus <= 0 {
		return invalid("gpus must be a positive integer")
	}
	if !sku.Active {
		return unavailable(apiv1.ReasonSKUInactive, fmt.Sprintf("SKU %s is not active", sku.SKU), nil)
	}
	if !slices.Contains(sku.AllowedGPUCounts, gpus) {
		return unavailable(apiv1.ReasonCountNotAllowed,
			fmt.Sprintf("SKU %s allows %v GPUs, not %d", sku.SKU, sku.AllowedGPUCounts, gpus),
			map[string]any{"allowed_gpu_counts": sku.AllowedGPUCounts, "requested": gpus})
	}
	return nil
}

func policyFor(sku apiv1.SKU, gpus int) sched.Policy {
	rp, err := parseResourceProfile(sku.ResourceProfile)
	if err == nil {
		if p, ok := rp.TopologyPolicy[strconv.Itoa(gpus)]; ok {
			return sched.Policy(p)
		}
	}
	return sched.DefaultPolicy(gpus)
}

// buildNodes groups candidate slots by node and adds each node's topology.
func buildNodes(cands []store.CandidateSlot, topo map[string]store.NodeTopology) []sched.Node {
	var nodes []sched.Node
	idx := map[string]int{}
	for _, c := range cands {
		i, ok := idx[c.NodeID]
		if !ok {
			t := topo[c.NodeID]
			nodes = append(nodes, sched.Node{ID: c.NodeID, Name: c.NodeName, GroupSize: t.GroupSize,
				ApprovedSlots: t.ApprovedSlots, ClaimedSlots: t.ClaimedSlots, Allocations: t.Allocations, Occupants: occupants(t.Occupants)})
			i = len(nodes) - 1
			idx[c.NodeID] = i
		}
		nodes[i].FreeSlots = append(nodes[i].FreeSlots, sched.Slot{ID: c.SlotID, SlotIndex: c.SlotIndex, NUMANode: c.NUMANode})
	}
	return nodes
}

// occupants is a node's live allocations as the ranking's look-ahead takes them.
func occupants(held [][]int) []sched.Occupant {
	if len(held) == 0 {
		return nil
	}
	out := make([]sched.Occupant, len(held))
	for i, numa := range held {
		out[i] = sched.Occupant{NUMANodes: numa}
	}
	return out
}

func nodeIDs(cands []store.CandidateSlot) []string {
	var ids []string
	seen := map[string]bool{}
	for _, c := range cands {
		if !seen[c.NodeID] {
			seen[c.NodeID] = true
			ids = append(ids, c.NodeID)
		}
	}
	return ids
}

// diagnose turns an empty slice outcome into sku_unavailable with the most useful reason.
func (s *Service) diagnose(r request, out sched.Outcome, blockers func() (store.Blockers, error)) error {
	details := map[string]any{"requested_gpus": r.gpus, "free_slots": out.FreeSlots,
		"max_node_free": out.MaxNodeFree, "max_group_free": out.MaxGroupFree}
	if out.Reason == "topology_fragmented" {
		return unavailable(apiv1.ReasonTopologyFragmented, out.Message, details)
	}
	b, err := blockers()
	if err != nil {
		return err
	}
	details["blocked_by_fabric_policy"] = b.FabricPolicy
	details["blocked_by_storage_policy"] = b.StoragePolicy
	details["on_draining_nodes"] = b.OnDrainingNodes
	details["on_simulated_nodes"] = b.OnSimulatedNodes
	details["held_by_reservations"] = b.HeldByReservations
	switch {
	case b.OnSimulatedNodes > 0 && out.FreeSlots+b.OnSimulatedNodes >= r.gpus:
		return unavailable(apiv1.ReasonSimulatedHosts, fmt.Sprintf(
			"%d free slots of %s are on simulated hosts (no real VM, no real disk wipe), which this controller does not sell",
			b.OnSimulatedNodes, r.sku.SKU), details)
	case b.FabricPolicy > 0 && out.FreeSlots+b.FabricPolicy >= r.gpus:
		return unavailable(apiv1.ReasonFabricPolicyBlocked, fmt.Sprintf(
			"%d free slots of %s are excluded by fabric policy (need fabric_claim_mode=per_slot_vf and a unique fabric VF each)",
			b.FabricPolicy, r.sku.SKU), details)
	case b.MaxDrainingNode > 0 && out.FreeSlots+b.OnDrainingNodes >= r.gpus:
		return unavailable(apiv1.ReasonNodeDraining, fmt.Sprintf(
			"%d free slots are on draining nodes, which take no new placements", b.OnDrainingNodes), details)
	}
	msg := fmt.Sprintf("no capacity for %d GPUs of %s", r.gpus, r.sku.SKU)
	if r.region != "" {
		msg += " in region " + r.region
	}
	if out.FreeSlots > 0 {
		msg += fmt.Sprintf(" (%d schedulable slots free)", out.FreeSlots)
	}
	if b.HeldByReservations > 0 {
		msg += fmt.Sprintf("; %d free slots are held by capacity reservations, for creates inside them", b.HeldByReservations)
	}
	return unavailable(apiv1.ReasonNoCapacity, msg, details)
}

func (s *Service) resolveRequest(ctx context.Context, tx *store.Tx, actor Actor, skuName string, gpus int, region string) (request, error) {
	if skuName == "" {
		return request{}, invalid("sku is required")
	}
	var sku apiv1.SKU
	var err error
	if tx != nil {
		sku, err = tx.GetSKU(ctx, skuName)
	} else {
		sku, err = s.st.GetSKU(ctx, skuName)
	}
	r, err := requestFor(actor, skuName, sku, err, gpus, region)
	if err == nil {
		r.mix = s.mixFor(r)
	}
	return r, err
}

// requestFor validates a request against its SKU, as read (err: the read's outcome).
func requestFor(actor Actor, skuName string, sku apiv1.SKU, err error, gpus int, region string) (request, error) {
	if errors.Is(err, store.ErrNotFound) {
		return request{}, &apiv1.Error{Code: apiv1.CodeNotFound, Message: fmt.Sprintf("unknown SKU %q", skuName)}
	}
	if err != nil {
		return request{}, err
	}
	if err := validateRequest(sku, gpus); err != nil {
		return request{}, err
	}
	return request{sku: sku, gpus: gpus, region: region, tenant: actor.TenantID, policy: policyFor(sku, gpus)}, nil
}

func requestHash(req apiv1.AllocationCreate) string {
	b, _ := json.Marshal(req)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Create places and reserves an allocation in one transaction. replayed is true when the
// idempotency key matched an earlier identical request, whose allocation is returned.
func (s *Service) Create(ctx context.Context, actor Actor, req apiv1.AllocationCreate, idemKey string) (out apiv1.Allocation, replayed bool, err error) {
	if actor.isAdmin() {
		if req.TenantID == "" {
			return out, false, invalid("admins must name tenant_id when creating an allocation")
		}
		actor.TenantID = req.TenantID
	} else {
		if req.TenantID != "" && req.TenantID != actor.TenantID {
			return out, false, &apiv1.Error{Code: apiv1.CodeForbidden, Message: "tenants create allocations only for themselves"}
		}
		if req.Profile != "" {
			return out, false, &apiv1.Error{Code: apiv1.CodeForbidden, Message: "profile overrides are admin-only"}
		}
		req.TenantID = actor.TenantID
	}
	if len(idemKey) > 128 {
		return out, false, invalid("Idempotency-Key is longer than 128 characters")
	}
	if err := validateSSHKeys(req.SSHPublicKeys); err != nil {
		return out, false, err
	}
	if req.ReservationID != "" && !store.IsUUID(req.ReservationID) {
		return out, false, invalid("reservation_id %q is not a reservation id", req.ReservationID)
	}
	if req.SKU == "" && req.ReservationID == "" {
		return out, false, invalid("sku is required")
	}
	// The create's lane (lanes.go), taken once it holds a connection: creates waiting for
	// one are not ranking windows, and would only push those that are to higher lanes.
	lane := -1
	defer func() {
		if lane >= 0 {
			s.lanes.give(lane)
		}
	}()
	hash := requestHash(req)
	var allocID string
	var written store.AllocationRecord
	var writtenTasks []store.TaskRecord
	var held txSlots   // what this request's transaction has locked and reserved (s.inflight)
	var asked *request // the request as validated, for the demand learner (countDemand)
	committed := false
	defer func() {
		if committed {
			s.inflight.committed(held.locked, held.reserved, time.Now())
		} else {
			s.inflight.release(held.locked)
		}
	}()
	err = s.st.InTx(ctx, func(tx *store.Tx) error {
		if lane < 0 {
			lane = s.lanes.take()
		}
		if idemKey != "" {
			id, h, err := tx.AllocationByIdempotencyKey(ctx, actor.TenantID, idemKey)
			switch {
			case err == nil && h == hash:
				allocID, replayed = id, true
				return nil
			case err == nil:
				return &apiv1.Error{Code: apiv1.CodeIdempotencyReused,
					Message: "Idempotency-Key was already used with a different request", Details: map[string]any{"allocation_id": id}}
			case !errors.Is(err, store.ErrNotFound):
				return err
			}
		}
		// The SKU, the slice image it would boot and the first placement window, in one
		// round trip (the window's arguments are the request's; a window read for a request
		// that turns out invalid or baremetal is discarded). The SKU's topology policy is not
		// known yet: the window assumes the default one for the count, and is read again in
		// the rare SKU whose policy needs a different group (placeSlice).
		var first *store.WindowRequest
		if req.ReservationID != "" {
			if err := reservationRequest(ctx, tx, actor, &req); err != nil {
				return err
			}
		} else if req.GPUs > 0 && req.GPUs <= math.MaxInt32 { // else invalid: an argument PostgreSQL cannot take would abort the batch
			w := firstWindow(s.query(request{sku: apiv1.SKU{SKU: req.SKU}, region: req.Region, tenant: actor.TenantID}),
				req.GPUs, sched.WindowGroup(sched.Request{GPUs: req.GPUs}), emptySkip(lane))
			first = &w
		}
		look, err := tx.SKUWithSliceImage(ctx, req.SKU, req.Image, first)
		r, err := requestFor(actor, req.SKU, look.SKU, err, req.GPUs, req.Region)
		if err != nil {
			return err
		}
		r.emptySkip = emptySkip(lane)
		r.reservation = req.ReservationID
		r.mix = s.mixFor(r)
		asked = &r
		allocID, err = s.reserve(ctx, tx, actor, r, req, look, idemKey, hash, &written, &writtenTasks, &held)
		return err
	})
	committed = err == nil
	// Two requests racing with one idempotency key: the loser replays the winner.
	if err != nil && idemKey != "" && isIdempotencyConflict(err) {
		return s.Create(ctx, actor, req, idemKey)
	}
	s.countDemand(asked, replayed, err)
	if err != nil {
		var dbe *store.DBError
		if errors.As(err, &dbe) && dbe.Constraint == "allocations_tenant_id_fkey" {
			return out, false, invalid("unknown tenant %s", actor.TenantID)
		}
		return out, false, quotaError(err)
	}
	if !replayed && written.ID == allocID {
		// Just written and committed, with its task: what Get would read, without reading it.
		if len(writtenTasks) > 0 {
			s.planner.TaskQueued(written.NodeID)
		}
		return withTasks(s.present(actor, written), writtenTasks), false, nil
	}
	out, err = s.Get(ctx, actor, allocID)
	return out, replayed, err
}

// reserve places and writes the allocation (look: the SKU lookup, with the slice image as
// resolved and the first window as read); it also fills written (and for a slice
// writtenTasks) with the allocation and its provisioning task as written (so Create answers
// without reading them again).
func (s *Service) reserve(ctx context.Context, tx *store.Tx, actor Actor, r request, req apiv1.AllocationCreate, look store.CreateLookup,
	idemKey, hash string, written *store.AllocationRecord, writtenTasks *[]store.TaskRecord, held *txSlots) (string, error) {
	img, imgErr := look.Image, look.ImageErr
	profile, err := ResolveProfile(r.sku, r.gpus, req.Profile)
	if err != nil {
		return "", invalid("%v", err)
	}
	price := apiv1.Price{GPUHourlyPriceMinor: r.sku.GPUHourlyPriceMinor, Currency: r.sku.Currency, GPUs: r.gpus, CapacityShape: r.sku.CapacityShape}
	na := store.NewAllocation{TenantID: actor.TenantID, SKU: r.sku.SKU, CapacityShape: r.sku.CapacityShape, GPUs: r.gpus,
		Region: r.region, ProfileName: profile.Name, ResolvedProfile: profile, PriceSnapshot: price,
		SSHPublicKeys: req.SSHPublicKeys, IdempotencyKey: idemKey, RequestHash: hash, ReservationID: r.reservation}
	if r.sku.CapacityShape == "baremetal" {
		if req.Image != "" {
			return "", invalid("baremetal images are MAAS deploy images chosen at deploy time; --image applies to slices")
		}
		return s.reserveBaremetal(ctx, tx, actor, r, na, written)
	}
	// A slice's insert is its transaction's last statement (Create commits right after
	// reserve returns): it carries the COMMIT, saving a round trip.
	na.Commit = true
	if errors.Is(imgErr, store.ErrNotFound) {
		msg := "no active vm_slice image with a digest is compatible with " + r.sku.SKU
		if req.Image != "" {
			msg = fmt.Sprintf("image %q is not an active, digest-pinned vm_slice image compatible with %s", req.Image, r.sku.SKU)
		}
		return "", unavailable(apiv1.ReasonNoImage, msg, nil)
	}
	if imgErr != nil {
		return "", imgErr
	}
	na.OSImageID, na.ImageSnapshot = img.ID, img
	// A canary rollout in progress gives the nodes it includes its image instead (read with
	// the SKU; a later round's fresh lookup does not carry it, so it is kept here).
	canary := look.Canary
	if s.planner != nil {
		na.ID = store.NewID()
	}

	var id string
	attempts, lost := 0, 0
	try := func(out sched.Outcome, cands []store.CandidateSlot, since time.Time, final bool) (bool, error) {
		// The best choice first; after a lost race the rest of its tier in random order, so
		// concurrent requests scatter instead of convoying down the same list. Choices that
		// need slots another request of this replica has locked go last (s.inflight).
		for _, ch := range s.inflight.order(sched.SpreadTies(out.Choices, rand.IntN), cands, since) {
			// The slots to lock, held here first so this replica's concurrent requests leave
			// them alone; given back once the lock's outcome is known. When this replica's
			// other requests hold too many of them, a lock would lose (or take what another
			// request has just claimed, which then loses): the next choice, no round trip.
			// Only the whole fleet's ranking, the last resort, locks such a choice as ranked
			// (a holder may yet fail).
			alts := alternates(ch, cands)
			preferred, free := s.inflight.claim(ch, alts, since)
			claimed := preferred != nil
			if !claimed {
				if !final {
					continue
				}
				preferred, free = ch.SlotIDs, alts
			}
			if attempts >= s.cfg.MaxAttempts {
				if claimed {
					s.inflight.release(preferred)
				}
				return true, nil
			}
			attempts++
			// No savepoint around the lock: a lost race leaves at most a few slot locks held
			// (SKIP LOCKED: nobody waits on them) until this transaction ends. The insert
			// carries its own savepoint in its round trip.
			err := func() error {
				if claimed {
					defer s.inflight.release(preferred)
				}
				claims, slotIDs, indexes, err := lockChoice(ctx, tx, ch.NodeID, preferred, free, r.reservation)
				// Locked until this transaction ends, whatever happens next: a lost race's
				// few locked slots too, or this replica's other requests would rank them as
				// free and lose their own race for them (SKIP LOCKED passes them by).
				s.inflight.hold(slotIDs)
				held.locked = append(held.locked, slotIDs...)
				if err != nil {
					return err
				}
				na.NodeID = ch.NodeID
				na.UsageSnapshot = usage(r, price, ch.NodeID, slotIDs)
				chosen, err := imageFor(ctx, tx, img, canary, ch.NodeID, r.region)
				if err != nil {
					return err
				}
				na.OSImageID, na.ImageSnapshot = chosen.ID, chosen
				rec := actor.audit("allocation.create", "allocation", "", map[string]any{
					"sku": r.sku.SKU, "gpus": r.gpus, "node": ch.NodeName, "slot_indexes": indexes, "image": chosen.Slug, "profile": profile.Name})
				na.Audit = &rec
				if s.planner != nil {
					if na.Task, err = s.planner.ProvisionTask(planOf(na, claims)); err != nil {
						return err
					}
				}
				*written, *writtenTasks, err = tx.InsertAllocationRecord(ctx, na, claims)
				if err == nil {
					held.reserved = slotIDs
				}
				id = written.ID
				return err
			}()
			if err == nil {
				return true, nil
			}
			// A lost lock race or a claim constraint hit by a concurrent scheduler: try the next choice.
			if errors.Is(err, errLostRace) || (errors.Is(err, store.ErrConflict) && !isIdempotencyConflict(err)) {
				lost++
				continue
			}
			return true, err
		}
		return false, nil // every choice here was taken: the next window
	}
	if r.reservation != "" {
		err := s.placeInReservation(ctx, tx, r, try, func() bool { return id != "" })
		return id, err
	}
	for round := 0; ; round++ {
		attempts = 0
		outcome, err := s.placeSlice(ctx, tx, r, look, try)
		switch {
		case err != nil:
			return "", err
		case id != "":
			return id, nil
		case attempts == 0:
			// Diagnose on this transaction's connection: taking a second pooled connection while
			// holding one can exhaust the pool under load.
			return "", s.diagnose(r, outcome, func() (store.Blockers, error) { return tx.SliceBlockers(ctx, s.query(r)) })
		}
		// Every ranked placement went to concurrent requests. Whether anything is left once
		// they are done decides the answer: look again, in a new statement (which sees what
		// they committed), without the slots this replica's other reservations still hold.
		// Nothing left: no capacity, and no "retry" (a retry cannot succeed). Something left:
		// go round once more here, with fresh windows, before telling the client to retry.
		cands, err := tx.SliceCandidates(ctx, s.query(r))
		if err != nil {
			return "", err
		}
		cands = s.inflight.heldByOthers(cands, held.locked)
		topo, err := tx.NodeTopologies(ctx, nodeIDs(cands))
		if err != nil {
			return "", err
		}
		if again := sched.PlaceSlice(s.sliceRequest(r), buildNodes(cands, topo)); len(again.Choices) == 0 {
			return "", s.diagnose(r, again, func() (store.Blockers, error) { return tx.SliceBlockers(ctx, s.query(r)) })
		}
		if round == 1 {
			return "", unavailable(apiv1.ReasonNoCapacity, fmt.Sprintf(
				"all %d ranked placements were taken by concurrent requests, and capacity may remain once they finish; retry", lost),
				map[string]any{"retryable": true})
		}
		look = store.CreateLookup{} // the next round reads its windows afresh
	}
}

// imageFor is the image an allocation placed on nodeID boots: the canary's when the
// canary includes the node, else the default. A canary by region needs the node's region
// when the request named none (one primary-key read, only while such a canary runs).
func imageFor(ctx context.Context, tx *store.Tx, def store.ResolvedImage, canary *store.Canary, nodeID, region string) (store.ResolvedImage, error) {
	if canary == nil {
		return def, nil
	}
	if region == "" && len(canary.Regions) > 0 {
		var err error
		if region, err = tx.NodeRegion(ctx, nodeID); err != nil {
			return def, err
		}
	}
	if canary.Includes(nodeID, region) {
		return canary.Image, nil
	}
	return def, nil
}

var errLostRace = errors.New("lost slot lock race")

// txSlots is what a create's transaction has locked (held in s.inflight until it ends: its
// reservation and any slots a lost race left locked) and what it reserved (remembered there
// once it commits, see inFlight.committed).
type txSlots struct {
	locked, reserved []string
}

// planOf is the dispatch plan of an allocation about to be written: what the dispatcher
// would read back for it (claims' device snapshots by slot index).
func planOf(na store.NewAllocation, claims []store.NewClaim) store.DispatchInfo {
	js := func(v any) json.RawMessage {
		b, _ := json.Marshal(v)
		return b
	}
	p := store.DispatchInfo{ID: na.ID, NodeID: na.NodeID, CapacityShape: na.CapacityShape, Status: AllocRequested,
		ResolvedProfile: js(na.ResolvedProfile), ImageSnapshot: js(na.ImageSnapshot), SSHPublicKeys: na.SSHPublicKeys}
	for _, c := range claims {
		if c.Kind == "slot" {
			p.Snapshots = append(p.Snapshots, c.Snapshot) // a device snapshot as the database built it
		}
	}
	return p
}

// Placement reads best-fit windows of nodes, not the whole fleet: the scheduler ranks the
// candidates of the first window whose ranking is settled (its best choice uses one NUMA group
// or a whole node; a window that offers only spans may hide a NUMA-local node elsewhere). Only
// when sched.WindowsBeforeFullScan windows settle nothing (fragmented capacity, SKU overrides
// on slots, an exhausted fleet) does it rank every candidate, which is also what explains a
// refusal.
const (
	windowNodes           = sched.WindowNodes
	windowsBeforeFullScan = sched.WindowsBeforeFullScan
)

// firstWindow is a slice request's first best-fit window. Create reads it with the SKU and
// placeSlice uses that read only if it asked for the same window, so both build it here.
func firstWindow(q store.PlacementQuery, gpus, group, emptySkip int) store.WindowRequest {
	return store.WindowRequest{Query: q, GPUs: gpus, Group: group, Limit: windowNodes, Ties: sched.WindowTies,
		EmptyTies: sched.WindowEmptyTies, EmptySkip: emptySkip}
}

// placeSlice ranks slice placements for r inside tx, window by window, and hands each
// non-empty ranking to try until try reports done (a reservation made, or an error). It
// returns the last ranking, which is the full one (for diagnosis) when nothing was tried.
func (s *Service) placeSlice(ctx context.Context, tx *store.Tx, r request, look store.CreateLookup, try func(out sched.Outcome, cands []store.CandidateSlot, since time.Time, final bool) (bool, error)) (sched.Outcome, error) {
	q := s.query(r)
	req := s.sliceRequest(r)
	wr := firstWindow(q, r.gpus, sched.WindowGroup(req), r.emptySkip)
	for w := 0; w < windowsBeforeFullScan; w++ {
		var win store.Window
		var err error
		if w == 0 && look.Window != nil && look.WindowFor == wr {
			win, err = *look.Window, look.WindowErr // read with the SKU
		} else {
			win, err = tx.SliceWindow(ctx, wr)
		}
		s.windows.Add(1)
		if err != nil {
			return sched.Outcome{}, err
		}
		if len(win.NodeIDs) == 0 {
			break
		}
		out := sched.PlaceSlice(req, buildNodes(win.Candidates, win.Topology))
		if out.Settled() {
			if done, err := try(out, win.Candidates, win.SentAt, false); done || err != nil {
				return out, err
			}
		}
		if len(win.NodeIDs) < windowNodes {
			break
		}
		next := win.Next
		wr.After = &next
	}
	sent := time.Now()
	s.fleetScans.Add(1)
	cands, err := tx.SliceCandidates(ctx, q)
	if err != nil {
		return sched.Outcome{}, err
	}
	out, err := s.rank(ctx, tx, r, cands)
	if err != nil || len(out.Choices) == 0 {
		return out, err
	}
	_, err = try(out, cands, sent, true)
	return out, err
}

// lockChoice locks len(preferred) slots of a node: the preferred ones, or equivalent ones from
// alts (free candidate slots of the same node and NUMA groups: see alternates and
// inFlight.claim) when concurrent requests hold some of them (a full-host choice has no
// equivalents). It returns the claims and the slots' ids and indexes, or errLostRace.
//
// reservation is the capacity reservation whose held slots to lock ("" = the fleet's).
func lockChoice(ctx context.Context, sp *store.Tx, nodeID string, preferred, alts []string, reservation string) ([]store.NewClaim, []string, []int, error) {
	locked, err := sp.LockAvailableSlots(ctx, nodeID, preferred, alts, len(preferred), reservation)
	if err != nil {
		return nil, nil, nil, err
	}
	slices.SortFunc(locked, func(a, b store.LockedSlot) int { return a.SlotIndex - b.SlotIndex })
	claims := make([]store.NewClaim, 0, len(locked))
	ids := make([]string, 0, len(locked))
	idx := make([]int, 0, len(locked))
	for _, l := range locked {
		claims = append(claims, store.NewClaim{Kind: "slot", NodeID: l.NodeID, SlotID: l.ID, FabricVF: l.FabricVF, Snapshot: l.Snapshot})
		ids = append(ids, l.ID)
		idx = append(idx, l.SlotIndex)
	}
	if len(locked) != len(preferred) {
		return nil, ids, nil, errLostRace // ids: what it did lock, held until the transaction ends
	}
	return claims, ids, idx, nil
}

func (s *Service) rank(ctx context.Context, tx *store.Tx, r request, cands []store.CandidateSlot) (sched.Outcome, error) {
	topo, err := tx.NodeTopologies(ctx, nodeIDs(cands))
	if err != nil {
		return sched.Outcome{}, err
	}
	return sched.PlaceSlice(s.sliceRequest(r), buildNodes(cands, topo)), nil
}

func usage(r request, price apiv1.Price, nodeID string, slotIDs []string) map[string]any {
	return map[string]any{"sku": r.sku.SKU, "capacity_shape": r.sku.CapacityShape, "gpus": r.gpus, "node_id": nodeID,
		"slot_ids": slotIDs, "slot_count": len(slotIDs), "gpu_hourly_price_minor": price.GPUHourlyPriceMinor, "currency": price.Currency}
}

func (s *Service) reserveBaremetal(ctx context.Context, tx *store.Tx, actor Actor, r request, na store.NewAllocation, written *store.AllocationRecord) (string, error) {
	q := s.query(r)
	cands, err := tx.BaremetalCandidates(ctx, q)
	if err != nil {
		return "", err
	}
	nodes := make([]sched.BaremetalNode, 0, len(cands))
	for _, c := range cands {
		nodes = append(nodes, sched.BaremetalNode{ID: c.NodeID, Name: c.NodeName, ApprovedSlots: c.ApprovedSlots})
	}
	for i, n := range sched.RankBaremetal(nodes) {
		if i >= s.cfg.MaxAttempts {
			break
		}
		var id string
		err := tx.Savepoint(ctx, func(sp *store.Tx) error {
			ok, err := sp.LockNodeForBaremetal(ctx, q, n.ID)
			if err != nil {
				return err
			}
			if !ok {
				return errLostRace
			}
			na.NodeID = n.ID
			na.UsageSnapshot = usage(r, apiv1.Price{GPUHourlyPriceMinor: r.sku.GPUHourlyPriceMinor, Currency: r.sku.Currency}, n.ID, nil)
			rec := actor.audit("allocation.create", "allocation", "", map[string]any{
				"sku": r.sku.SKU, "gpus": r.gpus, "node": n.Name, "capacity_shape": "baremetal"})
			na.Audit = &rec
			snap, err := json.Marshal(map[string]any{"node_id": n.ID, "node_name": n.Name, "gpus": r.gpus})
			if err != nil {
				return err
			}
			*written, _, err = sp.InsertAllocationRecord(ctx, na, []store.NewClaim{{Kind: "node_exclusive", NodeID: n.ID, Snapshot: snap}})
			id = written.ID
			return err
		})
		if err == nil {
			return id, nil
		}
		if errors.Is(err, errLostRace) || (errors.Is(err, store.ErrConflict) && !isIdempotencyConflict(err)) {
			continue
		}
		return "", err
	}
	drain, err := tx.BaremetalDraining(ctx, q)
	if err != nil {
		return "", err
	}
	if len(cands) == 0 && drain > 0 {
		return "", unavailable(apiv1.ReasonNodeDraining, fmt.Sprintf("%d matching nodes are draining", drain), map[string]any{"draining_nodes": drain})
	}
	return "", unavailable(apiv1.ReasonNoCapacity, fmt.Sprintf("no free %s node (nodes with live or uncleaned slice claims are not free)", r.sku.SKU), nil)
}

func isIdempotencyConflict(err error) bool {
	var dbe *store.DBError
	return errors.As(err, &dbe) && dbe.Constraint == "allocations_tenant_id_idempotency_key_key"
}

// AllowSimulated says whether this controller sells simulated hosts.
func (s *Service) AllowSimulated() bool { return s.cfg.AllowSimulated }

// HeartbeatMaxAge is the configured agent freshness bound (0 = not enforced).
func (s *Service) HeartbeatMaxAge() time.Duration { return s.cfg.HeartbeatMaxAge }
