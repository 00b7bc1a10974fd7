package controller

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/pgserver"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/store"
)

// A backup archive is one tar file (0600) holding everything a controller needs to come back
// as the same control plane: a logical dump of the database (pg_dump's custom format) and the
// state directory's identity, which hosts pin (CA, server certificate, task-signing key) plus
// the first admin token. MANIFEST.json lists every other member with its SHA-256; restore
// checks them all before it writes anything.
const (
	manifestName   = "MANIFEST.json"
	dumpName       = "database.pgdump"
	backupFormat   = 1
	stateMemberDir = "state/"
)

// backupManifest is MANIFEST.json.
type backupManifest struct {
	Format        int               `json:"format"`
	Version       string            `json:"version"`        // the controller that wrote it
	SchemaVersion int32             `json:"schema_version"` // the database's migration version when dumped
	CreatedAt     time.Time         `json:"created_at"`
	Files         map[string]string `json:"files"` // member name -> sha256 hex
}

// identityFiles are the state directory's files a backup carries, relative to it.
func identityFiles() []string {
	p := pki.Paths{Dir: ""}
	return []string{p.CACert(), p.CAKey(), p.ServerCert(), p.ServerKey(), p.SigningKey(), p.SigningPub(), p.AdminToken()}
}

// toolDatabase is the database a maintenance command works on: --database-url, or the
// embedded cluster under the state directory, started for the command or, when a controller
// already runs it, reached through its socket.
func toolDatabase(ctx context.Context, cfg Config, log *slog.Logger) (string, func(), error) {
	url, stop, err := database(ctx, cfg, log)
	if errors.Is(err, pgserver.ErrAlreadyRunning) {
		return pgserver.ConnStringAt(filepath.Join(cfg.StateDir, "postgres"), embeddedDB), func() {}, nil
	}
	return url, stop, err
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// Backup writes a backup archive of the controller's database and state directory to out
// (replaced atomically; never a partial file). It runs beside live controllers: pg_dump
// reads one consistent snapshot.
func Backup(ctx context.Context, cfg Config, out, version string, log *slog.Logger) (backupManifest, error) {
	m := backupManifest{Format: backupFormat, Version: version, CreatedAt: time.Now().UTC(), Files: map[string]string{}}
	state := map[string][]byte{}
	for _, rel := range identityFiles() {
		b, err := os.ReadFile(filepath.Join(cfg.StateDir, rel))
		if err != nil {
			return m, fmt.Errorf("state directory: %w", err)
		}
		state[stateMemberDir+filepath.ToSlash(rel)] = b
	}
	url, stop, err := toolDatabase(ctx, cfg, log)
	if err != nil {
		return m, err
	}
	defer stop()
	if m.SchemaVersion, err = store.SchemaVersion(ctx, url); err != nil {
		return m, err
	}
	tmpDir, err := os.MkdirTemp(filepath.Dir(out), ".gpuaas-backup-")
	if err != nil {
		return m, err
	}
	defer os.RemoveAll(tmpDir)
	dumpFile := filepath.Join(tmpDir, dumpName)
	if err := pgserver.Dump(ctx, url, dumpFile); err != nil {
		return m, err
	}
	tmp := filepath.Join(tmpDir, "archive.tar")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return m, err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	add := func(name string, r io.Reader, size int64) error {
		h := sha256.New()
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: size, ModTime: m.CreatedAt, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		if _, err := io.Copy(io.MultiWriter(tw, h), r); err != nil {
			return err
		}
		if name != manifestName {
			m.Files[name] = hex.EncodeToString(h.Sum(nil))
		}
		return nil
	}
	df, err := os.Open(dumpFile)
	if err != nil {
		return m, err
	}
	defer df.Close()
	fi, err := df.Stat()
	if err != nil {
		return m, err
	}
	if err := add(dumpName, df, fi.Size()); err != nil {
		return m, err
	}
	names := make([]string, 0, len(state))
	for n := range state {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := add(n, bytes.NewReader(state[n]), int64(len(state[n]))); err != nil {
			return m, err
		}
	}
	mb, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return m, err
	}
	if err := add(manifestName, bytes.NewReader(mb), int64(len(mb))); err != nil {
		return m, err
	}
	if err := tw.Close(); err != nil {
		return m, err
	}
	if err := f.Sync(); err != nil {
		return m, err
	}
	if err := f.Close(); err != nil {
		return m, err
	}
	if err := os.Rename(tmp, out); err != nil {
		return m, err
	}
	return m, nil
}

