// Package benchenv starts what `make bench` measures: a private PostgreSQL (the same server
// binaries and settings the controller embeds), the real gpuaas-controller binary serving
// HTTPS against it, and a fleet of H200 nodes seeded straight into the database (seeding
// 5,000 nodes through the API would measure the seeding, not the scheduler).
package benchenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/client"
	"github.com/gpuaas/gpuaas/internal/fixtures"
	"github.com/gpuaas/gpuaas/internal/pgserver"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/store"
)

// SliceSKU is the SKU the fleet's slots are sold as (seeded by migration 002).
const SliceSKU = "h200-sxm-slice"

// Env is a running database and controller.
type Env struct {
	Dir      string
	PG       *pgserver.Server
	DBURL    string
	Store    *store.Store
	DB       *pgxpool.Pool // raw SQL: seeding shortcuts and invariant checks
	StateDir string
	Server   string // https://127.0.0.1:PORT
	CAFile   string
	TenantID string
	Token    string // a tenant-scoped API token
	// PprofAddr is the controller's loopback --pprof-listen address ("" without Options.Pprof).
	PprofAddr string

	ctl     *exec.Cmd
	exited  chan error
	logFile *os.File
	hosts   int
}

// Options configures Start.
type Options struct {
	Dir        string   // work directory (created)
	BinDir     string   // holds gpuaas-controller
	ExtraFlags []string // appended to `gpuaas-controller serve`
	Pprof      bool     // serve the controller's Go profiles on a loopback port (Env.Pprof)
	// Statements loads pg_stat_statements, so a run can report where PostgreSQL's time went
	// (Env.TopStatements).
	Statements bool
	// DatabaseURL, when set, is a running database (e.g. a primary and its standby in a
	// multi-host URL) used instead of a private PostgreSQL; Stop leaves it running.
	DatabaseURL string
}

// Start boots PostgreSQL, migrates, seeds a tenant, its token and a slice image, and starts
// the controller. Stop undoes it.
func Start(ctx context.Context, o Options) (*Env, error) {
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.Chmod(o.Dir, 0o755); err != nil { // the postgres user traverses it when run as root
		return nil, err
	}
	e := &Env{Dir: o.Dir, DBURL: o.DatabaseURL, StateDir: filepath.Join(o.Dir, "state")}
	if e.DBURL == "" {
		pgo := pgserver.Options{Dir: filepath.Join(o.Dir, "pg")}
		if o.Statements {
			pgo.Settings = []string{"shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track=all"}
		}
		pg, err := pgserver.Start(ctx, pgo)
		if err != nil {
			return nil, fmt.Errorf("postgres: %w", err)
		}
		e.PG, e.DBURL = pg, pg.ConnString("postgres")
	}
	var err error
	if o.Pprof {
		if e.PprofAddr, err = freeLoopback(); err != nil {
			e.Stop()
			return nil, err
		}
	}
	if err := e.prepare(ctx); err != nil {
		e.Stop()
		return nil, err
	}
	if err := e.StartController(ctx, o.BinDir, o.ExtraFlags...); err != nil {
		e.Stop()
		return nil, err
	}
	return e, nil
}

func (e *Env) prepare(ctx context.Context) error {
	if _, err := store.Migrate(ctx, e.DBURL); err != nil {
		return err
	}
	st, err := store.Open(ctx, e.DBURL, store.Options{MaxConns: 8, AllowSimulated: true, AllowUntestedImages: true}) // the harness's own view of its sim fleet
	if err != nil {
		return err
	}
	e.Store = st
	if e.DB, err = pgxpool.New(ctx, e.DBURL); err != nil {
		return err
	}
	tok, err := pki.NewToken("gpa_")
	if err != nil {
		return err
	}
	e.Token = tok
	return st.InTx(ctx, func(tx *store.Tx) error {
		t, err := tx.CreateTenant(ctx, "bench")
		if err != nil {
			return err
		}
		e.TenantID = t.ID
		if _, err := tx.CreateToken(ctx, "bench-tenant", pki.HashToken(tok), "tenant", t.ID, nil); err != nil {
			return err
		}
		_, err = tx.CreateImage(ctx, apiv1.OSImage{Slug: "bench-slice-image", DisplayName: "bench", Version: "1", Target: "vm_slice",
			Family: "debian", Architecture: "amd64", ImageFormat: "qcow2", SourceType: "http", SourceRef: "https://images.example/bench.qcow2",
			DigestSHA256: strings.Repeat("ab", 32), DefaultUsername: "debian", DriverStrategy: "none", Active: true})
		return err
	})
}

