package benchenv

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// ExecIn runs each statement, in order, in another database of the bench's own cluster (the
// minimal-schema reference's): one connection for them all, closed after.
func (e *Env) ExecIn(ctx context.Context, database string, sqls ...string) error {
	return e.inDatabase(ctx, database, func(conn *pgx.Conn) error {
		for _, sql := range sqls {
			if _, err := conn.Exec(ctx, sql); err != nil {
				return err
			}
		}
		return nil
	})
}

// IntIn runs a query returning one integer in another database of the bench's own cluster.
func (e *Env) IntIn(ctx context.Context, database, sql string, args ...any) (int, error) {
	var n int
	err := e.inDatabase(ctx, database, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, sql, args...).Scan(&n)
	})
	return n, err
}

func (e *Env) inDatabase(ctx context.Context, database string, f func(*pgx.Conn) error) error {
	if e.PG == nil {
		return errors.New("benchenv: another database needs the bench's own PostgreSQL cluster")
	}
	conn, err := pgx.Connect(ctx, e.PG.ConnString(database))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return f(conn)
}
