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
