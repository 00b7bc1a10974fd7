// Package api is the controller's HTTPS JSON API (/api/v1): routing, authentication,
// authorization, request validation, error mapping, OpenAPI document and metrics.
package api

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpuaas/gpuaas/internal/alloc"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/dispatch"
	"github.com/gpuaas/gpuaas/internal/imagesig"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
	"github.com/gpuaas/gpuaas/internal/terminal"
)

// Options configures the API.
type Options struct {
	Store   *store.Store
	Alloc   *alloc.Service
	Logger  *slog.Logger
	Version string
	// Registry receives the API's metrics; nil makes a private one.
	Registry *prometheus.Registry
	// Dispatch delivers node tasks; nil disables the agent endpoints.
	Dispatch *dispatch.Dispatcher
	// CA signs node certificates at enrollment; SigningPub is the task-signing public key
	// (PEM) handed to enrolling hosts to pin.
	CA         *pki.CA
	SigningPub []byte
	// Terminal tunes the SSH relay (gpuaasctl ssh).
	Terminal TerminalConfig
	// Security tunes authentication rate limits and certificate renewal.
	Security SecurityConfig
	// AdvertiseURL is this replica's own address for other replicas (recorded as the owner of
	// the terminal sessions it opens); ReplicaTLS (pki.CA.ReplicaTLSConfig) reaches another
	// replica with a controller certificate. Without them sessions are served where opened.
	AdvertiseURL string
	ReplicaTLS   *tls.Config
	// WebhookAllowPrivate accepts webhook URLs whose address literal is internal (loopback,
	// private, link-local); the deliverer checks every connection the same way.
	WebhookAllowPrivate bool
	// ImageKeys are the trusted image publisher keys: an image's signature must verify
	// against one of them to be recorded.
	ImageKeys []imagesig.Key
	// HeartbeatMaxAge is the heartbeat age past which /metrics counts an active node as
	// missing (gpuaas_nodes_heartbeat_stale); 0 means 2 minutes.
	HeartbeatMaxAge time.Duration
	// ServerCert is this replica's server certificate, whose expiry /metrics reports beside
	// the CA's; nil reports the CA's alone.
	ServerCert *x509.Certificate
}

// Server serves the API.
type Server struct {
	store   *store.Store
	alloc   *alloc.Service
	log     *slog.Logger
	version string
	mux     *http.ServeMux
	reg     *prometheus.Registry

	dispatch   *dispatch.Dispatcher
	ca         *pki.CA
	signingPub []byte
	hb         heartbeats
	term       *terminal.Hub
	termCfg    TerminalConfig
	advertise  string      // this replica's URL for other replicas
	replicaTLS *tls.Config // client config reaching other replicas (controller certificate)
	imageKeys  []imagesig.Key
	routeTable []route
	requests   *prometheus.CounterVec
	latency    *prometheus.HistogramVec
	tokens     *authCache[store.TokenRecord] // by token hash
	nodeCerts  *authCache[string]            // node id by certificate serial
	secCfg     SecurityConfig
	authFails  *ipLimiter // authentication failures per client IP
	enrolls    *ipLimiter // failed enrollments per client IP
	events     *eventWaiters

	webhookAllowPrivate bool
}

