package store

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
)

// openTraced is a one-connection Store whose statements are logged, with table probe(v int).
func openTraced(t *testing.T) (*Store, *pgtest.Trips) {
	t.Helper()
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	log := &pgtest.Trips{}
	cfg.MaxConns, cfg.ConnConfig.Tracer = 1, log
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE probe (v int)`); err != nil {
		t.Fatal(err)
	}
	log.Take()
	return &Store{pool: pool}, log
}

func probeRows(t *testing.T, s *Store) int {
	t.Helper()
	var n int
	if err := s.pool.QueryRow(context.Background(), `SELECT count(*) FROM probe`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func insertBatch(vs ...int) *pgx.Batch {
	b := &pgx.Batch{}
	for _, v := range vs {
		b.Queue(`INSERT INTO probe (v) VALUES ($1)`, v)
	}
	return b
}

func TestTxSendsBeginWithItsFirstBatch(t *testing.T) {
	s, log := openTraced(t)
	ctx := context.Background()
	err := s.InTx(ctx, func(tx *Tx) error {
		if err := tx.tx.SendBatch(ctx, insertBatch(1, 2)).Close(); err != nil {
			return err
		}
		_, err := tx.tx.Exec(ctx, `INSERT INTO probe (v) VALUES (3)`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"begin | insert into probe (v) values ($1) | insert into probe (v) values ($1)", "insert into probe (v) values (3)", "commit"}
	if got := log.Take(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("round trips:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if n := probeRows(t, s); n != 3 {
		t.Fatalf("committed rows = %d, want 3", n)
	}
	log.Take()

	// A transaction that starts with a lone statement sends its BEGIN first; one that runs
	// nothing sends nothing.
	if err := s.InTx(ctx, func(tx *Tx) error { _, err := tx.tx.Exec(ctx, `DELETE FROM probe WHERE v = 3`); return err }); err != nil {
		t.Fatal(err)
	}
	if err := s.InTx(ctx, func(*Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if got := log.Take(); strings.Join(got, "\n") != "begin\ndelete from probe where v = 3\ncommit" {
		t.Fatalf("round trips:\n%s", strings.Join(got, "\n"))
	}
}

func TestTxBegunByABatchIsOneTransaction(t *testing.T) {
	s, _ := openTraced(t)
	ctx := context.Background()
	boom := errors.New("boom")
	err := s.InTx(ctx, func(tx *Tx) error {
		if err := tx.tx.SendBatch(ctx, insertBatch(1)).Close(); err != nil {
			return err
		}
		if _, err := tx.tx.Exec(ctx, `INSERT INTO probe (v) VALUES (2)`); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("InTx = %v, want boom", err)
	}
	if n := probeRows(t, s); n != 0 {
		t.Fatalf("%d rows survived the rollback, want 0", n)
	}

	// A failed statement aborts the transaction: ignoring its error cannot commit the rest.
	err = s.InTx(ctx, func(tx *Tx) error {
		b := insertBatch(1)
		b.Queue(`SELECT 1/0`)
		_ = tx.tx.SendBatch(ctx, b).Close()
		return nil
	})
	if !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("commit after a failed batch = %v, want ErrTxCommitRollback", err)
	}
	// A first batch that fails before it runs (a statement that does not parse) leaves
	// nothing open: the one connection serves the next transaction.
	err = s.InTx(ctx, func(tx *Tx) error {
		b := insertBatch(1)
		b.Queue(`SELEC 1`)
		return translate(tx.tx.SendBatch(ctx, b).Close())
	})
	if err == nil || !strings.Contains(err.Error(), "syntax") {
		t.Fatalf("unparsable first batch = %v, want a syntax error", err)
	}
	if err := s.InTx(ctx, func(tx *Tx) error { return tx.tx.SendBatch(ctx, insertBatch(7)).Close() }); err != nil {
		t.Fatal(err)
	}
	if n := probeRows(t, s); n != 1 {
		t.Fatalf("rows = %d, want only the last transaction's 1", n)
	}
}

func TestSavepointInALateBegunTransaction(t *testing.T) {
	s, _ := openTraced(t)
	ctx := context.Background()
	err := s.InTx(ctx, func(tx *Tx) error {
		// The savepoint is the transaction's first statement.
		if err := tx.Savepoint(ctx, func(sp *Tx) error {
			if err := sp.tx.SendBatch(ctx, insertBatch(1)).Close(); err != nil {
				return err
			}
			return errors.New("undo this attempt")
		}); err == nil {
			t.Error("Savepoint swallowed fn's error")
		}
		if err := tx.Savepoint(ctx, func(sp *Tx) error { return sp.tx.SendBatch(ctx, insertBatch(2)).Close() }); err != nil {
			return err
		}
		return tx.tx.SendBatch(ctx, insertBatch(3)).Close()
	})
	if err != nil {
		t.Fatal(err)
	}
	var vs []int
	rows, _ := s.pool.Query(ctx, `SELECT v FROM probe ORDER BY v`)
	for rows.Next() {
		var v int
		_ = rows.Scan(&v)
		vs = append(vs, v)
	}
	if rows.Err() != nil || len(vs) != 2 || vs[0] != 2 || vs[1] != 3 {
		t.Fatalf("rows = %v (%v), want [2 3]: the rolled-back savepoint's row gone, the rest committed", vs, rows.Err())
	}
}

// A transaction's last batch can carry its COMMIT (queueCommit): one round trip less, the rows
// committed, nothing after it runs (a statement there would otherwise run on its own), and the
// one connection serves the next transaction. Should a statement before the COMMIT fail, the
// transaction stays open and rolls back as without it; a savepoint cannot carry one.
func TestLastBatchCarriesTheCommit(t *testing.T) {
	s, log := openTraced(t)
	ctx := context.Background()
	err := s.InTx(ctx, func(tx *Tx) error {
		if err := tx.tx.SendBatch(ctx, insertBatch(1)).Close(); err != nil {
			return err
		}
		b := insertBatch(2)
		if !tx.tx.queueCommit(b) {
			return errors.New("queueCommit refused a top-level transaction")
		}
		br := tx.tx.SendBatch(ctx, b)
		if _, err := br.Exec(); err != nil {
			return err
		}
		if _, err := br.Exec(); err != nil { // COMMIT
			return err
		}
		tx.tx.committedBy()
		if err := br.Close(); err != nil {
			return err
		}
		if _, err := tx.tx.Exec(ctx, `INSERT INTO probe (v) VALUES (3)`); !errors.Is(err, errCommitted) {
			return errors.New("a statement after the COMMIT ran: " + errString(err))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"begin | insert into probe (v) values ($1)", "insert into probe (v) values ($1) | commit"}
	if got := log.Take(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("round trips:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if n := probeRows(t, s); n != 2 {
		t.Fatalf("committed rows = %d, want 2", n)
	}

	// A failure before the COMMIT: it does not run, the transaction rolls back.
	err = s.InTx(ctx, func(tx *Tx) error {
		b := insertBatch(4)
		b.Queue(`SELECT 1/0`)
		tx.tx.queueCommit(b)
		return tx.tx.SendBatch(ctx, b).Close()
	})
	if err == nil || !strings.Contains(err.Error(), "division by zero") {
		t.Fatalf("failed last batch = %v, want division by zero", err)
	}
	if n := probeRows(t, s); n != 2 {
		t.Fatalf("rows = %d after a failed last batch, want still 2", n)
	}
	// A savepoint cannot commit its transaction.
	err = s.InTx(ctx, func(tx *Tx) error {
		sp, err := tx.tx.savepoint(ctx)
		if err != nil {
			return err
		}
		if sp.queueCommit(&pgx.Batch{}) {
			return errors.New("a savepoint queued a COMMIT")
		}
		return sp.commit(ctx)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.InTx(ctx, func(tx *Tx) error { return tx.tx.SendBatch(ctx, insertBatch(5)).Close() }); err != nil {
		t.Fatal(err)
	}
	if n := probeRows(t, s); n != 3 {
		t.Fatalf("rows = %d, want 3", n)
	}
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}

// A batch whose COMMIT answered COMMIT succeeded, whatever the connection said after it (a
// fast shutdown's FATAL behind the answer): reporting it failed would tell a client to retry a
// create that exists. Without COMMIT's answer, or with another one, it did not.
func TestCommitAnsweredIsCommitted(t *testing.T) {
	fatal := &pgconn.PgError{Severity: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command"}
	if err := commitOutcome(pgconn.NewCommandTag("COMMIT"), nil, fatal); err != nil {
		t.Fatalf("COMMIT answered, then FATAL: %v; want success", err)
	}
	if err := commitOutcome(pgconn.NewCommandTag("COMMIT"), nil, nil); err != nil {
		t.Fatalf("COMMIT answered: %v", err)
	}
	if err := commitOutcome(pgconn.CommandTag{}, fatal, fatal); err == nil {
		t.Fatal("COMMIT itself failed: want the error")
	}
	if err := commitOutcome(pgconn.NewCommandTag("ROLLBACK"), nil, nil); err == nil || !strings.Contains(err.Error(), "ROLLBACK") {
		t.Fatalf("COMMIT answered ROLLBACK: %v; want an error naming it", err)
	}
}
