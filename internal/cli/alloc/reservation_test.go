package alloc

import (
	"testing"

	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
)

// Inside a reservation the SKU is the reservation's and no default region applies; without
// one --sku stays required.
func TestCreateAndExplainInsideAReservation(t *testing.T) {
	t.Parallel()
	var got *CreateOptions
	if err := execute(NewCmdCreate(&cmdutil.Factory{}, func(o *CreateOptions) error { got = o; return nil }), "--reservation", "r1", "--gpus", "2"); err != nil {
		t.Fatal(err)
	}
	if got.Reservation != "r1" || got.SKU != "" || got.GPUs != 2 {
		t.Fatalf("options = %+v", got)
	}
	var ex *ExplainOptions
	if err := execute(NewCmdExplain(&cmdutil.Factory{}, func(o *ExplainOptions) error { ex = o; return nil }), "--reservation", "r1", "--gpus", "4"); err != nil {
		t.Fatal(err)
	}
	if ex.Reservation != "r1" || ex.GPUs != 4 {
		t.Fatalf("explain options = %+v", ex)
	}
	if err := execute(NewCmdCreate(&cmdutil.Factory{}, func(*CreateOptions) error { return nil }), "--gpus", "2"); !isFlagError(err) {
		t.Fatalf("no --sku and no --reservation: %v", err)
	}
}