// New builds the API handler tree.
func New(opts Options) *Server {
	s := &Server{store: opts.Store, alloc: opts.Alloc, log: opts.Logger, version: opts.Version, mux: http.NewServeMux(), reg: opts.Registry,
		dispatch: opts.Dispatch, ca: opts.CA, signingPub: opts.SigningPub, imageKeys: opts.ImageKeys, hb: heartbeats{pending: map[string]store.HeartbeatRecord{}, wake: make(chan struct{}, 1)},
		tokens: newAuthCache[store.TokenRecord](tokenCacheTTL), nodeCerts: newAuthCache[string](nodeCertCacheTTL),
		advertise: opts.AdvertiseURL, replicaTLS: opts.ReplicaTLS, events: &eventWaiters{st: opts.Store},
		webhookAllowPrivate: opts.WebhookAllowPrivate}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.termCfg = opts.Terminal
	s.termCfg.defaults()
	s.secCfg = opts.Security
	s.secCfg.defaults()
	s.authFails = newIPLimiter(s.secCfg.AuthFailures, s.secCfg.Now)
	s.enrolls = newIPLimiter(s.secCfg.Enroll, s.secCfg.Now)
	s.term = &terminal.Hub{Idle: s.termCfg.Idle, RecordDir: s.termCfg.RecordDir, OnEnd: s.sessionEnded}
	if s.reg == nil {
		s.reg = prometheus.NewRegistry()
		s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuaas_api_requests_total", Help: "API requests by route and status code.",
	}, []string{"route", "code"})
	s.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "gpuaas_api_request_seconds", Help: "API request latency by route.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	}, []string{"route"})
	s.reg.MustRegister(s.requests, s.latency)
	if s.store != nil {
		s.reg.MustRegister(newQuarantinedSlots(s.store))
	}
	if s.alloc != nil {
		s.reg.MustRegister(
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "gpuaas_placement_windows_total",
				Help: "Best-fit node windows read by slice reservations."},
				func() float64 { return float64(s.alloc.Stats().Windows) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "gpuaas_placement_fleet_scans_total",
				Help: "Slice reservations that ranked every candidate of the fleet (no best-fit window settled them)."},
				func() float64 { return float64(s.alloc.Stats().FleetScans) }))
	}
	if s.store != nil {
		stale := opts.HeartbeatMaxAge
		if stale <= 0 {
			stale = 2 * time.Minute
		}
		certs := map[string]*x509.Certificate{"server": opts.ServerCert}
		if s.ca != nil {
			certs["ca"] = s.ca.Cert
		}
		s.reg.MustRegister(&fleetCollector{store: s.store, staleAfter: stale, certs: certs, cacheFor: 10 * time.Second})
	}
	s.routes()
	return s
}

// Handler returns the root handler.
func (s *Server) Handler() http.Handler { return s.mux }

// Registry exposes the metrics registry so other subsystems can register collectors.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

type role int

const (
	public role = iota
	anyUser
	adminOnly
	nodeOnly       // mTLS node certificate
	controllerOnly // mTLS controller certificate (another replica)
)

// handlerFunc is an authenticated handler; returning an error writes it as apiv1.Error.
type handlerFunc func(w http.ResponseWriter, r *http.Request, p Principal) error

type statusRecorder struct {
	http.ResponseWriter
	code int
}

// Unwrap lets http.ResponseController reach the connection (the terminal relay hijacks it).
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (r *statusRecorder) WriteHeader(code int) {
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

func (s *Server) wrap(route string, need role, h handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		reqID := r.Header.Get("X-Request-Id")
		if reqID == "" || len(reqID) > 64 {
			reqID = newRequestID()
		}
		rec.Header().Set("X-Request-Id", reqID)
		ctx := context.WithValue(r.Context(), requestIDKey{}, reqID)
		r = r.WithContext(ctx)

		var p Principal
		var err error
		if need == nodeOnly {
			p, err = s.authenticateNode(r)
		} else if need == controllerOnly {
			p, err = s.authenticateController(r)
		} else if need != public {
			p, err = s.authenticate(r)
			if err == nil && need == adminOnly && p.Role != "admin" {
				err = errForbidden("admin role required")
			}
		}
		if err == nil {
			err = checkRequestText(r)
		}
		if err == nil && route != "notfound" {
			err = checkQueryNames(r, route)
		}
		if err == nil {
			err = h(rec, r, p)
		}
		if err != nil {
			err = s.throttleFailure(r, err)
			s.writeError(rec, r, err)
		}
		s.requests.WithLabelValues(route, strconv.Itoa(rec.code)).Inc()
		s.latency.WithLabelValues(route).Observe(time.Since(start).Seconds())
		if rec.code >= 500 {
			s.log.Error("request failed", "route", route, "code", rec.code, "request_id", reqID, "err", err)
		} else {
			s.log.Debug("request", "route", route, "code", rec.code, "request_id", reqID, "dur", time.Since(start))
		}
	})
}

