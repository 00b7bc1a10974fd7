package store

import (
	"context"
	"encoding/json"
	"net"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// querier is what both the pool and a transaction offer; read helpers take it so the same
// query runs inside or outside a transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// nullIfEmpty turns "" into SQL NULL for optional uuid/text columns.
// rawJSON scans a json/jsonb column into a json.RawMessage as plain bytes: the database has
// already validated them, and scanning into the RawMessage itself would run encoding/json's
// validator over every snapshot read (5% of the controller's CPU on the create path).
func rawJSON(m *json.RawMessage) *[]byte { return (*[]byte)(m) }

func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// queryAll runs a query and scans every row with scan; the one place rows are iterated.
func queryAll[T any](ctx context.Context, q querier, scan func(pgx.Row, *T) error, sql string, args ...any) ([]T, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, translate(err)
	}
	defer rows.Close()
	out := []T{}
	for rows.Next() {
		var v T
		if err := scan(rows, &v); err != nil {
			return nil, translate(err)
		}
		out = append(out, v)
	}
	return out, translate(rows.Err())
}

// noSuchID is a UUID no row has: what a malformed id is looked up as, so that a query keeps
// comparing uuid columns with uuid values (an index) and simply finds nothing.
const noSuchID = "00000000-0000-0000-0000-000000000000"

// uuidArg is s when it is a UUID, else noSuchID; use it as $n::uuid.
func uuidArg(s string) string {
	if IsUUID(s) {
		return s
	}
	return noSuchID
}

// optUUID is nil for "" (the filter is off: "$n::uuid IS NULL OR col = $n::uuid"), else uuidArg(s).
func optUUID(s string) any {
	if s == "" {
		return nil
	}
	return uuidArg(s)
}

// uuidsArg maps ids through uuidArg for "col = ANY($n::uuid[])", as values pgx sends in
// binary: a []string for a uuid[] parameter is first tried in binary, fails, and is sent as
// text, and building that failure's error message each time was 2% of the controller's CPU
// under create+release load.
func uuidsArg(ids []string) []pgtype.UUID {
	out := make([]pgtype.UUID, len(ids))
	for i, s := range ids {
		if err := out[i].Scan(uuidArg(s)); err != nil { // uuidArg gives a well-formed UUID
			_ = out[i].Scan(noSuchID)
		}
	}
	return out
}

// IsUUID reports whether s is a UUID in its canonical text form (8-4-4-4-12 hex digits, either
// case). It runs for every id a request names, so it is a loop, not a regular expression.
func IsUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
	}
	return true
}

// IsLocalDatabase reports whether url ("" = the controller's embedded cluster) reaches
// PostgreSQL on this machine: a Unix socket, localhost or a loopback address (the first host
// of a list, the one dialled first). A URL that does not parse counts as remote (opening the
// pool reports it).
func IsLocalDatabase(url string) bool {
	if url == "" {
		return true
	}
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return false
	}
	host := cfg.Host
	if strings.HasPrefix(host, "/") || host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
