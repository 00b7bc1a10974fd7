package controller

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/store"
)

var emptyDBSeq atomic.Int32

// emptyDatabase is a new database without the gpuaas schema (restore's target).
func emptyDatabase(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("restore_target_%d", emptyDBSeq.Add(1))
	if err := pgtest.Server().CreateDatabase(context.Background(), name, ""); err != nil {
		t.Fatal(err)
	}
	return pgtest.Server().ConnString(name)
}

// Backup and restore round-trip the database and the identity files; restore refuses a
// state directory that holds an identity, a database that holds a schema, a damaged archive
// and a file that is no archive, each with a clear reason and without writing anything.
func TestBackupRestoreRoundTripAndRefusals(t *testing.T) {
	src := pgtest.NewDatabase(t) // migrated
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	st, err := store.Open(ctx, src, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.InTx(ctx, func(tx *store.Tx) error { _, err := tx.CreateTenant(ctx, "acme"); return err }); err != nil {
		t.Fatal(err)
	}
	st.Close()
	dir := t.TempDir()
	srcState := filepath.Join(dir, "state")
	if _, err := pki.Init(pki.InitOptions{Dir: srcState}); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "backup.tar")
	m, err := Backup(ctx, Config{StateDir: srcState, DatabaseURL: src}, archive, "test", log)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(archive); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("archive: %v (want mode 0600)", err)
	}
	if m.SchemaVersion == 0 || len(m.Files) != len(identityFiles())+1 {
		t.Fatalf("manifest %+v", m)
	}

	// Round trip.
	dstState, dst := filepath.Join(dir, "restored"), emptyDatabase(t)
	if _, err := Restore(ctx, Config{StateDir: dstState, DatabaseURL: dst}, archive, log); err != nil {
		t.Fatal(err)
	}
	for _, rel := range identityFiles() {
		a, _ := os.ReadFile(filepath.Join(srcState, rel))
		b, err := os.ReadFile(filepath.Join(dstState, rel))
		if err != nil || !bytes.Equal(a, b) {
			t.Fatalf("%s not restored as backed up: %v", rel, err)
		}
		if fi, _ := os.Stat(filepath.Join(dstState, rel)); fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s restored with mode %v", rel, fi.Mode().Perm())
		}
	}
	if v, err := store.SchemaVersion(ctx, dst); err != nil || v != m.SchemaVersion {
		t.Fatalf("restored schema version %d (%v), want %d", v, err, m.SchemaVersion)
	}
	rst, err := store.Open(ctx, dst, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tenants, err := rst.ListTenants(ctx)
	rst.Close()
	if err != nil || len(tenants) != 1 || tenants[0].Name != "acme" {
		t.Fatalf("restored tenants %+v (%v)", tenants, err)
	}

	refused := func(what string, cfg Config, from, want string) {
		t.Helper()
		_, err := Restore(ctx, cfg, from, log)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: err %v, want one saying %q", what, err, want)
		}
		for _, rel := range identityFiles() {
			if cfg.StateDir != dstState && fileExists(filepath.Join(cfg.StateDir, rel)) {
				t.Fatalf("%s: %s written although the restore was refused", what, rel)
			}
		}
	}
	refused("onto a restored identity", Config{StateDir: dstState, DatabaseURL: emptyDatabase(t)}, archive, "fresh state directory")
	refused("onto a database with a schema", Config{StateDir: filepath.Join(dir, "s2"), DatabaseURL: src}, archive, "restore needs an empty database")

	b, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/3] ^= 0xff // inside the dump member
	damaged := filepath.Join(dir, "damaged.tar")
	if err := os.WriteFile(damaged, b, 0o600); err != nil {
		t.Fatal(err)
	}
	empty := emptyDatabase(t)
	refused("a damaged archive", Config{StateDir: filepath.Join(dir, "s3"), DatabaseURL: empty}, damaged, "the archive is damaged")
	if v, err := store.SchemaVersion(ctx, empty); err != nil || v != 0 {
		t.Fatalf("a refused restore touched the database: version %d (%v)", v, err)
	}
	// An archive from a newer release (a schema this build does not know) is refused.
	newer := rewriteManifest(t, archive, filepath.Join(dir, "newer.tar"), func(m *backupManifest) { m.SchemaVersion = store.KnownSchemaVersion() + 1 })
	refused("an archive from a newer release", Config{StateDir: filepath.Join(dir, "s5"), DatabaseURL: empty}, newer, "this controller knows schema versions up to")
	junk := filepath.Join(dir, "junk")
	if err := os.WriteFile(junk, []byte("not a tar file at all, but long enough to be read as one............"), 0o600); err != nil {
		t.Fatal(err)
	}
	refused("a file that is no archive", Config{StateDir: filepath.Join(dir, "s4"), DatabaseURL: empty}, junk, "not a")
}

// Without --database-url, backup reaches the embedded cluster under the state directory,
// also while a controller runs it (through its socket), and restore creates a new embedded
// cluster in the fresh state directory and loads the dump into it.
func TestBackupRestoreEmbeddedDatabase(t *testing.T) {
	pgtest.RequireServer(t)
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	root, err := os.MkdirTemp("", "gpuaas-backup-")
	if err == nil {
		err = os.Chmod(root, 0o755) // the embedded cluster runs as its own user when we are root
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	src := Config{StateDir: filepath.Join(root, "src")}
	if _, err := Init(src); err != nil {
		t.Fatal(err)
	}
	// A running controller's embedded cluster (owned by "another process": this test).
	url, stop, err := database(ctx, src, log)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Migrate(ctx, url); err != nil {
		stop()
		t.Fatal(err)
	}
	archive := filepath.Join(root, "backup.tar")
	m, err := Backup(ctx, src, archive, "test", log)
	stop()
	if err != nil {
		t.Fatalf("backup of a running embedded cluster: %v", err)
	}
	dst := Config{StateDir: filepath.Join(root, "dst")}
	if _, err := Restore(ctx, dst, archive, log); err != nil {
		t.Fatalf("restore into a new embedded cluster: %v", err)
	}
	url, stop, err = database(ctx, dst, log)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if v, err := store.SchemaVersion(ctx, url); err != nil || v != m.SchemaVersion || v == 0 {
		t.Fatalf("restored embedded schema version %d (%v), want %d", v, err, m.SchemaVersion)
	}
}

// rewriteManifest copies archive to out with its manifest changed by edit.
func rewriteManifest(t *testing.T, archive, out string, edit func(*backupManifest)) string {
	t.Helper()
	in, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr, tw := tar.NewReader(in), tar.NewWriter(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == manifestName {
			var m backupManifest
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			edit(&m)
			b, _ = json.Marshal(m)
			h.Size = int64(len(b))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return out
}