type requestIDKey struct{}

func requestID(ctx context.Context) string {
	v, _ := ctx.Value(requestIDKey{}).(string)
	return v
}

func newRequestID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// route is one API endpoint; the same table registers handlers and builds the OpenAPI document.
type route struct {
	method, path string
	need         role
	h            handlerFunc
	summary      string
	req, resp    any // zero values of the request/response body types (nil = none)
	status       int // success status
}

func (s *Server) table() []route {
	type L = apiv1.List[apiv1.Node]
	return []route{
		{"GET", "/readyz", public, s.readyz, "Readiness: the database answers", nil, map[string]string{}, 200},
		{"GET", "/api/v1/openapi.json", public, s.openapi, "This OpenAPI document", nil, nil, 200},
		{"GET", "/api/v1/whoami", anyUser, s.whoami, "Describe the caller", nil, apiv1.Whoami{}, 200},
		{"GET", "/api/v1/skus", anyUser, s.listSKUs, "List active SKUs", nil, apiv1.List[apiv1.SKU]{}, 200},
		{"GET", "/api/v1/capacity", anyUser, s.capacity, "Raw and topology-safe capacity by SKU (query: sku, region)", nil, apiv1.List[apiv1.Capacity]{}, 200},
		{"POST", "/api/v1/placement/explain", anyUser, s.explainPlacement, "Placement dry run: reserves nothing", apiv1.PlacementRequest{}, apiv1.PlacementExplain{}, 200},
		{"POST", "/api/v1/allocations", anyUser, s.createAllocation, "Create an allocation (header Idempotency-Key)", apiv1.AllocationCreate{}, apiv1.Allocation{}, 201},
		{"GET", "/api/v1/allocations", anyUser, s.listAllocations, "List the caller's allocations (admins: all; query: status)", nil, apiv1.List[apiv1.Allocation]{}, 200},
		{"GET", "/api/v1/allocations/{id}", anyUser, s.getAllocation, "Show an allocation", nil, apiv1.Allocation{}, 200},
		{"POST", "/api/v1/allocations/{id}/release", anyUser, s.releaseAllocation, "Release an allocation (optional body: a report of a problem, which holds its slots for operator review)", apiv1.ReleaseRequest{}, apiv1.Allocation{}, 200},
		{"GET", "/api/v1/quotas", anyUser, s.listQuotas, "Quotas with their usage (tenants: their own; admins: all, query: tenant)", nil, apiv1.List[apiv1.Quota]{}, 200},
		{"POST", "/api/v1/reservations", anyUser, s.createReservation, "Reserve capacity: hold GPUs of a slice SKU for the tenant (admins name tenant_id)", apiv1.ReservationCreate{}, apiv1.Reservation{}, 201},
		{"GET", "/api/v1/reservations", anyUser, s.listReservations, "List capacity reservations, newest first (tenants: their own; query: active, tenant)", nil, apiv1.List[apiv1.Reservation]{}, 200},
		{"GET", "/api/v1/reservations/{id}", anyUser, s.getReservation, "Show a capacity reservation", nil, apiv1.Reservation{}, 200},
		{"POST", "/api/v1/reservations/{id}/cancel", anyUser, s.cancelReservation, "Cancel a capacity reservation: its slots return to the fleet", nil, apiv1.Reservation{}, 200},

		{"GET", "/api/v1/events", anyUser, s.listEvents, "The caller's events after a cursor, oldest first (tenants: their own; query: after, since, limit, wait up to 60s)", nil, apiv1.EventPage{}, 200},
		{"POST", "/api/v1/webhooks", anyUser, s.createWebhook, "Register an HTTPS endpoint for the caller's events (admins: tenant_id); the signing secret is shown once", apiv1.WebhookCreate{}, apiv1.Webhook{}, 201},
		{"GET", "/api/v1/webhooks", anyUser, s.listWebhooks, "List webhooks with delivery counts (tenants: their own)", nil, apiv1.List[apiv1.Webhook]{}, 200},
		{"DELETE", "/api/v1/webhooks/{id}", anyUser, s.deleteWebhook, "Delete a webhook; its pending deliveries end", nil, apiv1.Webhook{}, 200},
		{"GET", "/api/v1/webhooks/{id}/deliveries", anyUser, s.webhookDeliveries, "A webhook's deliveries with every attempt, newest first (query: status, limit)", nil, apiv1.List[apiv1.WebhookDelivery]{}, 200},
		{"GET", "/api/v1/maintenance", anyUser, s.listMaintenance, "Maintenance notices (tenants: those affecting their allocations, without the node)", nil, apiv1.List[apiv1.MaintenanceNotice]{}, 200},

		{"POST", "/api/v1/admin/nodes", adminOnly, s.createNode, "Register a node", apiv1.NodeCreate{}, apiv1.Node{}, 201},
		{"GET", "/api/v1/admin/nodes", adminOnly, s.listNodes, "List nodes with mode and slot summary", nil, L{}, 200},
		{"GET", "/api/v1/admin/nodes/{id}", adminOnly, s.getNode, "Show a node (id or name)", nil, apiv1.Node{}, 200},
		{"POST", "/api/v1/admin/nodes/{id}/drain", adminOnly, s.drainNode(true), "Drain: no new placements (non-disruptive); with notice and reason, a maintenance notice to every tenant with an allocation on it (optional body)", apiv1.MaintenanceRequest{}, apiv1.Node{}, 200},
		{"POST", "/api/v1/admin/nodes/{id}/undrain", adminOnly, s.drainNode(false), "Undrain", nil, apiv1.Node{}, 200},
		{"GET", "/api/v1/admin/nodes/{id}/slots", adminOnly, s.listSlots, "List a node's slots", nil, apiv1.List[apiv1.Slot]{}, 200},
		{"PUT", "/api/v1/admin/nodes/{id}/slots", adminOnly, s.applySlots, "Apply a declarative slot map (dry_run shows the diff)", apiv1.SlotApply{}, apiv1.SlotApplyResult{}, 200},
		{"POST", "/api/v1/admin/nodes/{id}/slots/{index}/disable", adminOnly, s.setSlotEnabled(false), "Disable a slot", nil, apiv1.Slot{}, 200},
		{"POST", "/api/v1/admin/nodes/{id}/slots/{index}/enable", adminOnly, s.setSlotEnabled(true), "Enable a disabled slot", nil, apiv1.Slot{}, 200},
		{"GET", "/api/v1/admin/nodes/{id}/slots/{index}/health", adminOnly, s.slotHealth, "A slot's health, history and validations", nil, apiv1.SlotHealth{}, 200},
		{"POST", "/api/v1/admin/nodes/{id}/slots/{index}/quarantine", adminOnly, s.setSlotHealth(true), "Quarantine a slot (never placed until cleared)", apiv1.SlotHealthChange{}, apiv1.HealthEvent{}, 200},
		{"POST", "/api/v1/admin/nodes/{id}/slots/{index}/clear", adminOnly, s.setSlotHealth(false), "Clear a slot's health (a quarantine needs a passed validation since it began)", apiv1.SlotHealthChange{}, apiv1.HealthEvent{}, 200},
		{"POST", "/api/v1/admin/nodes/{id}/slots/{index}/validate", adminOnly, s.validateSlot, "Queue a signed slot.validate (quick checks) on an idle slot", nil, map[string]string{}, 202},
		{"GET", "/api/v1/admin/health", adminOnly, s.fleetHealth, "Fleet health by node, worst first", nil, apiv1.List[apiv1.NodeHealth]{}, 200},
		{"GET", "/api/v1/admin/health/policy", adminOnly, s.healthPolicy, "The signal -> action policy table with sources", nil, apiv1.List[apiv1.HealthRule]{}, 200},
		{"GET", "/api/v1/admin/skus", adminOnly, s.listSKUs, "List all SKUs", nil, apiv1.List[apiv1.SKU]{}, 200},
		{"POST", "/api/v1/admin/skus", adminOnly, s.createSKU, "Add a SKU", apiv1.SKU{}, apiv1.SKU{}, 201},
		{"PATCH", "/api/v1/admin/skus/{sku}", adminOnly, s.patchSKU, "Update a SKU", apiv1.SKUPatch{}, apiv1.SKU{}, 200},
		{"GET", "/api/v1/admin/os-images", adminOnly, s.listImages, "List OS images (query: target, active, family)", nil, apiv1.List[apiv1.OSImage]{}, 200},
		{"POST", "/api/v1/admin/os-images", adminOnly, s.createImage, "Register an OS image (digest required)", apiv1.OSImage{}, apiv1.OSImage{}, 201},
		{"GET", "/api/v1/admin/os-images/{id}", adminOnly, s.getImage, "Show an OS image (id or slug)", nil, apiv1.OSImage{}, 200},
		{"PATCH", "/api/v1/admin/os-images/{id}", adminOnly, s.patchImage, "Update an OS image", apiv1.OSImagePatch{}, apiv1.OSImage{}, 200},
		{"DELETE", "/api/v1/admin/os-images/{id}", adminOnly, s.deleteImage, "Retire an image (?hard=true deletes one never referenced)", nil, apiv1.OSImage{}, 200},
		{"POST", "/api/v1/admin/os-images/{id}/smoke-tests", adminOnly, s.startSmokeTest, "Smoke-test an image: boot it on one free slot of a node through the normal provisioning path", apiv1.ImageSmokeTestCreate{}, apiv1.ImageSmokeTest{}, 201},
		{"GET", "/api/v1/admin/os-images/{id}/smoke-tests", adminOnly, s.listSmokeTests, "An image's smoke tests, newest first", nil, apiv1.List[apiv1.ImageSmokeTest]{}, 200},
		{"POST", "/api/v1/admin/os-images/{id}/activate", adminOnly, s.activateImage, "Activate an image (needs a passed smoke test of its digest)", nil, apiv1.OSImage{}, 200},
		{"GET", "/api/v1/admin/skus/{sku}/image-rollout", adminOnly, s.rolloutStatus, "A SKU's default image, canary and how allocations on them fared", nil, apiv1.ImageRolloutStatus{}, 200},
		{"PUT", "/api/v1/admin/skus/{sku}/default-image", adminOnly, s.setDefaultImage, "Point a SKU's default image at a smoke-tested image (no canary)", apiv1.DefaultImageSet{}, apiv1.ImageRolloutStatus{}, 200},
		{"POST", "/api/v1/admin/skus/{sku}/image-rollout", adminOnly, s.startRollout, "Start a canary: the image becomes the default on a share of nodes or named regions", apiv1.ImageRolloutCreate{}, apiv1.ImageRollout{}, 201},
		{"POST", "/api/v1/admin/skus/{sku}/image-rollout/promote", adminOnly, s.finishRollout(true), "Promote the canary image to the SKU's default", nil, apiv1.ImageRollout{}, 200},
		{"POST", "/api/v1/admin/skus/{sku}/image-rollout/rollback", adminOnly, s.finishRollout(false), "End the canary, or move the default back from the last promotion; allocations keep their image", nil, apiv1.ImageRollout{}, 200},
		{"GET", "/api/v1/admin/skus/{sku}/demand-mix", adminOnly, s.getDemandMix, "The demand mix a slice SKU's placement protects and its source: learned (from N decayed requests), pinned or default (query: region)", nil, apiv1.DemandMix{}, 200},
		{"PUT", "/api/v1/admin/skus/{sku}/demand-mix", adminOnly, s.pinDemandMix, "Pin a slice SKU's demand mix (GPU counts with relative weights); it wins over the learned one", apiv1.DemandMixPin{}, apiv1.DemandMix{}, 200},
		{"DELETE", "/api/v1/admin/skus/{sku}/demand-mix", adminOnly, s.unpinDemandMix, "Unpin a slice SKU's demand mix: the learned one (or the default) applies again", nil, apiv1.DemandMix{}, 200},
		{"GET", "/api/v1/admin/audit", adminOnly, s.listAudit, "Audit log, newest first (query: limit, action, target_id)", nil, apiv1.List[apiv1.AuditEntry]{}, 200},
		{"POST", "/api/v1/admin/tenants", adminOnly, s.createTenant, "Create a tenant", struct {
			Name string `json:"name"`
		}{}, apiv1.Tenant{}, 201},
		{"GET", "/api/v1/admin/tenants", adminOnly, s.listTenants, "List tenants", nil, apiv1.List[apiv1.Tenant]{}, 200},
		{"PUT", "/api/v1/admin/tenants/{id}/quotas", adminOnly, s.setQuota, "Set a tenant's quota for a SKU and region (tenant by id or name)", apiv1.QuotaSet{}, apiv1.Quota{}, 200},
		{"DELETE", "/api/v1/admin/tenants/{id}/quotas", adminOnly, s.deleteQuota, "Remove a tenant's quota (query: sku, region)", nil, map[string]string{}, 200},
		{"POST", "/api/v1/admin/tokens", adminOnly, s.createToken, "Create an API token (shown once)", apiv1.TokenCreate{}, apiv1.Token{}, 201},
		{"GET", "/api/v1/admin/tokens", adminOnly, s.listTokens, "List API tokens (never their secrets)", nil, apiv1.List[apiv1.Token]{}, 200},
		{"POST", "/api/v1/admin/tokens/{id}/revoke", adminOnly, s.revokeToken, "Revoke an API token (immediate on this replica)", nil, apiv1.Token{}, 200},
		{"POST", "/api/v1/admin/nodes/{id}/revoke", adminOnly, s.revokeNode, "Revoke a node's certificates and unused bootstrap tokens; it must enroll again", nil, apiv1.NodeRevocation{}, 200},
		{"POST", "/api/v1/admin/nodes/{id}/slice-topology/discovery", adminOnly, s.queueDiscovery, "Queue a signed slice.topology_discover task", nil, apiv1.Discovery{}, 202},
		{"GET", "/api/v1/admin/nodes/{id}/slice-topology/discovery", adminOnly, s.getDiscovery, "Latest discovery task and its advisory report", nil, apiv1.Discovery{}, 200},
		{"POST", "/api/v1/admin/nodes/{id}/storage-transition", adminOnly, s.storageTransition, "Queue a storage transition to slice ownership (dry run unless apply + confirm)", apiv1.StorageTransitionRequest{}, map[string]string{}, 202},
		{"POST", "/api/v1/admin/nodes/{id}/slots/{index}/wipe", adminOnly, s.wipeSlot, "Queue a repair wipe + verify of a cleanup_blocked slot", struct {
			Apply bool `json:"apply"`
		}{}, map[string]string{}, 202},
		{"POST", "/api/v1/admin/nodes/{id}/reconcile", adminOnly, s.queueReconcile, "Queue a signed slice.reconcile: the host compares live allocations with libvirt, leases, DHCP and disks", nil, apiv1.Reconcile{}, 202},
		{"GET", "/api/v1/admin/nodes/{id}/reconcile", adminOnly, s.getReconcile, "Latest reconcile task and the host's drift report", nil, apiv1.Reconcile{}, 200},
		{"POST", "/api/v1/admin/nodes/{id}/slots/approve", adminOnly, s.approveSlots, "Promote ready discovered candidates into approved slots", apiv1.SlotApprove{}, apiv1.SlotApplyResult{}, 200},
		{"POST", "/api/v1/admin/nodes/{id}/bootstrap-token", adminOnly, s.newBootstrapToken, "Issue a new one-time node enrollment token", nil, apiv1.BootstrapToken{}, 201},
		{"GET", "/api/v1/tasks", adminOnly, s.listTasks, "List node tasks (query: node, allocation)", nil, apiv1.List[store.TaskRecord]{}, 200},
		{"GET", "/api/v1/tasks/{id}", adminOnly, s.getTask, "Show a node task with its phases", nil, store.TaskRecord{}, 200},

		{"POST", enrollPath, public, s.enroll, "Exchange a bootstrap token and public key for a node certificate", apiv1.EnrollRequest{}, apiv1.Enrollment{}, 201},
		{"POST", "/api/v1/agent/renew", nodeOnly, s.renew, "Rotate the node certificate", apiv1.EnrollRequest{}, apiv1.Enrollment{}, 201},
		{"POST", "/api/v1/allocations/{id}/terminal", anyUser, s.openTerminal, "Open a terminal/stdio/console session into an active allocation's VM; returns a single-use ticket", apiv1.TerminalRequest{}, apiv1.TerminalTicket{}, 201},
		{"GET", "/api/v1/terminal/{session}/attach", anyUser, s.attachClient, "Attach to a session (Upgrade: gpuaas-terminal/1; X-Gpuaas-Session-Token; HTTP/1.1)", nil, nil, 101},
		{"GET", "/api/v1/sessions", anyUser, s.listSessions, "Terminal sessions, newest first (tenants: their own)", nil, apiv1.List[apiv1.TerminalSession]{}, 200},
		{"GET", "/api/v1/sessions/{session}", anyUser, s.getSession, "One terminal session", nil, apiv1.TerminalSession{}, 200},
		{"GET", "/api/v1/sessions/{session}/recording", anyUser, s.getRecording, "A session's asciicast v2 recording", nil, nil, 200},
		{"GET", "/api/v1/agent/tasks", nodeOnly, s.pollTasks, "Long-poll for the next signed task (query: wait, up to 60s); 204 when none", nil, task.Envelope{}, 200},
		{"POST", "/api/v1/agent/tasks/{id}/result", nodeOnly, s.taskResult, "Report a task result (idempotent)", task.Result{}, map[string]string{}, 200},
		{"POST", "/api/v1/agent/tasks/{id}/progress", nodeOnly, s.taskProgress, "Report live phases; extends the lease", task.Progress{}, nil, 204},
		{"GET", "/api/v1/agent/terminal/{session}", nodeOnly, s.attachHost, "hostd's outbound stream for a terminal session (Upgrade: gpuaas-terminal/1; X-Gpuaas-Session-Token)", nil, nil, 101},
		{"GET", replicaTerminalPath + "{session}/{side}", controllerOnly, s.attachRelayed, "Another controller replica's relayed end (side client or host) of a session this replica holds (Upgrade: gpuaas-terminal/1; controller certificate only)", nil, nil, 101},
		{"GET", replicaRecordingPath + "{session}", controllerOnly, s.recordingForReplica, "A recording this replica wrote, for another replica serving it to an authorized caller (controller certificate only)", nil, nil, 200},
		{"POST", "/api/v1/agent/heartbeat", nodeOnly, s.heartbeat, "Agent heartbeat with facts", apiv1.Heartbeat{}, nil, 204},
		{"POST", "/api/v1/agent/health", nodeOnly, s.agentHealth, "Report health readings of the node's slots (applied through the policy table)", apiv1.HealthReport{}, apiv1.HealthReportResult{}, 200},
	}
}

func (s *Server) routes() {
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	s.routeTable = s.table()
	for _, rt := range s.routeTable {
		if strings.HasPrefix(rt.path, "/api/v1/agent/") && s.dispatch == nil {
			continue
		}
		pattern := rt.method + " " + rt.path
		s.mux.Handle(pattern, s.wrap(pattern, rt.need, rt.h))
	}
	s.mux.Handle("/", s.wrap("notfound", public, func(w http.ResponseWriter, r *http.Request, _ Principal) error {
		return errNotFound("no such endpoint: " + r.Method + " " + r.URL.Path)
	}))
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request, _ Principal) error {
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	if err := s.store.Ping(ctx); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	return nil
}