// StartController runs bin/gpuaas-controller serve against the database and waits until it
// answers /healthz.
func (e *Env) StartController(ctx context.Context, binDir string, extra ...string) error {
	lf, err := os.Create(filepath.Join(e.Dir, "controller.log"))
	if err != nil {
		return err
	}
	e.logFile = lf
	_ = os.Remove(filepath.Join(e.StateDir, "controller.addr"))
	args := append([]string{"serve", "--state-dir", e.StateDir, "--listen", "127.0.0.1:0",
		"--database-url", e.DBURL, "--log-level", "warn", "--reconcile-interval", "0"}, extra...)
	if e.PprofAddr != "" {
		args = append(args, "--pprof-listen", e.PprofAddr)
	}
	e.ctl = exec.Command(filepath.Join(binDir, "gpuaas-controller"), args...)
	// Every host these harnesses enroll runs the sim runtime (bench, soak, faults), which a
	// controller sells only when told to. Said through the environment, not a flag, so an
	// A/B run's older binary (which has no such flag) still starts. Their fixture images are
	// registered active, never smoke-tested: the same way, untested images are allowed.
	e.ctl.Env = append(os.Environ(), "GPUAAS_ALLOW_SIMULATED_HOSTS=true", "GPUAAS_ALLOW_UNTESTED_IMAGES=true")
	e.ctl.Stdout, e.ctl.Stderr = lf, lf
	e.ctl.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM} // never outlive the bench
	if err := e.ctl.Start(); err != nil {
		return err
	}
	e.exited = make(chan error, 1)
	go func() { e.exited <- e.ctl.Wait() }()
	e.CAFile = pki.Paths{Dir: e.StateDir}.CACert()
	deadline := time.Now().Add(90 * time.Second)
	for {
		if b, err := os.ReadFile(filepath.Join(e.StateDir, "controller.addr")); err == nil {
			e.Server = "https://" + strings.TrimSpace(string(b))
			c, err := e.Client()
			if err == nil {
				if _, err = c.Whoami(ctx); err == nil {
					return nil
				}
			}
		}
		select {
		case err := <-e.exited:
			// Reaped here: nothing is left for StopController to wait for (it would wait
			// forever on the delivered exit).
			e.ctl = nil
			lf.Close()
			log, _ := os.ReadFile(lf.Name())
			return fmt.Errorf("controller exited: %v\n%s", err, log)
		case <-ctx.Done():
			e.StopController()
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			e.StopController()
			return errors.New("controller not ready after 90s")
		}
	}
}

// PID is the controller's process id.
func (e *Env) PID() int { return e.ctl.Process.Pid }

// Pprof fetches path (e.g. "/debug/pprof/heap?debug=1") from the controller's profiles.
func (e *Env) Pprof(ctx context.Context, path string) ([]byte, error) {
	if e.PprofAddr == "" {
		return nil, errors.New("the controller serves no profiles (benchenv.Options.Pprof)")
	}
	return e.get(ctx, "https://"+e.PprofAddr+path) // the profile listener is TLS, like the API
}

// Metric reads one unlabelled counter or gauge from the controller's /metrics.
func (e *Env) Metric(ctx context.Context, name string) (float64, error) {
	b, err := e.get(ctx, e.Server+"/metrics")
	if err != nil {
		return 0, err
	}
	return metricValue(b, name)
}

