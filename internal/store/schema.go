package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

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
