package controller

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/api"
	"github.com/gpuaas/gpuaas/internal/demand"
	"github.com/gpuaas/gpuaas/internal/dispatch"
	"github.com/gpuaas/gpuaas/internal/gctune"
	"github.com/gpuaas/gpuaas/internal/imagesig"
	"github.com/gpuaas/gpuaas/internal/pgserver"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/webhook"
)

// embeddedDB is the database name inside the private cluster.
const embeddedDB = "gpuaas"

// database opens the configured database, starting the private cluster when no URL is set.
// The returned stop func stops what was started.
func database(ctx context.Context, cfg Config, log *slog.Logger) (url string, stop func(), err error) {
	if cfg.DatabaseURL != "" {
		return cfg.DatabaseURL, func() {}, nil
	}
	if os.Geteuid() == 0 {
		// The embedded cluster runs as the postgres user, which must traverse the state dir
		// to reach postgres/. 0711 lets it pass without listing; secrets stay in 0700 tls/
		// and keys/ and 0600 files.
		if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
			return "", nil, err
		}
		if err := os.Chmod(cfg.StateDir, 0o711); err != nil {
			return "", nil, err
		}
	}
	srv, err := pgserver.Start(ctx, pgserver.Options{Dir: filepath.Join(cfg.StateDir, "postgres"), Logger: log})
	if err != nil {
		return "", nil, fmt.Errorf("embedded postgres: %w", err)
	}
	stop = func() {
		if err := srv.Stop(); err != nil {
			log.Error("embedded postgres stop", "err", err)
		}
	}
	if err := srv.CreateDatabase(ctx, embeddedDB, ""); err != nil && !strings.Contains(err.Error(), "already exists") {
		stop()
		return "", nil, fmt.Errorf("embedded postgres: create database: %w", err)
	}
	log.Info("embedded postgres running", "dir", filepath.Join(cfg.StateDir, "postgres"))
	return srv.ConnString(embeddedDB), stop, nil
}

// Init creates the state directory's TLS material, signing key and first admin token.
func Init(cfg Config) (pki.InitResult, error) {
	return pki.Init(pki.InitOptions{Dir: cfg.StateDir, Hostnames: cfg.Hostnames})
}

// Migrate applies migrations to the configured (or embedded) database.
func Migrate(ctx context.Context, cfg Config, log *slog.Logger) (int32, error) {
	url, stop, err := database(ctx, cfg, log)
	if err != nil {
		return 0, err
	}
	defer stop()
	return store.Migrate(ctx, url)
}

// ensureAdminToken registers DIR/admin.token in the database if it is not there yet, so a
// fresh (or replaced) database always accepts the operator's first token.
func ensureAdminToken(ctx context.Context, st *store.Store, dir string) error {
	p := pki.Paths{Dir: dir}
	b, err := os.ReadFile(p.AdminToken())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return fmt.Errorf("%s is empty", p.AdminToken())
	}
	hash := pki.HashToken(tok)
	ok, err := st.TokenHashExists(ctx, hash)
	if err != nil || ok {
		return err
	}
	return st.InTx(ctx, func(tx *store.Tx) error {
		id, err := tx.CreateToken(ctx, "bootstrap-admin", hash, "admin", "", nil)
		if err != nil {
			return err
		}
		return tx.Audit(ctx, store.AuditRecord{Actor: "gpuaas-controller", ActorRole: "system", Action: "token.bootstrap",
			TargetKind: "api_token", TargetID: id, Details: map[string]any{"file": p.AdminToken()}})
	})
}