// readArchive reads and checks a backup archive: every member listed in the manifest with
// the right digest, nothing else, the database dump written to dumpFile.
func readArchive(from, dumpFile string) (backupManifest, map[string][]byte, error) {
	var m backupManifest
	f, err := os.Open(from)
	if err != nil {
		return m, nil, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	state := map[string][]byte{}
	sums := map[string]string{}
	var manifest []byte
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return m, nil, fmt.Errorf("%s is not a backup archive: %w", from, err)
		}
		hash := sha256.New()
		switch {
		case h.Name == manifestName:
			if manifest, err = io.ReadAll(io.LimitReader(tr, 1<<20)); err != nil {
				return m, nil, err
			}
			continue
		case h.Name == dumpName:
			out, err := os.OpenFile(dumpFile, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return m, nil, err
			}
			_, err = io.Copy(io.MultiWriter(out, hash), tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return m, nil, err
			}
		case strings.HasPrefix(h.Name, stateMemberDir) && h.Size <= 1<<20:
			b, err := io.ReadAll(io.TeeReader(tr, hash))
			if err != nil {
				return m, nil, err
			}
			state[h.Name] = b
		default:
			return m, nil, fmt.Errorf("%s: unexpected member %q: not a gpuaas backup archive", from, h.Name)
		}
		sums[h.Name] = hex.EncodeToString(hash.Sum(nil))
	}
	if manifest == nil {
		return m, nil, fmt.Errorf("%s has no %s: not a gpuaas backup archive", from, manifestName)
	}
	if err := json.Unmarshal(manifest, &m); err != nil || m.Format != backupFormat {
		return m, nil, fmt.Errorf("%s: manifest of an unknown format (this controller reads format %d)", from, backupFormat)
	}
	want := append([]string{dumpName}, func() []string {
		var s []string
		for _, rel := range identityFiles() {
			s = append(s, stateMemberDir+filepath.ToSlash(rel))
		}
		return s
	}()...)
	for _, name := range want {
		if m.Files[name] == "" || sums[name] == "" {
			return m, nil, fmt.Errorf("%s lacks %s", from, name)
		}
	}
	for name, sum := range sums {
		if m.Files[name] != sum {
			return m, nil, fmt.Errorf("%s: %s does not match its checksum in the manifest: the archive is damaged", from, name)
		}
	}
	return m, state, nil
}

// Restore brings a backup archive back onto a fresh state directory and an empty database
// (--database-url, or a new embedded cluster under the state directory). It refuses a state
// directory that already holds an identity and a database that already holds a schema: a
// restore never overwrites a live control plane. The archive is checked whole before
// anything is written; the database is restored in one transaction. Serve then migrates the
// restored schema to this release as on any start.
func Restore(ctx context.Context, cfg Config, from string, log *slog.Logger) (backupManifest, error) {
	for _, rel := range identityFiles() {
		if fileExists(filepath.Join(cfg.StateDir, rel)) {
			return backupManifest{}, fmt.Errorf("state directory %s already holds %s: restore needs a fresh state directory (a restore never overwrites a control plane's identity)", cfg.StateDir, rel)
		}
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return backupManifest{}, err
	}
	tmpDir, err := os.MkdirTemp(cfg.StateDir, ".restore-")
	if err != nil {
		return backupManifest{}, err
	}
	defer os.RemoveAll(tmpDir)
	dumpFile := filepath.Join(tmpDir, dumpName)
	m, state, err := readArchive(from, dumpFile)
	if err != nil {
		return m, err
	}
	if known := store.KnownSchemaVersion(); m.SchemaVersion > known {
		return m, fmt.Errorf("%s holds a database at schema version %d, written by %s; this controller knows schema versions up to %d: restore it with that release or a later one",
			from, m.SchemaVersion, m.Version, known)
	}
	url, stop, err := database(ctx, cfg, log)
	if err != nil {
		return m, err
	}
	defer stop()
	if v, err := store.SchemaVersion(ctx, url); err != nil {
		return m, err
	} else if v != 0 {
		return m, fmt.Errorf("the target database already holds a gpuaas schema (version %d): restore needs an empty database", v)
	}
	if err := pgserver.Restore(ctx, url, dumpFile); err != nil {
		return m, fmt.Errorf("nothing was restored (one transaction): %w", err)
	}
	names := make([]string, 0, len(state))
	for n := range state {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		path := filepath.Join(cfg.StateDir, filepath.FromSlash(strings.TrimPrefix(n, stateMemberDir)))
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return m, err
		}
		if err := pki.WriteFileAtomic(path, state[n], 0o600); err != nil {
			return m, err
		}
	}
	return m, nil
}
