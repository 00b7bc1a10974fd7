package pgserver

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// clientTool is the path of a PostgreSQL client program (pg_dump, pg_restore) of the same
// installation as the server binaries, so its version is at least the server's; else PATH's.
func clientTool(name string) (string, error) {
	if dir, err := FindBinDir(); err == nil {
		if p := filepath.Join(dir, name); fileExists(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%s not found (Debian package postgresql-client)", name)
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// Dump writes a logical dump of the database at connString (libpq keyword/value or URL form)
// to file in pg_dump's custom format, without owners or privileges (a restore recreates
// everything as the restoring role). pg_dump reads one snapshot, so it runs beside live
// writers.
func Dump(ctx context.Context, connString, file string) error {
	return runClient(ctx, "pg_dump", "--format=custom", "--no-owner", "--no-privileges", "--file", file, "--dbname", connString)
}

// Restore loads a Dump file into the database at connString in one transaction: on any
// error nothing is restored.
func Restore(ctx context.Context, connString, file string) error {
	return runClient(ctx, "pg_restore", "--single-transaction", "--exit-on-error", "--no-owner", "--no-privileges", "--dbname", connString, file)
}

func runClient(ctx context.Context, name string, args ...string) error {
	bin, err := clientTool(name)
	if err != nil {
		return err
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %v: %s", name, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}
