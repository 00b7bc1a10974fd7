package benchenv

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gpuaas/gpuaas/internal/pgserver"
	"github.com/gpuaas/gpuaas/internal/store"
)

// Adopt is an Env over a PostgreSQL and a state directory made elsewhere (a restored backup):
// its pools are opened, no controller is started (StartController does that) and nothing is
// seeded. token is the tenant token the database already holds.
func Adopt(ctx context.Context, dir string, pg *pgserver.Server, stateDir, token string) (*Env, error) {
	e := &Env{Dir: dir, PG: pg, DBURL: pg.ConnString("postgres"), StateDir: stateDir, Token: token}
	var err error
	if e.Store, err = store.Open(ctx, e.DBURL, store.Options{MaxConns: 8, AllowSimulated: true, AllowUntestedImages: true}); err != nil {
		return nil, err
	}
	if e.DB, err = pgxpool.New(ctx, e.DBURL); err != nil {
		e.Store.Close()
		return nil, err
	}
	return e, nil
}
