package alloc_test

import (
	"reflect"
	"testing"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// A tenant's answers read the same whether the allocation's snapshots were written apart from
// its row (allocation_snapshots_apart on, a fresh database) or into its own columns too (off,
// while the previous release may run): the create's answer and a later read, profile, image,
// price and SSH keys.
func TestAnswersReadTheSameWithTheSnapshotsApartOrNot(t *testing.T) {
	b := setup(t)
	b.addNode("n1", 1)
	conn := connectTo(b)
	req := apiv1.AllocationCreate{SKU: "h200-sxm-slice", GPUs: 2,
		SSHPublicKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl tenant@laptop"}}
	made := map[bool]apiv1.Allocation{}
	for _, apart := range []bool{false, true} {
		if _, err := conn.Exec(b.ctx, `UPDATE schema_switches SET enabled = $1 WHERE name = 'allocation_snapshots_apart'`, apart); err != nil {
			t.Fatal(err)
		}
		a, _, err := b.svc.Create(b.ctx, b.tenant, req, "")
		if err != nil {
			t.Fatal(err)
		}
		var own int
		if err := conn.QueryRow(b.ctx, `SELECT pg_column_size(a.*) FROM allocations a WHERE id = $1`, a.ID).Scan(&own); err != nil {
			t.Fatal(err)
		}
		if apart != (own < 400) {
			t.Fatalf("with the switch %v the allocation's own row is %d bytes", apart, own)
		}
		got, err := b.svc.Get(b.ctx, b.tenant, a.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range []apiv1.Allocation{a, got} {
			if x.Profile.Name == "" || x.Profile.VCPUCount == 0 || x.Image == nil || x.Price.Currency == "" || len(x.SSHPublicKeys) != 1 {
				t.Fatalf("with the switch %v: profile %+v, image %+v, price %+v, keys %q", apart, x.Profile, x.Image, x.Price, x.SSHPublicKeys)
			}
			if !reflect.DeepEqual(x.Profile, a.Profile) || !reflect.DeepEqual(x.Image, a.Image) || x.Price != a.Price {
				t.Fatalf("with the switch %v the read differs from the create's answer: %+v %+v %+v; %+v %+v %+v", apart,
					x.Profile, x.Image, x.Price, a.Profile, a.Image, a.Price)
			}
		}
		made[apart] = got
	}
	off, on := made[false], made[true]
	if !reflect.DeepEqual(off.Profile, on.Profile) || !reflect.DeepEqual(off.Image, on.Image) || off.Price != on.Price ||
		!reflect.DeepEqual(off.SSHPublicKeys, on.SSHPublicKeys) {
		t.Fatalf("switch off reads %+v %+v %+v %q; on %+v %+v %+v %q", off.Profile, off.Image, off.Price, off.SSHPublicKeys,
			on.Profile, on.Image, on.Price, on.SSHPublicKeys)
	}
}