// Serve runs the controller until ctx is cancelled.
func Serve(ctx context.Context, cfg Config, version string, log *slog.Logger) error {
	res, err := Init(cfg)
	if err != nil {
		return fmt.Errorf("pki.Init: %w", err)
	}
	if tu := gctune.Start(uint64(cfg.GCHeadroomMiB)<<20, nil); tu != nil {
		defer tu.Stop()
		log.Debug("garbage collection headroom", "mib", cfg.GCHeadroomMiB)
	}
	procs, _ := parseMaxProcs(cfg.MaxProcs) // validated by loadConfig
	n, why := applyMaxProcs(procs, cfg.DatabaseURL, os.Getenv("GOMAXPROCS") != "")
	log.Info("scheduling on CPUs", "gomaxprocs", n, "cpus", runtime.NumCPU(), "why", why)
	if len(res.Created) > 0 {
		log.Info("initialized state directory", "dir", cfg.StateDir, "created", res.Created)
	}
	url, stopDB, err := database(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer stopDB()
	v, err := store.Migrate(ctx, url)
	if err != nil {
		return err
	}
	log.Info("database migrated", "version", v)
	if cfg.AllowSimulatedHosts {
		log.Warn("simulated hosts allowed: nodes running the sim runtime are sold and their simulated wipes accepted (--allow-simulated-hosts)")
	}
	if cfg.AllowUntestedImages {
		log.Warn("untested images allowed: images may be registered or activated without a passed smoke test (--allow-untested-images)")
	}
	var imageKeys []imagesig.Key
	if cfg.ImageKeys != "" {
		b, err := os.ReadFile(cfg.ImageKeys)
		if err != nil {
			return fmt.Errorf("image keys: %w", err)
		}
		if imageKeys, err = imagesig.ParseKeys(b); err != nil {
			return fmt.Errorf("image keys %s: %w", cfg.ImageKeys, err)
		}
		log.Info("trusted image publisher keys loaded", "file", cfg.ImageKeys, "keys", len(imageKeys))
	}
	st, err := store.Open(ctx, url, store.Options{MaxConns: cfg.MaxDBConns, AllowSimulated: cfg.AllowSimulatedHosts, AllowUntestedImages: cfg.AllowUntestedImages})
	if err != nil {
		return err
	}
	defer st.Close()
	if behind, err := st.EventClockBehind(ctx); err != nil {
		return fmt.Errorf("event log: %w", err)
	} else if behind {
		log.Error("the event log holds transaction ids this PostgreSQL cluster has not reached (restored from a logical dump?): new events would sort before the cursors clients and webhooks hold and never reach them; advance the cluster's next transaction id past them (pg_resetwal -x) before serving")
	}
	if err := ensureAdminToken(ctx, st, cfg.StateDir); err != nil {
		return fmt.Errorf("admin token: %w", err)
	}
	svc := alloc.New(st, alloc.Config{HeartbeatMaxAge: cfg.HeartbeatMaxAge, AllowSimulated: cfg.AllowSimulatedHosts})
	// The demand mix placement protects, learned from this and every other replica's
	// requests (internal/demand). It outlives the HTTPS server (deferred before it shuts
	// down, run after): its last flush counts the last requests served.
	learner := demand.New(st, demand.Config{Log: log})
	svc.SetDemand(learner)
	learnCtx, stopLearning := context.WithCancel(context.Background())
	learned := make(chan struct{})
	go func() { learner.Run(learnCtx); close(learned) }()
	defer func() { stopLearning(); <-learned }()
	signKey, err := pki.LoadSigningKey(cfg.StateDir)
	if err != nil {
		return fmt.Errorf("task signing key: %w", err)
	}
	signPub, err := os.ReadFile(pki.Paths{Dir: cfg.StateDir}.SigningPub())
	if err != nil {
		return fmt.Errorf("task signing key: %w", err)
	}
	ca, err := pki.LoadCA(cfg.StateDir)
	if err != nil {
		return fmt.Errorf("ca: %w", err)
	}
	// Host traffic (long polls, results) and the dispatcher's background work get their own
	// pool: a burst of tenant requests holding every API connection must not starve the
	// outbox worker or hosts' leases (nor the reverse).
	// Its connections are all opened at start and kept: the first leases of a burst of
	// creates must not wait for new backends while the tenant pool keeps the CPU busy (a cold
	// host pool added 100-300 ms to the first provisioning phase of each host).
	hostConns := max(8, cfg.MaxDBConns/2)
	hostSt, err := store.Open(ctx, url, store.Options{MaxConns: hostConns, MinConns: hostConns, AllowSimulated: cfg.AllowSimulatedHosts, AllowUntestedImages: cfg.AllowUntestedImages})
	if err != nil {
		return err
	}
	defer hostSt.Close()
	nodeCA := x509.NewCertPool() // hosts' wipe proofs are checked against the node certificates it issues
	nodeCA.AddCert(ca.Cert)
	hostSvc := alloc.New(hostSt, alloc.Config{HeartbeatMaxAge: cfg.HeartbeatMaxAge, AllowSimulated: cfg.AllowSimulatedHosts})
	hostSvc.SetDemand(learner) // replacements rank with the same mix; only creates count
	disp := dispatch.New(hostSt, hostSvc, signKey, log, dispatch.Config{Lease: cfg.TaskLease, ProvisionTTL: cfg.ProvisionTTL,
		ReconcileEvery: cfg.ReconcileInterval, ReconcileMaxAge: cfg.HeartbeatMaxAge, NoReplicaWakeups: !cfg.ReplicaWakeups, AllowSimulated: cfg.AllowSimulatedHosts, NodeCA: nodeCA,
		ImageKeys: imageKeys})
	dctx, stopDispatch := context.WithCancel(ctx)
	defer stopDispatch()
	go disp.Run(dctx)
	// The API's creates queue their slice's provisioning task in the create transaction and
	// wake its host through this dispatcher (no outbox hop).
	svc.SetTaskPlanner(disp)
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	defer ln.Close()
	advertise, replicaTLS, err := replicaIdentity(cfg, ln.Addr(), ca, log)
	if err != nil {
		return err
	}
	apiSrv := api.New(api.Options{Store: st, Alloc: svc, Logger: log, Version: version, Dispatch: disp, CA: ca, SigningPub: signPub,
		Terminal:     api.TerminalConfig{Idle: cfg.TerminalIdle, MaxPerTenant: cfg.TerminalMaxPerTenant, RecordDir: cfg.TerminalRecordDir},
		AdvertiseURL: advertise, ReplicaTLS: replicaTLS, WebhookAllowPrivate: cfg.WebhookAllowPrivate, ImageKeys: imageKeys,
		HeartbeatMaxAge: cfg.HeartbeatMaxAge, ServerCert: serverLeaf(cfg.StateDir)})
	if err := apiSrv.EndStaleSessions(ctx); err != nil {
		return fmt.Errorf("terminal sessions of this replica's previous run: %w", err)
	}

	go apiSrv.RunBackground(dctx)
	hooks, err := webhookDeliverer(cfg, hostSt, log)
	if err != nil {
		return err
	}
	go hooks.Run(dctx)
	go pruneEvents(dctx, hostSt, cfg.EventRetention, log)
	tlsCfg, err := pki.ServerTLSConfig(cfg.StateDir)
	if err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	if cfg.PprofListen != "" {
		stopPprof, err := servePprof(cfg.PprofListen, tlsCfg, log)
		if err != nil {
			return err
		}
		defer stopPprof()
	}
	addrFile := filepath.Join(cfg.StateDir, "controller.addr")
	if err := pki.WriteFileAtomic(addrFile, []byte(ln.Addr().String()+"\n"), 0o644); err != nil {
		ln.Close()
		return err
	}
	// Requests (long polls above all) end promptly when shutdown begins.
	baseCtx, cancelRequests := context.WithCancel(context.Background())
	defer cancelRequests()
	hs := &http.Server{
		BaseContext:       func(net.Listener) context.Context { return baseCtx },
		Handler:           apiSrv.Handler(),
		TLSConfig:         tlsCfg,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.ServeTLS(ln, "", "") }()
	log.Info("gpuaas-controller serving", "addr", "https://"+ln.Addr().String(), "advertise_url", advertise, "version", version,
		"ca", pki.Paths{Dir: cfg.StateDir}.CACert(), "admin_token", pki.Paths{Dir: cfg.StateDir}.AdminToken())
	_, _ = daemon.SdNotify(false, daemon.SdNotifyReady)

	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("https: %w", err)
		}
	}
	_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping)
	log.Info("shutting down")
	cancelRequests()
	sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	// Terminal sessions run on hijacked connections, which Shutdown does not track: end and
	// record them here, telling their clients why.
	apiSrv.EndAllSessions("controller replica shutting down")
	_ = os.Remove(addrFile)
	return nil
}

