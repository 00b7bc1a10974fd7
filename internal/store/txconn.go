package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// txConn is one transaction whose BEGIN is sent late: in the same round trip as its first
// statement batch when it starts with one (pgx.Batch.BeginTx; the reservation and release
// paths do), else on its own just before its first statement. A transaction that runs no
// statement sends nothing. At 1 client a round trip to PostgreSQL costs about 0.1 ms of wall
// time here (two processes waking each other), and pgxpool.Pool.Begin's own BEGIN was 2 of
// a create+release pair's 9 round trips.
type txConn struct {
	conn *pgx.Conn // nil once begun elsewhere (a savepoint's txConn)
	tx   pgx.Tx    // nil until begun
	// nested marks a savepoint's txConn: it cannot commit the transaction (queueCommit).
	nested bool
	// committed: a COMMIT queued by queueCommit has run, so the transaction is over and
	// nothing more may run in it (a statement would otherwise run on its own, outside it).
	committed bool
}

// errCommitted is what a statement gets after the transaction was committed with a batch.
var errCommitted = errors.New("store: the transaction is already committed (its last write carried the COMMIT)")

var _ querier = (*txConn)(nil)

func (t *txConn) begin(ctx context.Context) error {
	if t.committed {
		return errCommitted
	}
	if t.tx != nil {
		return nil
	}
	tx, err := t.conn.Begin(ctx)
	if err != nil {
		return err
	}
	t.tx = tx
	return nil
}

func (t *txConn) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := t.begin(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.tx.Exec(ctx, sql, args...)
}

func (t *txConn) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	return t.tx.Query(ctx, sql, args...)
}

func (t *txConn) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.begin(ctx); err != nil {
		return errRow{err}
	}
	return t.tx.QueryRow(ctx, sql, args...)
}

// SendBatch sends b; before the transaction has begun, led by its BEGIN, whose result is
// read here so the caller reads b's results only.
func (t *txConn) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.committed {
		return pgx.FailedBatchResults(b, errCommitted)
	}
	if t.tx != nil {
		return t.tx.SendBatch(ctx, b)
	}
	withBegin := &pgx.Batch{}
	withBegin.BeginTx(pgx.TxOptions{})
	withBegin.QueuedQueries = append(withBegin.QueuedQueries, b.QueuedQueries...)
	br := t.conn.SendBatch(ctx, withBegin)
	t.tx = br.Tx() // closed already if the batch failed before its BEGIN ran
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return pgx.FailedBatchResults(b, err)
	}
	return br
}

// savepoint begins a nested transaction.
func (t *txConn) savepoint(ctx context.Context) (*txConn, error) {
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	sp, err := t.tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &txConn{tx: sp, nested: true}, nil
}

// queueCommit appends COMMIT to b, the transaction's last batch, saving the commit's own
// round trip (one per create and per release of a requested allocation), and reports whether
// it did: a savepoint cannot commit its transaction. The caller reads b's results in order and
// calls committedBy once COMMIT's result is read (it ran: whatever it returned, the
// transaction is over). Should a statement before it fail, COMMIT does not run and the
// transaction stays open, as without it.
func (t *txConn) queueCommit(b *pgx.Batch) bool {
	if t.nested || t.committed {
		return false
	}
	b.Queue("COMMIT")
	return true
}

// committedBy records that the COMMIT queueCommit queued has run.
func (t *txConn) committedBy() { t.committed = true }

// commit commits (a savepoint: releases it); a transaction that never began has nothing to
// commit.
func (t *txConn) commit(ctx context.Context) error {
	if t.tx == nil || t.committed {
		return nil
	}
	return t.tx.Commit(ctx)
}

// rollback rolls back (a savepoint: to it); a no-op after commit or before any statement.
func (t *txConn) rollback(ctx context.Context) error {
	if t.tx == nil || t.committed {
		return nil
	}
	return t.tx.Rollback(ctx)
}

// errRow is a pgx.Row that fails with err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
