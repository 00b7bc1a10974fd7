package alloc_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/fixtures"
	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
	"github.com/gpuaas/gpuaas/internal/store"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, store.MigrateForTest)) }

// testBundle is one test's world: a fresh database, a service, a tenant and an admin.
type testBundle struct {
	t      *testing.T
	ctx    context.Context
	st     *store.Store
	url    string // the test database, for reading what the service API does not show
	svc    *alloc.Service
	clock  *fakeClock
	tenant alloc.Actor
	other  alloc.Actor
	admin  alloc.Actor
}

type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time { return c.now }

func setup(t *testing.T) *testBundle {
	return setupWith(t, alloc.Config{})
}

func setupWith(t *testing.T, cfg alloc.Config) *testBundle {
	t.Helper()
	return setupStore(t, cfg, store.Options{MaxConns: 40})
}

func setupStore(t *testing.T, cfg alloc.Config, opts store.Options) *testBundle {
	t.Helper()
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	opts.AllowUntestedImages = true // the fixture image below is registered active
	st, err := store.Open(ctx, url, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	clock := &fakeClock{now: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)}
	cfg.Now = clock.Now
	b := &testBundle{t: t, ctx: ctx, st: st, url: url, svc: alloc.New(st, cfg), clock: clock,
		admin: alloc.Actor{TokenID: "admin-token", Name: "admin", Role: "admin"}}
	var t1, t2 apiv1.Tenant
	b.tx(func(tx *store.Tx) error {
		if t1, err = tx.CreateTenant(ctx, "acme"); err != nil {
			return err
		}
		if t2, err = tx.CreateTenant(ctx, "globex"); err != nil {
			return err
		}
		_, err = tx.CreateImage(ctx, apiv1.OSImage{Slug: "test-slice-image", DisplayName: "test", Version: "1", Target: "vm_slice",
			Family: "debian", Architecture: "amd64", ImageFormat: "qcow2", SourceType: "http", SourceRef: "https://images.example/test.qcow2",
			DigestSHA256: strings.Repeat("ab", 32), DefaultUsername: "debian", DriverStrategy: "none", Active: true})
		return err
	})
	b.tenant = alloc.Actor{TokenID: "tok-acme", Name: "acme-user", Role: "tenant", TenantID: t1.ID}
	b.other = alloc.Actor{TokenID: "tok-globex", Name: "globex-user", Role: "tenant", TenantID: t2.ID}
	return b
}

func (b *testBundle) tx(fn func(*store.Tx) error) {
	b.t.Helper()
	if err := b.st.InTx(b.ctx, fn); err != nil {
		b.t.Fatal(err)
	}
}

// lockElsewhere locks slots in another transaction (a concurrent scheduler's lock) until
// the returned function ends that transaction, failing the test if it failed.
func (b *testBundle) lockElsewhere(slotIDs ...string) (release func()) {
	b.t.Helper()
	held, end := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- b.st.InTx(b.ctx, func(tx *store.Tx) error {
			for _, id := range slotIDs {
				if _, err := tx.SlotStatus(b.ctx, id); err != nil {
					return err
				}
			}
			close(held)
			<-end
			return nil
		})
	}()
	select {
	case <-held:
	case err := <-done:
		b.t.Fatalf("locking %v elsewhere: %v", slotIDs, err)
	}
	return func() {
		b.t.Helper()
		close(end)
		if err := <-done; err != nil {
			b.t.Fatal(err)
		}
	}
}

type nodeOpt func(*apiv1.NodeCreate, []apiv1.SlotSpec) []apiv1.SlotSpec

// addNode registers an H200 host with its eight-slot map (host number picks unique identities).
func (b *testBundle) addNode(name string, host int, opts ...nodeOpt) apiv1.Node {
	b.t.Helper()
	nc := apiv1.NodeCreate{Name: name, Region: "lab", SKU: "h200-sxm-baremetal-8g", SliceSKU: "h200-sxm-slice"}
	slots := fixtures.H200SlotMap(host)
	for _, o := range opts {
		slots = o(&nc, slots)
	}
	var n apiv1.Node
	b.tx(func(tx *store.Tx) error {
		var err error
		if n, err = tx.CreateNode(b.ctx, nc); err != nil {
			return err
		}
		_, err = tx.ApplySlots(b.ctx, n.ID, slots, false)
		return err
	})
	return n
}

func withRegion(r string) nodeOpt {
	return func(nc *apiv1.NodeCreate, s []apiv1.SlotSpec) []apiv1.SlotSpec { nc.Region = r; return s }
}

