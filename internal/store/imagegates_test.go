package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/gpuaas/gpuaas/internal/store"
)

// The database, not only the API, holds an image to its smoke test: on a session that does
// not set gpuaas.allow_untested_images, plain SQL cannot register an image as active, make a
// pending one active, or give an active one a new digest until a smoke test of that digest
// passed (a running test does not count). A session that sets the parameter (what
// --allow-untested-images does) may. And a retired image is refused at the allocation insert
// itself, whatever resolved it.
func TestDatabaseGatesImageActivationAndRetirement(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	conn := connect(t, url)
	exec := func(sql string, args ...any) error {
		_, err := conn.Exec(ctx, sql, args...)
		return err
	}
	wantRefused := func(what string, err error, constraint, msg string) {
		t.Helper()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23514" || pgErr.ConstraintName != constraint || !strings.Contains(pgErr.Message, msg) {
			t.Fatalf("%s: %v, want check_violation %s %q", what, err, constraint, msg)
		}
	}
	const insertImage = `INSERT INTO os_images (slug, display_name, version, target, family, architecture, image_format,
		source_type, source_ref, digest_sha256, default_username, driver_strategy, active)
		VALUES ($1, $1, '1', 'vm_slice', 'debian', 'amd64', 'qcow2', 'http', 'https://images.example/x.qcow2', $2, 'debian', 'none', $3)
		RETURNING id::text`
	digest := strings.Repeat("ab", 32)

	wantRefused("registering an active image", exec(insertImage, "born-active", digest, true), store.ActivationGate, "no passed smoke test")
	var img string
	if err := conn.QueryRow(ctx, insertImage, "candidate", digest, false).Scan(&img); err != nil {
		t.Fatalf("registering a pending image: %v", err)
	}
	wantRefused("activating an untested image", exec(`UPDATE os_images SET active = true WHERE id = $1`, img), store.ActivationGate, "no passed smoke test")

	// A smoke test that is still running does not count; once its allocation reached active it does.
	n := addNode(t, st, "smoke-0", 91)
	var tenant, alloc string
	if err := conn.QueryRow(ctx, `INSERT INTO tenants (name) VALUES ('gpuaas-image-validation') RETURNING id::text`).Scan(&tenant); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `INSERT INTO allocations (tenant_id, sku, capacity_shape, gpus_total, region, node_id, os_image_id,
			image_snapshot, price_snapshot) VALUES ($1, 'h200-sxm-slice', 'gpu_slice', 1, 'lab', $2, $3, jsonb_build_object('digest_sha256', $4::text), '{}')
			RETURNING id::text`, tenant, n.ID, img, digest).Scan(&alloc); err != nil {
		t.Fatal(err)
	}
	if err := exec(`INSERT INTO image_smoke_tests (image_id, digest_sha256, allocation_id, node_id) VALUES ($1, $2, $3, $4)`,
		img, digest, alloc, n.ID); err != nil {
		t.Fatal(err)
	}
	wantRefused("activating with a running smoke test", exec(`UPDATE os_images SET active = true WHERE id = $1`, img), store.ActivationGate, "no passed smoke test")
	if err := exec(`UPDATE allocations SET active_at = now() WHERE id = $1`, alloc); err != nil {
		t.Fatal(err)
	}
	if err := exec(`UPDATE os_images SET active = true WHERE id = $1`, img); err != nil {
		t.Fatalf("activating with a passed smoke test: %v", err)
	}
	wantRefused("a new digest on an active image", exec(`UPDATE os_images SET digest_sha256 = $2 WHERE id = $1`, img, strings.Repeat("cd", 32)),
		store.ActivationGate, "no passed smoke test")

	// Retired: no new allocation records it, however it got there; a baremetal allocation
	// (no image) is not touched by the check.
	if err := exec(`UPDATE os_images SET active = false, retired_at = now() WHERE id = $1`, img); err != nil {
		t.Fatal(err)
	}
	wantRefused("an allocation of a retired image", exec(`INSERT INTO allocations (tenant_id, sku, capacity_shape, gpus_total, region, node_id,
			os_image_id, price_snapshot) VALUES ($1, 'h200-sxm-slice', 'gpu_slice', 1, 'lab', $2, $3, '{}')`, tenant, n.ID, img),
		store.RetiredImage, "is retired")
	if err := exec(`INSERT INTO allocations (tenant_id, sku, capacity_shape, gpus_total, region, node_id, price_snapshot)
			VALUES ($1, 'h200-sxm-baremetal-8g', 'baremetal', 8, 'lab', $2, '{}')`, tenant, n.ID); err != nil {
		t.Fatalf("a baremetal allocation: %v", err)
	}

	// The store says it in our words, as a conflict with the image's state.
	strict, err := store.Open(ctx, url, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer strict.Close()
	im := testImage("strict-active", 7)
	err = strict.InTx(ctx, func(tx *store.Tx) error { _, err := tx.CreateImage(ctx, im); return err })
	if !errors.Is(err, store.ErrConflict) || !strings.Contains(err.Error(), "no passed smoke test") {
		t.Fatalf("store create of an active image: %v, want a conflict saying no passed smoke test", err)
	}

	// The session parameter --allow-untested-images sets allows it.
	if err := exec(`SET gpuaas.allow_untested_images = 'on'`); err != nil {
		t.Fatal(err)
	}
	if err := exec(insertImage, "fixture-active", strings.Repeat("ef", 32), true); err != nil {
		t.Fatalf("registering an active image, untested images allowed: %v", err)
	}
	lax, err := store.Open(ctx, url, store.Options{AllowUntestedImages: true})
	if err != nil {
		t.Fatal(err)
	}
	defer lax.Close()
	if err := lax.InTx(ctx, func(tx *store.Tx) error { _, err := tx.CreateImage(ctx, im); return err }); err != nil {
		t.Fatalf("store create of an active image, untested images allowed: %v", err)
	}
}

