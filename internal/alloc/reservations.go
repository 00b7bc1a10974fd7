package alloc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/sched"
	"github.com/gpuaas/gpuaas/internal/store"
)

// MaxReservationDuration bounds a capacity reservation's duration (longer ones are held until
// cancelled: a duration of 0).
const MaxReservationDuration = 366 * 24 * time.Hour

// PricePolicy is how a capacity reservation is billed, recorded with each one: the held GPUs
// at the SKU's catalog GPU-hour price (as of the reservation's creation) from its creation
// until it is cancelled or expires, whether or not allocations use them; allocations placed
// inside it are not billed again for those GPUs.
const PricePolicy = "held GPUs are billed at the catalog GPU-hour price from creation until cancelled or expired; allocations inside the reservation are not billed again for them"

// CreateReservation holds GPUs of a slice SKU for a tenant: placed as an allocation of that
// size would be (the same windows, ranking and NUMA rules, the same slot locks), but no VM is
// built: its slots are marked as the reservation's, and only allocations created inside it
// can take them (the database refuses anyone else, migration 020). The tenant's quotas count
// the held GPUs.
func (s *Service) CreateReservation(ctx context.Context, actor Actor, req apiv1.ReservationCreate) (apiv1.Reservation, error) {
	if actor.isAdmin() {
		if req.TenantID == "" {
			return apiv1.Reservation{}, invalid("admins must name tenant_id when reserving capacity")
		}
		if !store.IsUUID(req.TenantID) {
			return apiv1.Reservation{}, invalid("unknown tenant %s", req.TenantID)
		}
		actor.TenantID = req.TenantID
	} else if req.TenantID != "" && req.TenantID != actor.TenantID {
		return apiv1.Reservation{}, &apiv1.Error{Code: apiv1.CodeForbidden, Message: "tenants reserve capacity only for themselves"}
	}
	if req.DurationSeconds < 0 || time.Duration(req.DurationSeconds)*time.Second > MaxReservationDuration {
		return apiv1.Reservation{}, invalid("duration_seconds must be between 0 (until cancelled) and %d", int64(MaxReservationDuration/time.Second))
	}
	r, err := s.resolveRequest(ctx, nil, actor, req.SKU, req.GPUs, req.Region)
	if err != nil {
		return apiv1.Reservation{}, err
	}
	if r.sku.CapacityShape != "gpu_slice" {
		return apiv1.Reservation{}, invalid("capacity reservations hold slice capacity; %s is a %s SKU", r.sku.SKU, r.sku.CapacityShape)
	}
	var endsAt *time.Time
	if req.DurationSeconds > 0 {
		t := time.Now().Add(time.Duration(req.DurationSeconds) * time.Second)
		endsAt = &t
	}
	price := apiv1.Price{GPUHourlyPriceMinor: r.sku.GPUHourlyPriceMinor, Currency: r.sku.Currency, GPUs: r.gpus, CapacityShape: r.sku.CapacityShape}
	var id string
	err = s.st.InTx(ctx, func(tx *store.Tx) error {
		id = ""
		attempts := 0
		try := func(out sched.Outcome, cands []store.CandidateSlot, _ time.Time, _ bool) (bool, error) {
			for _, ch := range out.Choices {
				if attempts >= s.cfg.MaxAttempts {
					return true, nil
				}
				attempts++
				err := tx.Savepoint(ctx, func(sp *store.Tx) error {
					_, slotIDs, indexes, err := lockChoice(ctx, sp, ch.NodeID, ch.SlotIDs, alternates(ch, cands), "")
					if err != nil {
						return err
					}
					rec := actor.audit("reservation.create", "reservation", "", map[string]any{
						"sku": r.sku.SKU, "gpus": r.gpus, "node": ch.NodeName, "slot_indexes": indexes, "ends_at": endsAt})
					id, err = sp.InsertReservation(ctx, store.NewReservation{TenantID: actor.TenantID, SKU: r.sku.SKU, Region: r.region,
						NodeID: ch.NodeID, GPUs: r.gpus, Price: price, Policy: PricePolicy, EndsAt: endsAt, SlotIDs: slotIDs, Audit: rec})
					return err
				})
				if err == nil {
					return true, nil
				}
				id = ""
				if errors.Is(err, errLostRace) || errors.Is(err, store.ErrConflict) {
					continue // a concurrent create or reservation took a slot: the next choice
				}
				return true, err
			}
			return false, nil
		}
		outcome, err := s.placeSlice(ctx, tx, r, store.CreateLookup{}, try)
		switch {
		case err != nil:
			return err
		case id != "":
			return nil
		case attempts == 0:
			return s.diagnose(r, outcome, func() (store.Blockers, error) { return tx.SliceBlockers(ctx, s.query(r)) })
		}
		return unavailable(apiv1.ReasonNoCapacity, "every ranked placement was taken by concurrent requests; retry",
			map[string]any{"retryable": true})
	})
	if err != nil {
		var dbe *store.DBError
		if errors.As(err, &dbe) && dbe.Constraint == "capacity_reservations_tenant_id_fkey" {
			return apiv1.Reservation{}, invalid("unknown tenant %s", actor.TenantID)
		}
		return apiv1.Reservation{}, quotaError(err)
	}
	rec, err := s.st.GetReservation(ctx, id, "")
	if err != nil {
		return apiv1.Reservation{}, err
	}
	return presentReservation(actor, rec), nil
}

// GetReservation reads a reservation: a tenant's own, or any for an admin.
func (s *Service) GetReservation(ctx context.Context, actor Actor, id string) (apiv1.Reservation, error) {
	rec, err := s.st.GetReservation(ctx, id, tenantScope(actor))
	if errors.Is(err, store.ErrNotFound) {
		return apiv1.Reservation{}, &apiv1.Error{Code: apiv1.CodeNotFound, Message: "reservation not found"}
	}
	if err != nil {
		return apiv1.Reservation{}, err
	}
	return presentReservation(actor, rec), nil
}