// serverLeaf is the server certificate in the state directory (nil when unreadable: its
// expiry is then simply not reported).
func serverLeaf(dir string) *x509.Certificate {
	pair, err := tls.LoadX509KeyPair(pki.Paths{Dir: dir}.ServerCert(), pki.Paths{Dir: dir}.ServerKey())
	if err != nil {
		return nil
	}
	return pair.Leaf
}

// replicaIdentity is this replica's advertised URL and its client configuration for reaching
// other replicas (a controller certificate minted from the CA). A server certificate that
// does not name the advertised host is logged: other replicas would refuse to relay to it.
func replicaIdentity(cfg Config, bound net.Addr, ca *pki.CA, log *slog.Logger) (string, *tls.Config, error) {
	adv, err := advertiseURL(cfg, bound)
	if err != nil {
		return "", nil, err
	}
	u, err := url.Parse(adv)
	if err != nil {
		return "", nil, fmt.Errorf("--advertise-url: %w", err)
	}
	if pair, err := tls.LoadX509KeyPair(pki.Paths{Dir: cfg.StateDir}.ServerCert(), pki.Paths{Dir: cfg.StateDir}.ServerKey()); err == nil && pair.Leaf != nil {
		if err := pair.Leaf.VerifyHostname(u.Hostname()); err != nil {
			log.Warn("the server certificate does not name this replica's advertised host: other replicas cannot relay terminal sessions to it "+
				"(add it with `gpuaas-controller init --hostname`, or set --advertise-url)", "advertise_url", adv, "err", err)
		}
	}
	replicaTLS, err := ca.ReplicaTLSConfig(u.Host)
	if err != nil {
		return "", nil, fmt.Errorf("replica credentials: %w", err)
	}
	return adv, replicaTLS, nil
}

