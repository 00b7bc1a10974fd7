package store

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
)

// A statement inside a transaction whose connection the server dropped (a failover, a
// restart, an operator's pg_terminate_backend) ends the transaction as ErrUnavailable even
// when the function that met the error wrapped it without translating it: callers answer a
// retryable 503, never an internal error.
func TestTransactionWhoseConnectionDropsIsUnavailable(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := &Store{pool: pool}
	ctx := context.Background()
	err = s.InTx(ctx, func(tx *Tx) error {
		var pid int
		if err := tx.tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return err
		}
		if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
			return err
		}
		var one int
		if err := tx.tx.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
			return fmt.Errorf("probe: %w", err) // not translated, as a careless caller would
		}
		return errors.New("the statement after the backend was terminated succeeded")
	})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("transaction whose backend was terminated = %v, want ErrUnavailable", err)
	}
}

// Serialization failures are retried; a transaction that keeps failing is answered as
// unavailable (retry later), not passed up as the database's error.
func TestTransactionThatKeepsConflictingIsUnavailable(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := &Store{pool: pool}
	ctx := context.Background()
	calls := 0
	err = s.InTx(ctx, func(tx *Tx) error {
		calls++
		_, err := tx.tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$`)
		return err
	})
	if calls != 4 || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("after %d attempts: %v; want 4 attempts and ErrUnavailable", calls, err)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "40001" {
		t.Fatalf("%v does not keep the database's error for the log", err)
	}
}

// The SQLSTATEs of a server that cannot do the work now are unavailable, wrapped or not;
// the database refusing the request itself is not.
func TestUnavailableClassifiesServerStates(t *testing.T) {
	for code, want := range map[string]bool{
		"08006": true,  // connection failure
		"53300": true,  // too many connections
		"57P01": true,  // admin shutdown
		"57P03": true,  // cannot connect now (recovery)
		"25006": true,  // read-only transaction (a standby)
		"23505": false, // unique violation
		"22P02": false, // invalid text representation
		"40001": false, // retried by InTx first
		"XX000": false,
	} {
		err := fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code, Message: "m"})
		if got := Unavailable(err); got != want {
			t.Errorf("Unavailable(%s) = %v, want %v", code, got, want)
		}
		if got := errors.Is(translate(err), ErrUnavailable); got != want {
			t.Errorf("translate(%s) unavailable = %v, want %v", code, got, want)
		}
	}
	for _, err := range []error{pgx.ErrNoRows, context.Canceled, context.DeadlineExceeded, errors.New("x")} {
		if Unavailable(err) {
			t.Errorf("Unavailable(%v) = true", err)
		}
	}
	if !Unavailable(fmt.Errorf("read: %w", pgconn.ErrConnClosed)) {
		t.Error("a closed connection, wrapped, is not unavailable")
	}
}