// ListReservations lists a tenant's own reservations, or an admin's for tenantID ("" = all),
// newest first; activeOnly keeps those still holding capacity.
func (s *Service) ListReservations(ctx context.Context, actor Actor, tenantID string, activeOnly bool) ([]apiv1.Reservation, error) {
	if !actor.isAdmin() {
		tenantID = actor.TenantID
	} else if tenantID != "" && !store.IsUUID(tenantID) {
		return nil, invalid("tenant_id %q is not a tenant id", tenantID)
	}
	recs, err := s.st.ListReservations(ctx, tenantID, activeOnly)
	if err != nil {
		return nil, err
	}
	out := make([]apiv1.Reservation, 0, len(recs))
	for _, r := range recs {
		out = append(out, presentReservation(actor, r))
	}
	return out, nil
}

// CancelReservation ends a reservation now: its free slots return to the fleet at once, and
// those its allocations hold return when they are released (and wiped).
func (s *Service) CancelReservation(ctx context.Context, actor Actor, id string) (apiv1.Reservation, error) {
	var rec store.ReservationRecord
	err := s.st.InTx(ctx, func(tx *store.Tx) error {
		var err error
		audit := actor.audit("reservation.cancel", "reservation", id, nil)
		rec, err = tx.CancelReservation(ctx, id, tenantScope(actor), audit)
		return err
	})
	switch {
	case errors.Is(err, store.ErrNotFound):
		return apiv1.Reservation{}, &apiv1.Error{Code: apiv1.CodeNotFound, Message: "reservation not found"}
	case err != nil:
		return apiv1.Reservation{}, err
	}
	return presentReservation(actor, rec), nil
}

// ExpireReservations ends the reservations whose end has come (the controller's background
// loop; every replica may run it at once) and returns how many it ended.
func (s *Service) ExpireReservations(ctx context.Context) (int, error) {
	ids, err := s.st.ExpireReservations(ctx)
	return len(ids), err
}

// presentReservation is a reservation as actor may see it: a tenant gets an opaque host id
// (as for its allocations), an admin the node's name.
func presentReservation(actor Actor, rec store.ReservationRecord) apiv1.Reservation {
	r := rec.Reservation
	if actor.isAdmin() {
		r.Node = rec.NodeName
	} else {
		h := sha256.Sum256([]byte(r.TenantID + "/" + rec.NodeID))
		r.Node = "host-" + hex.EncodeToString(h[:6])
	}
	if r.Status != apiv1.ReservationActive {
		r.InUse, r.Free = 0, 0
	}
	return r
}

// reservationRequest checks that a create may go inside req.ReservationID (the tenant's own,
// active reservation) and fills in its SKU when the request names none.
func reservationRequest(ctx context.Context, tx *store.Tx, actor Actor, req *apiv1.AllocationCreate) error {
	res, err := tx.GetReservation(ctx, req.ReservationID, actor.TenantID)
	if errors.Is(err, store.ErrNotFound) {
		return &apiv1.Error{Code: apiv1.CodeNotFound, Message: "reservation not found"}
	}
	if err != nil {
		return err
	}
	switch {
	case res.Status != apiv1.ReservationActive || (res.EndsAt != nil && !res.EndsAt.After(time.Now())):
		return &apiv1.Error{Code: apiv1.CodeConflict, Message: fmt.Sprintf("reservation %s has ended", res.ID)}
	case req.SKU == "":
		req.SKU = res.SKU
	case req.SKU != res.SKU:
		return invalid("reservation %s holds %s, not %s", res.ID, res.SKU, req.SKU)
	}
	if req.Region != "" && req.Region != res.Region {
		return invalid("reservation %s is in region %s, not %s", res.ID, res.Region, req.Region)
	}
	return nil
}

// placeInReservation ranks the request's placements among the slots its reservation holds
// (the same ranking as the fleet's) and hands them to try; placed says whether try made one.
func (s *Service) placeInReservation(ctx context.Context, tx *store.Tx, r request,
	try func(out sched.Outcome, cands []store.CandidateSlot, since time.Time, final bool) (bool, error), placed func() bool) error {
	sent := time.Now()
	cands, err := tx.ReservationCandidates(ctx, s.query(r), r.reservation)
	if err != nil {
		return err
	}
	out, err := s.rank(ctx, tx, r, cands)
	if err != nil {
		return err
	}
	if len(out.Choices) == 0 {
		return reservationFull(r, out)
	}
	if _, err := try(out, cands, sent, true); err != nil || placed() {
		return err
	}
	return unavailable(apiv1.ReasonReservationFull, "the reservation's free slots were taken by concurrent creates inside it; retry",
		map[string]any{"retryable": true})
}

// reservationFull says why a request does not fit in its reservation, as a refused create
// says why it does not fit in the fleet.
func reservationFull(r request, out sched.Outcome) error {
	details := map[string]any{"requested_gpus": r.gpus, "free_slots": out.FreeSlots,
		"max_node_free": out.MaxNodeFree, "max_group_free": out.MaxGroupFree}
	msg := fmt.Sprintf("reservation %s has %d free GPUs; %d requested", r.reservation, out.FreeSlots, r.gpus)
	if out.Reason == "topology_fragmented" {
		msg = fmt.Sprintf("reservation %s has %d free GPUs, but not %d that the SKU's topology policy allows together: %s",
			r.reservation, out.FreeSlots, r.gpus, out.Message)
		details["topology"] = apiv1.ReasonTopologyFragmented
	}
	return unavailable(apiv1.ReasonReservationFull, msg, details)
}
