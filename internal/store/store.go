// Package store is the controller's only door to PostgreSQL: connection pool, embedded
// migrations, transactions and every query. Callers never import pgx; database errors are
// translated here into the sentinel errors below.
package store

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/tern/v2/migrate"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Sentinel errors callers test with errors.Is.
var (
	ErrNotFound    = errors.New("not found")
	ErrConflict    = errors.New("conflict")
	ErrInvalid     = errors.New("invalid")
	ErrUnavailable = errors.New("database unavailable")
	// ErrSimulated is the database refusing to sell a simulated host: a claim on a node that
	// runs the sim runtime, or a slot back on sale on a simulated wipe, in a session that does
	// not allow simulated hosts (migration 016).
	ErrSimulated = errors.New("simulated host refused")
	// ErrQuota is the database refusing a create that would take a tenant over a quota
	// (migration 020); the DBError's Quota says which limit, and the usage.
	ErrQuota = errors.New("quota exceeded")
)

// Store wraps a pgx pool.
type Store struct {
	pool *pgxpool.Pool
}

// Options tunes the pool.
type Options struct {
	MaxConns int32
	// MinConns are opened at start and kept open (pgxpool re-opens them as they age out), so a
	// burst does not first wait for PostgreSQL to fork and authenticate new backends.
	MinConns int32
	// Tracer, when set, sees every statement and batch the pool's connections send (tests
	// count round trips with it).
	Tracer pgx.QueryTracer
	// AllowSimulated sets gpuaas.allow_simulated = on on every connection: the database then
	// lets claims land on simulated nodes and slots return to sale on simulated wipes
	// (migration 016). Only a controller started with --allow-simulated-hosts sets it.
	AllowSimulated bool
	// AllowUntestedImages sets gpuaas.allow_untested_images = on on every connection: the
	// database then lets an image become active without a passed smoke test of its digest
	// (migration 027). Only a controller started with --allow-untested-images sets it (test
	// fixtures, never production).
	AllowUntestedImages bool
}

// AllowSimulatedParam is the session parameter that lets simulated hosts be sold (demo,
// soak, bench); without it the database refuses (migration 016).
const AllowSimulatedParam = "gpuaas.allow_simulated"

// AllowUntestedImagesParam is the session parameter that lets an image be registered or made
// active without a passed smoke test (fixtures); without it the database refuses (migration 027).
const AllowUntestedImagesParam = "gpuaas.allow_untested_images"

// Open connects to connString and checks the connection.
func Open(ctx context.Context, connString string, opts Options) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, fmt.Errorf("store: parse database url: %w", err)
	}
	if cfg.ConnConfig.ValidateConnect != nil && len(cfg.ConnConfig.Fallbacks) > 0 {
		// Several hosts, one chosen by target_session_attrs: never a former primary.
		cfg.ConnConfig.ValidateConnect = guardTimeline(cfg.ConnConfig.ValidateConnect)
	}
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	} else {
		cfg.MaxConns = 16 // callers that do not size the pool (tools, tests); the controller passes --max-db-conns
	}
	cfg.MinConns = min(opts.MinConns, cfg.MaxConns)
	if opts.Tracer != nil {
		cfg.ConnConfig.Tracer = opts.Tracer
	}
	if opts.AllowSimulated {
		cfg.ConnConfig.RuntimeParams[AllowSimulatedParam] = "on" // sent at connect: no round trip per transaction
	}
	if opts.AllowUntestedImages {
		cfg.ConnConfig.RuntimeParams[AllowUntestedImagesParam] = "on"
	}
	cfg.ConnConfig.RuntimeParams[TaskSchemasParam] = "on"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: connect: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("store: ping: %w", err)
	}
	return &Store{pool: pool}, nil
}

// Close closes the pool.
func (s *Store) Close() { s.pool.Close() }

// Ping reports whether the database answers (readiness).
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return nil
}

// Migrate applies the embedded migrations to the database at connString and returns the
// resulting schema version. tern takes an advisory lock, so concurrent controllers are safe.
func Migrate(ctx context.Context, connString string) (int32, error) {
	sub, err := fs.Sub(migrationsFS, "migrations")
	if err != nil {
		return 0, fmt.Errorf("store: migrate: %w", err)
	}
	return migrateFS(ctx, connString, sub, "public.schema_version")
}

// migrateAttempts bounds how often a migration that lost a lock conflict is run again.
const migrateAttempts = 8

// migrationLockTimeout bounds how long a migration waits for a table lock. A schema change
// queues every later statement on its table behind it, so under a rolling upgrade's traffic
// it should give up (and try again) rather than stall the serving replicas.
const migrationLockTimeout = "5s"

