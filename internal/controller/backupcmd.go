package controller

import (
	"fmt"
	"io"
	"path/filepath"

	"github.com/spf13/cobra"
)

func newBackupCmd(version string, stdout, stderr io.Writer) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "backup --out FILE",
		Short: "Write a backup archive: the database (pg_dump) and the state directory's CA, certificates, task-signing key and admin token",
		Long: `Write a backup archive (one 0600 tar file) holding a logical dump of the database and the
state directory's identity files, which hosts pin: without them every host must enroll again.
It runs beside live controllers (pg_dump reads one snapshot). The archive holds the CA key
and the task-signing key: keep it in your secret store. For point-in-time recovery of a large
database use base backups and WAL archiving instead (docs/backup.md), and back up the
state directory with this command or by copying the same files.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd.Flags())
			if err != nil {
				return err
			}
			if out == "" {
				return fmt.Errorf("--out is required")
			}
			if out, err = filepath.Abs(out); err != nil {
				return err
			}
			m, err := Backup(cmd.Context(), cfg, out, version, newLogger(cfg, stderr))
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "wrote %s (schema version %d, %d files)\n", out, m.SchemaVersion, len(m.Files))
			return nil
		},
	}
	bindFlags(cmd.Flags(), "state-dir", "database-url", "log-level", "log-format", "config")
	cmd.Flags().StringVar(&out, "out", "", "archive to write (replaced atomically)")
	return cmd
}

func newRestoreCmd(stdout, stderr io.Writer) *cobra.Command {
	var from string
	cmd := &cobra.Command{
		Use:   "restore --from FILE",
		Short: "Restore a backup archive onto a fresh state directory and an empty database",
		Long: `Restore a backup archive written by "gpuaas-controller backup": its identity files into
--state-dir, which must not hold one yet, and its database into --database-url (or a new
embedded cluster under the state directory), which must be empty. The archive's checksums are
checked before anything is written, and the database is restored in one transaction. Then
start the controller with "serve" (it migrates the restored schema to this release): hosts
reconnect with the CA and task-signing key they pinned.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd.Flags())
			if err != nil {
				return err
			}
			if from == "" {
				return fmt.Errorf("--from is required")
			}
			m, err := Restore(cmd.Context(), cfg, from, newLogger(cfg, stderr))
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "restored %s (taken %s by %s, schema version %d) into %s\n", from, m.CreatedAt.Format("2006-01-02T15:04:05Z"), m.Version, m.SchemaVersion, cfg.StateDir)
			return nil
		},
	}
	bindFlags(cmd.Flags(), "state-dir", "database-url", "log-level", "log-format", "config")
	cmd.Flags().StringVar(&from, "from", "", "backup archive to restore")
	return cmd
}
