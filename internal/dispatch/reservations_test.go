package dispatch_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/dispatch"
	"github.com/gpuaas/gpuaas/internal/fixtures"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
)

// Two controller replicas' background loops expire a reservation whose end has come: it ends
// (expired), and its slots return to the fleet. (Its best-fit hint is checked with one
// refresher in internal/alloc: two replicas' refreshes racing may leave a stale hint, which
// costs placement a fleet-wide read, never capacity.)
func TestReplicasExpireDueReservations(t *testing.T) {
	w := setup(t, dispatch.Config{ReapEvery: 20 * time.Millisecond})
	_, privB, _ := ed25519.GenerateKey(rand.Reader)
	replicaB := dispatch.New(w.st, alloc.New(w.st, alloc.Config{}), privB, nil, dispatch.Config{ReapEvery: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(w.ctx)
	defer cancel()
	res, err := w.svc.CreateReservation(w.ctx, w.tenant, apiv1.ReservationCreate{SKU: "h200-sxm-slice", GPUs: 4, DurationSeconds: 3600})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, w.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	go w.d.Run(ctx)
	go replicaB.Run(ctx)
	if _, err := conn.Exec(ctx, `UPDATE capacity_reservations SET created_at = now() - interval '2 hours', ends_at = now() - interval '1 second'
		WHERE id = $1`, res.ID); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second) // a guard against a hang, not a timing assertion
	for {
		got, err := w.svc.GetReservation(w.ctx, w.tenant, res.ID)
		if err != nil {
			t.Fatal(err)
		}
		var held int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM node_resource_slots s WHERE s.reservation_id = $1`, res.ID).Scan(&held); err != nil {
			t.Fatal(err)
		}
		if got.Status == apiv1.ReservationExpired && held == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reservation %s, %d slots held; want expired, none held", got.Status, held)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The whole node is the fleet's again.
	if _, _, err := w.svc.Create(w.ctx, w.tenant, apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 8}, ""); err != nil {
		t.Fatalf("8 GPUs after the reservation expired: %v", err)
	}
}

// An allocation inside a reservation whose host refuses the plan is not moved to the fleet
// (its GPUs would escape the quota, counted as the reservation's): it fails, as an allocation
// no other node can take does.
func TestPlanInvalidInsideAReservationFails(t *testing.T) {
	w := setup(t, dispatch.Config{})
	err := w.st.InTx(w.ctx, func(tx *store.Tx) error {
		n2, err := tx.CreateNode(w.ctx, apiv1.NodeCreate{Name: "n2", Region: "lab", SliceSKU: "h200-sxm-slice"})
		if err != nil {
			return err
		}
		_, err = tx.ApplySlots(w.ctx, n2.ID, fixtures.H200SlotMap(2), false)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	res, err := w.svc.CreateReservation(w.ctx, w.tenant, apiv1.ReservationCreate{SKU: "h200-sxm-slice", GPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	a, _, err := w.svc.Create(w.ctx, w.tenant, apiv1.AllocationCreate{ReservationID: res.ID, GPUs: 1}, "")
	if err != nil {
		t.Fatal(err)
	}
	full, _ := w.svc.Get(w.ctx, alloc.Actor{Role: "admin"}, a.ID)
	env, err := w.d.Poll(w.ctx, full.NodeID, time.Second)
	if err != nil || env == nil {
		t.Fatalf("poll: %v, %v", env, err)
	}
	refusal := task.Result{Status: "failed", Reason: "plan_invalid", Error: "lease_acquire: plan_invalid: lease held"}
	if _, err := w.d.Result(w.ctx, full.NodeID, env.TaskID, refusal); err != nil {
		t.Fatal(err)
	}
	got, _ := w.svc.Get(w.ctx, alloc.Actor{Role: "admin"}, a.ID)
	if got.Status != "failed" || got.NodeID != full.NodeID {
		t.Fatalf("after the refusal: %s on %s; want failed on %s (not moved out of the reservation)", got.Status, got.NodeName, full.NodeName)
	}
}
