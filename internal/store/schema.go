package store

import (
	"context"
	"fmt"
	"io/fs"
	"strings"

	"github.com/jackc/pgx/v5"
)

// TaskSchemasParam is the session parameter this store sets on every connection: it signs
// tasks with their schema version, so the database lets it lease tasks of a schema above 1
// (migration 025). A controller of the release before versioning does not set it.
const TaskSchemasParam = "gpuaas.task_schemas"

// SchemaVersion is the migration version of the database at connString: 0 when it holds no
// gpuaas schema (Migrate's version table is absent).
func SchemaVersion(ctx context.Context, connString string) (int32, error) {
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		return 0, fmt.Errorf("store: connect: %w", err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('public.schema_version') IS NOT NULL`).Scan(&exists); err != nil || !exists {
		return 0, err
	}
	var v int32
	if err := conn.QueryRow(ctx, `SELECT version FROM public.schema_version`).Scan(&v); err != nil {
		return 0, fmt.Errorf("store: schema version: %w", err)
	}
	return v, nil
}

// QueuedTaskKinds counts a node's queued tasks by type and schema version (the runnable
// index bounds it), for saying which of them its hostd cannot take.
func (s *Store) QueuedTaskKinds(ctx context.Context, nodeID string) (map[[2]string]int, error) {
	rows, err := s.pool.Query(ctx, `SELECT type, schema_version::text, count(*)::int FROM node_tasks
		WHERE node_id = $1::uuid AND status = 'queued' GROUP BY 1, 2`, uuidArg(nodeID))
	if err != nil {
		return nil, translate(err)
	}
	defer rows.Close()
	out := map[[2]string]int{}
	for rows.Next() {
		var t, v string
		var n int
		if err := rows.Scan(&t, &v, &n); err != nil {
			return nil, translate(err)
		}
		out[[2]string{t, v}] = n
	}
	return out, translate(rows.Err())
}

// KnownSchemaVersion is the schema version this build's migrations lead to.
func KnownSchemaVersion() int32 {
	entries, err := fs.ReadDir(migrationsFS, "migrations")
	if err != nil {
		return 0
	}
	n := int32(0)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".sql") {
			n++
		}
	}
	return n
}