// migrateFS applies the migrations in fsys (NNN_name.sql at its root), recording the version
// in versionTable. Each migration runs in
// its own transaction, so one that the database aborted for a lock conflict (a deadlock with
// the serving replicas' transactions during a rolling upgrade, or a lock it waited too long
// for) is rolled back whole and run again, after a short pause, up to migrateAttempts times.
func migrateFS(ctx context.Context, connString string, fsys fs.FS, versionTable string) (int32, error) {
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		return 0, fmt.Errorf("store: migrate: connect: %w", err)
	}
	defer conn.Close(ctx)
	m, err := migrate.NewMigrator(ctx, conn, versionTable)
	if err != nil {
		return 0, fmt.Errorf("store: migrate: %w", err)
	}
	if err := m.LoadMigrations(fsys); err != nil {
		return 0, fmt.Errorf("store: load migrations: %w", err)
	}
	for _, mg := range m.Migrations {
		// In the migration's own transaction only: tern's advisory lock, which a second
		// controller starting at the same time waits on, is taken outside it.
		mg.UpSQL = "SET LOCAL lock_timeout = '" + migrationLockTimeout + "';\n" + mg.UpSQL
	}
	for attempt := 1; ; attempt++ {
		err := m.Migrate(ctx)
		if err == nil {
			break
		}
		if attempt == migrateAttempts || !lockConflict(err) {
			return 0, fmt.Errorf("store: migrate: %w", err)
		}
		pause := time.Duration(attempt) * 200 * time.Millisecond
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("store: migrate: %w (after %v)", ctx.Err(), err)
		case <-time.After(pause + rand.N(pause)):
		}
	}
	v, err := m.GetCurrentVersion(ctx)
	if err != nil {
		return 0, fmt.Errorf("store: migrate: %w", err)
	}
	return v, nil
}

// lockConflict reports a transaction the database aborted for a lock conflict, which running
// it again resolves: a deadlock, a serialization failure, or a lock not granted in time.
func lockConflict(err error) bool {
	var pgErr *pgconn.PgError
	return isRetryable(err) || errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// NewID is a new allocation id: a UUIDv7, time-ordered like the database's default for the
// tables every allocation writes (migration 010), so the indexes keyed by it grow at their
// right edge instead of at random leaves.
func NewID() string {
	return uuid.Must(uuid.NewV7()).String()
}

// MigrateForTest matches pgtest.Main's setup signature.
func MigrateForTest(ctx context.Context, connString string) error {
	_, err := Migrate(ctx, connString)
	return err
}

// Tx is a transaction handle; its methods run inside one database transaction.
type Tx struct {
	tx *txConn
}

// InTx runs fn in a transaction, committing when it returns nil. Serialization failures and
// deadlocks are retried a few times: they are the database telling us to try again.
func (s *Store) InTx(ctx context.Context, fn func(*Tx) error) error {
	var err error
	for attempt := 0; attempt < 4; attempt++ {
		err = s.inTxOnce(ctx, fn)
		if !isRetryable(err) {
			return settle(err)
		}
	}
	return &DBError{Kind: ErrUnavailable, Detail: "the database kept aborting the transaction for concurrent ones", Err: err}
}

// settle makes sure an error that ended a transaction because the database went away says so
// (ErrUnavailable), however the function that met it wrapped it: a statement inside fn whose
// connection broke is as retryable as a failed COMMIT, and callers answer it with a 503, not
// an internal error.
func settle(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) || !Unavailable(err) {
		return err
	}
	return &DBError{Kind: ErrUnavailable, Detail: err.Error(), Err: err}
}

// Unavailable reports whether err means the database could not be reached or gave up the
// session (lost or refused connection, server shutting down, recovery, too many clients, a
// read-only server), wrapped or not: the work did not happen, or its COMMIT's answer was lost,
// and a retry (idempotency keys settle the second case) is the right answer.
func Unavailable(err error) bool {
	if errors.Is(err, ErrUnavailable) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return unavailableCode(pgErr.Code)
	}
	var connErr *pgconn.ConnectError
	return errors.As(err, &connErr) || pgconn.SafeToRetry(err) || connectionLost(err)
}

// unavailableCode reports the SQLSTATEs of a server that cannot do the work now: connection
// exceptions (08), insufficient resources (53: too many clients, out of memory or disk),
// operator intervention (57: shutdown, crash of another backend, recovery) and a read-only
// server (25006: a standby reached through a stale connection).
func unavailableCode(code string) bool {
	if len(code) != 5 {
		return false
	}
	switch code[:2] {
	case "08", "53", "57":
		return true
	}
	return code == "25006"
}