// A smoke test's GPU evidence is the guest GPU check the host's probe reported after the boot
// (nvidia-smi in the guest, or "no GPU here" on a lab host). The test view shows it, and a
// failed check fails the test: the activation gate and the test's status both refuse it,
// even though its allocation reached active.
func TestSmokeTestShowsItsGPUCheckAndAFailedOneIsNoPass(t *testing.T) {
	st, url := open(t)
	ctx := context.Background()
	conn := connect(t, url)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	n := addNode(t, st, "smoke-1", 92)
	var tenant string
	if err := conn.QueryRow(ctx, `INSERT INTO tenants (name) VALUES ('gpuaas-image-validation') RETURNING id::text`).Scan(&tenant); err != nil {
		t.Fatal(err)
	}
	// smoke registers a pending image, boots it (its allocation reached active) and records
	// the provision task's probe detail; it returns the image id.
	smoke := func(slug, n2 string, probe string) string {
		t.Helper()
		digest := strings.Repeat(n2, 32)
		var img, alloc string
		if err := conn.QueryRow(ctx, `INSERT INTO os_images (slug, display_name, version, target, family, architecture, image_format,
			source_type, source_ref, digest_sha256, default_username, driver_strategy, active)
			VALUES ($1, $1, '1', 'vm_slice', 'debian', 'amd64', 'qcow2', 'http', 'https://images.example/x.qcow2', $2, 'debian', 'none', false)
			RETURNING id::text`, slug, digest).Scan(&img); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, `INSERT INTO allocations (tenant_id, sku, capacity_shape, gpus_total, region, node_id, os_image_id,
				image_snapshot, price_snapshot) VALUES ($1, 'h200-sxm-slice', 'gpu_slice', 1, 'lab', $2, $3, jsonb_build_object('digest_sha256', $4::text), '{}')
				RETURNING id::text`, tenant, n.ID, img, digest).Scan(&alloc); err != nil {
			t.Fatal(err)
		}
		exec(`INSERT INTO image_smoke_tests (image_id, digest_sha256, allocation_id, node_id) VALUES ($1, $2, $3, $4)`, img, digest, alloc, n.ID)
		exec(`INSERT INTO node_tasks (node_id, allocation_id, type, payload, status, not_after, phases, completed_at)
			VALUES ($1, $2, 'slice.vm_provision', '{}', 'succeeded', now() + interval '1 hour',
			        jsonb_build_array(jsonb_build_object('name', 'readiness', 'status', 'ok', 'detail', 'ssh ok'),
			                          jsonb_build_object('name', 'performance_probe', 'status', 'ok', 'detail', $3::text)), now())`,
			n.ID, alloc, probe)
		exec(`UPDATE allocations SET active_at = now() WHERE id = $1`, alloc)
		return img
	}
	lab := smoke("lab-image", "a1", "cpus=2 mem_kb=1000; gpu_check none: no GPU here (lab host: the slot's GPU is an emulated stand-in; nvidia-smi not run)")
	gpu := smoke("gpu-image", "b2", "cpus=24 mem_kb=64000; gpu_check ok: nvidia-smi lists 1 GPUs: NVIDIA H200, 143771 MiB")
	broken := smoke("broken-image", "c3", "cpus=24 mem_kb=64000; gpu_check failed: nvidia-smi in the guest: Process exited with status 9: NVIDIA-SMI has failed")

	for _, c := range []struct{ img, slug, status, check string }{
		{lab, "lab-image", "passed", "none: no GPU here (lab host"},
		{gpu, "gpu-image", "passed", "ok: nvidia-smi lists 1 GPUs: NVIDIA H200"},
		{broken, "broken-image", "failed", "failed: nvidia-smi in the guest"},
	} {
		tests, err := st.SmokeTests(ctx, c.slug)
		if err != nil || len(tests) != 1 {
			t.Fatalf("%s: smoke tests %+v, %v", c.slug, tests, err)
		}
		if tests[0].Status != c.status || !strings.HasPrefix(tests[0].GPUCheck, c.check) {
			t.Fatalf("%s: status %q, gpu check %q; want %q, %q…", c.slug, tests[0].Status, tests[0].GPUCheck, c.status, c.check)
		}
		_, err = conn.Exec(ctx, `UPDATE os_images SET active = true WHERE id = $1`, c.img)
		if c.status == "passed" && err != nil {
			t.Fatalf("%s: activation after a passed test: %v", c.slug, err)
		}
		if c.status == "failed" && (err == nil || !strings.Contains(err.Error(), "no passed smoke test")) {
			t.Fatalf("%s: activation after a failed GPU check: %v, want refused", c.slug, err)
		}
	}
}