// servePprof serves Go's runtime profiles on a loopback address (validated by config), over
// TLS like every other listener of the controller: nothing it serves is plaintext.
func servePprof(addr string, tlsCfg *tls.Config, log *slog.Logger) (func(), error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--pprof-listen: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, TLSConfig: tlsCfg.Clone()}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	log.Info("pprof serving", "addr", "https://"+ln.Addr().String()+"/debug/pprof/")
	return func() { _ = srv.Close() }, nil
}

// webhookDeliverer runs this replica's share of webhook deliveries, on the background pool
// beside the dispatcher (no connection is held while a receiver answers). Receivers'
// certificates chain to the system roots, plus --webhook-ca-file.
func webhookDeliverer(cfg Config, st *store.Store, log *slog.Logger) (*webhook.Deliverer, error) {
	wc := webhook.Config{AllowPrivate: cfg.WebhookAllowPrivate}
	if cfg.WebhookCAFile != "" {
		pem, err := os.ReadFile(cfg.WebhookCAFile)
		if err != nil {
			return nil, fmt.Errorf("--webhook-ca-file: %w", err)
		}
		roots, err := x509.SystemCertPool()
		if err != nil || roots == nil {
			roots = x509.NewCertPool()
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--webhook-ca-file %s: no PEM certificate in it", cfg.WebhookCAFile)
		}
		wc.RootCAs = roots
	}
	return webhook.New(st, wc, log), nil
}