// metricValue finds "name value" in a Prometheus text exposition.
func metricValue(exposition []byte, name string) (float64, error) {
	for _, line := range strings.Split(string(exposition), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("the controller's /metrics has no %s", name)
}

// get fetches url over TLS trusting the controller's CA.
func (e *Env) get(ctx context.Context, url string) ([]byte, error) {
	tlsCfg, err := pki.ClientTLSConfig(e.CAFile)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return b, nil
}

func freeLoopback() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// Client is a new API client (its own connection pool) with the tenant token.
func (e *Env) Client() (*client.Client, error) {
	return client.New(client.Options{Server: e.Server, CAFile: e.CAFile, Token: e.Token, UserAgent: "gpuaas-bench"})
}

// StopController stops the controller (SIGTERM, then SIGKILL after 20 s).
func (e *Env) StopController() {
	if e.ctl == nil || e.ctl.Process == nil {
		return
	}
	StopProcess(e.ctl.Process, e.exited)
	e.ctl = nil
	if e.logFile != nil {
		e.logFile.Close()
	}
}

// Stop stops the controller and PostgreSQL.
func (e *Env) Stop() {
	e.StopController()
	if e.Store != nil {
		e.Store.Close()
	}
	if e.DB != nil {
		e.DB.Close()
	}
	if e.PG != nil {
		_ = e.PG.Stop()
	}
}

// slot is fixtures.H200Slot with identities unique across a fleet of up to 65,536 hosts.
func slot(host, i int) apiv1.SlotSpec {
	s := fixtures.H200Slot(0, i)
	s.NVMeDevice = fmt.Sprintf("/dev/disk/by-id/nvme-eui.%012x%04x", host+1, i)
	s.MACAddress = fmt.Sprintf("52:54:%02x:%02x:00:%02x", host>>8, host&0xff, i)
	s.PrivateIP = fmt.Sprintf("10.%d.%d.%d", 64+host>>8, host&0xff, 10+i)
	return s
}

// AddNodes registers n more 8-slot H200 nodes with approved slots and a fresh heartbeat,
// and returns their ids.
func (e *Env) AddNodes(ctx context.Context, n int) ([]string, error) {
	ids := make([]string, 0, n)
	for done := 0; done < n; {
		batch := min(250, n-done)
		err := e.Store.InTx(ctx, func(tx *store.Tx) error {
			for k := 0; k < batch; k++ {
				h := e.hosts + done + k
				nd, err := tx.CreateNode(ctx, apiv1.NodeCreate{Name: fmt.Sprintf("bench-%05d", h), Region: "bench",
					SKU: "h200-sxm-baremetal-8g", SliceSKU: SliceSKU})
				if err != nil {
					return err
				}
				specs := make([]apiv1.SlotSpec, 8)
				for i := range specs {
					specs[i] = slot(h, i)
				}
				if _, err := tx.ApplySlots(ctx, nd.ID, specs, false); err != nil {
					return err
				}
				ids = append(ids, nd.ID)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		done += batch
	}
	e.hosts += n
	return ids, e.Heartbeat(ctx)
}

// Heartbeat marks every node as heard from now (the scheduler skips silent nodes). It locks
// the rows in id order, as the controller's own many-node updates do: a plain UPDATE of every
// node locks them in table order and deadlocked once with a replica's hint refresh.
func (e *Env) Heartbeat(ctx context.Context) error {
	return e.Exec(ctx, `WITH l AS MATERIALIZED (SELECT id FROM nodes ORDER BY id FOR NO KEY UPDATE)
		UPDATE nodes n SET last_heartbeat_at = now() FROM l WHERE n.id = l.id`)
}

// Exec runs one SQL statement.
func (e *Env) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := e.DB.Exec(ctx, sql, args...)
	return err
}

// Int runs a query returning one integer.
func (e *Env) Int(ctx context.Context, sql string, args ...any) (int, error) {
	var n int
	err := e.DB.QueryRow(ctx, sql, args...).Scan(&n)
	return n, err
}

// Median is the middle of xs (the mean of the middle two for an even count; 0 when empty).
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Percentile is the p-th percentile (nearest rank) of ds in milliseconds; 0 for none.
func Percentile(ds []time.Duration, p int) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (len(s)*p + 99) / 100
	return float64(s[max(i-1, 0)].Microseconds()) / 1000
}

// WALNow is PostgreSQL's WAL insert position in bytes: the difference of two readings is the
// WAL every backend wrote between them (full-page images included), which is what a commit
// waits to flush.
func (e *Env) WALNow(ctx context.Context) (int64, error) {
	var b int64
	err := e.DB.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint`).Scan(&b)
	return b, err
}