func (s *Store) inTxOnce(ctx context.Context, fn func(*Tx) error) error {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return translate(err)
	}
	defer c.Release()
	tx := &txConn{conn: c.Conn()}
	defer tx.rollback(ctx) //nolint:errcheck // no-op after commit; the pool discards a connection left in a transaction
	if err := fn(&Tx{tx: tx}); err != nil {
		return err
	}
	return translate(tx.commit(ctx))
}

func isRetryable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "40001" || pgErr.Code == "40P01"
	}
	return false
}

// DBError carries a translated database error with the constraint that failed, if any.
type DBError struct {
	Kind       error
	Constraint string
	Detail     string
	// Quota, for ErrQuota, is the refusing quota as the database reported it: limit ("gpus"
	// or "allocations"), sku, region, max, used, requested.
	Quota map[string]any
	Err   error
}

func (e *DBError) Error() string {
	if e.Constraint != "" {
		return fmt.Sprintf("%v: %s (%s)", e.Kind, e.Detail, e.Constraint)
	}
	return fmt.Sprintf("%v: %s", e.Kind, e.Detail)
}

func (e *DBError) Is(target error) bool { return target == e.Kind }
func (e *DBError) Unwrap() error        { return e.Err }

// WipeGate is the constraint name of the database's refusal to put a slot back on sale before a
// verified wipe (a DBError of kind ErrConflict).
const WipeGate = "slot_wipe_gate"

// ActivationGate is the constraint name of the database's refusal to make an image active
// without a passed smoke test of its digest, and RetiredImage of its refusal to record a
// retired image on a new allocation (both DBErrors of kind ErrConflict).
const (
	ActivationGate = "image_activation_gate"
	RetiredImage   = "image_retired"
)

// translate maps pgx errors to the package's sentinels; other errors pass through.
func translate(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotFound
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", "40P01":
			return err // retried by InTx
		case "23505", "23P01": // unique_violation, exclusion_violation
			return &DBError{Kind: ErrConflict, Constraint: pgErr.ConstraintName, Detail: inOurWords(pgErr), Err: err}
		case "23514":
			if pgErr.Hint == "gpuaas:simulated_node" || pgErr.Hint == "gpuaas:simulated_wipe" {
				return &DBError{Kind: ErrSimulated, Detail: pgErr.Message, Err: err}
			}
			if pgErr.Hint == "gpuaas:quota_exceeded" {
				q := map[string]any{}
				_ = json.Unmarshal([]byte(pgErr.Detail), &q)
				return &DBError{Kind: ErrQuota, Constraint: pgErr.ConstraintName, Detail: pgErr.Message, Quota: q, Err: err}
			}
			if pgErr.ConstraintName == WipeGate {
				// The slot held a claim since its last verified wipe (migration 015).
				return &DBError{Kind: ErrConflict, Constraint: WipeGate, Detail: pgErr.Message +
					" (run `gpuaasctl slots wipe NODE INDEX --apply --wait`: a verified wipe clears it)", Err: err}
			}
			if pgErr.ConstraintName == ActivationGate || pgErr.ConstraintName == RetiredImage {
				// An image goes live only after a passed smoke test, and a retired one boots no
				// new allocation (migration 027): the request conflicts with the image's state.
				return &DBError{Kind: ErrConflict, Constraint: pgErr.ConstraintName, Detail: pgErr.Message, Err: err}
			}
			if pgErr.ConstraintName == QuarantineFence || pgErr.ConstraintName == ClearNeedsValidation {
				// A quarantined slot is never reserved, and is cleared only after a passed
				// validation (migration 018): the request conflicts with the slot's state.
				return &DBError{Kind: ErrConflict, Constraint: pgErr.ConstraintName, Detail: pgErr.Message, Err: err}
			}
			return &DBError{Kind: ErrInvalid, Constraint: pgErr.ConstraintName, Detail: inOurWords(pgErr), Err: err}
		case "23503", "23502", "22P02", "22007", "22008", "22023", "22003":
			return &DBError{Kind: ErrInvalid, Constraint: pgErr.ConstraintName, Detail: inOurWords(pgErr), Err: err}
		}
		if unavailableCode(pgErr.Code) {
			return &DBError{Kind: ErrUnavailable, Detail: pgErr.Message, Err: err}
		}
		return err
	}
	if Unavailable(err) {
		return &DBError{Kind: ErrUnavailable, Detail: err.Error(), Err: err}
	}
	return err
}

// connectionLost reports a connection that broke mid-statement (the server restarted, failed
// over, or the network dropped): the transaction did not commit unless it was the COMMIT
// itself whose answer was lost, which idempotency keys settle on retry.
func connectionLost(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var ne net.Error
	return errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.As(err, &ne)
}