func withTenant(id string) nodeOpt {
	return func(nc *apiv1.NodeCreate, s []apiv1.SlotSpec) []apiv1.SlotSpec { nc.TenantID = id; return s }
}

// withSlots keeps only the listed slot indexes (others are never approved).
func withSlots(idx ...int) nodeOpt {
	return func(_ *apiv1.NodeCreate, s []apiv1.SlotSpec) []apiv1.SlotSpec {
		var out []apiv1.SlotSpec
		for _, sp := range s {
			for _, i := range idx {
				if sp.SlotIndex == i {
					out = append(out, sp)
				}
			}
		}
		return out
	}
}

// editSlot changes one slot's spec.
func editSlot(i int, fn func(*apiv1.SlotSpec)) nodeOpt {
	return func(_ *apiv1.NodeCreate, s []apiv1.SlotSpec) []apiv1.SlotSpec {
		for k := range s {
			if s[k].SlotIndex == i {
				fn(&s[k])
			}
		}
		return s
	}
}

func (b *testBundle) disable(node apiv1.Node, idx ...int) {
	b.t.Helper()
	b.tx(func(tx *store.Tx) error {
		for _, i := range idx {
			if _, err := tx.SetSlotEnabled(b.ctx, node.ID, i, false, "test"); err != nil {
				return err
			}
		}
		return nil
	})
}

// refreshCapacity runs the controller's capacity loop once: the best-fit hints catch up with
// the slots.
func (b *testBundle) refreshCapacity() {
	b.t.Helper()
	if _, err := b.st.RefreshCapacity(b.ctx); err != nil {
		b.t.Fatal(err)
	}
}

func (b *testBundle) create(actor alloc.Actor, sku string, gpus int) (apiv1.Allocation, error) {
	out, _, err := b.svc.Create(b.ctx, actor, apiv1.AllocationCreate{SKU: sku, GPUs: gpus}, "")
	return out, err
}

func (b *testBundle) mustCreate(gpus int) apiv1.Allocation {
	b.t.Helper()
	a, err := b.create(b.tenant, "h200-sxm-slice", gpus)
	if err != nil {
		b.t.Fatalf("create %d GPUs: %v", gpus, err)
	}
	return a
}

// slots lists a node's slots, failing the test if it cannot.
func (b *testBundle) slots(nodeID string) []apiv1.Slot {
	b.t.Helper()
	slots, err := b.st.ListSlots(b.ctx, nodeID)
	if err != nil {
		b.t.Fatal(err)
	}
	return slots
}

// placed returns the node and sorted slot indexes of an allocation, as an admin sees them.
func (b *testBundle) placed(a apiv1.Allocation) (string, []int) {
	b.t.Helper()
	full, err := b.svc.Get(b.ctx, b.admin, a.ID)
	if err != nil {
		b.t.Fatal(err)
	}
	var idx []int
	for _, c := range full.Claims {
		if c.SlotIndex != nil {
			idx = append(idx, *c.SlotIndex)
		}
	}
	return full.NodeName, idx
}

func (b *testBundle) invariants() {
	b.t.Helper()
	v, err := b.st.Invariants(b.ctx)
	if err != nil {
		b.t.Fatal(err)
	}
	if len(v) > 0 {
		b.t.Fatalf("invariants violated:\n%s", strings.Join(v, "\n"))
	}
}

// unavailableReason asserts err is sku_unavailable and returns its reason and details.
func unavailableReason(t *testing.T, err error) (string, map[string]any) {
	t.Helper()
	var ae *apiv1.Error
	if !errors.As(err, &ae) || ae.Code != apiv1.CodeSKUUnavailable {
		t.Fatalf("want sku_unavailable, got %v", err)
	}
	r, _ := ae.Details["reason"].(string)
	return r, ae.Details
}

// signed marks a proof as signed by node's enrolled key (a credential recorded for the node):
// the dispatcher checks real signatures (internal/dispatch); here only the database's
// demand that a verified proof name a signer of the slot's node is met.
func (b *testBundle) signed(node string, p alloc.WipeProof) alloc.WipeProof {
	b.t.Helper()
	n := mustNode(b, node)
	serial := "c0de" + n.ID[:8]
	err := b.st.InTx(b.ctx, func(tx *store.Tx) error {
		return tx.RecordCredential(b.ctx, serial, n.ID, time.Now().Add(time.Hour))
	})
	if err != nil && !errors.Is(err, store.ErrConflict) {
		b.t.Fatal(err)
	}
	p.Signature, p.SignerSerial = "test-signature", serial
	return p
}
