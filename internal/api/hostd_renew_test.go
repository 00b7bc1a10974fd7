package api_test

import (
	"context"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/gpuaas/gpuaas/internal/agent"
	"github.com/gpuaas/gpuaas/internal/api"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/pki"
	"github.com/gpuaas/gpuaas/internal/store"
)

func permOf(t *testing.T, p string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func certFileSerial(t *testing.T, path string) (string, *x509.Certificate) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s holds no PEM", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(c.SerialNumber.Bytes()), c
}

// gpuaas-hostd enroll writes its identity 0600 in a 0700 directory; a running hostd whose
// certificate is two thirds through its life renews it through /api/v1/agent/renew on its
// own, the old serial is superseded (refused: the grace is negligible here), and the host
// keeps working on the new certificate over fresh connections.
func TestHostdEnrollsPrivatelyAndRenewsBeforeExpiry(t *testing.T) {
	w := secSetup(t, api.SecurityConfig{RenewGrace: time.Nanosecond})
	w.populate()
	ctx := context.Background()
	var n apiv1.Node
	w.must("POST", "/api/v1/admin/nodes", w.admin, apiv1.NodeCreate{Name: "node-h", Region: "lab"}, 201, &n)
	base := t.TempDir()
	cfgPath := filepath.Join(base, "etc", "gpuaas", "hostd.yaml")
	cfg, err := agent.Enroll(ctx, agent.EnrollOptions{Server: w.srv.URL, CAFile: w.caFile, Token: n.BootstrapToken, ConfigPath: cfgPath,
		Runtime: "sim", HostRoot: base, StateDir: filepath.Join(base, "state")})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{cfgPath, cfg.KeyFile, cfg.CertFile, cfg.CAFile, cfg.SigningPubFile} {
		if m := permOf(t, f); m != 0o600 {
			t.Errorf("%s mode %04o, want 0600", f, m)
		}
	}
	if m := permOf(t, filepath.Dir(cfgPath)); m != 0o700 {
		t.Errorf("%s mode %04o, want 0700", filepath.Dir(cfgPath), m)
	}

	// Age the identity: the same key, a certificate 25 days into its 30.
	keyPEM, err := os.ReadFile(cfg.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(keyPEM)
	key, err := x509.ParseECPrivateKey(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadCA(w.dir)
	if err != nil {
		t.Fatal(err)
	}
	oldPEM, err := ca.IssueClientCert(&key.PublicKey, "node:"+n.ID, 30*24*time.Hour, time.Now().Add(-25*24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteFileAtomic(cfg.CertFile, oldPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	oldSerial, oldCert := certFileSerial(t, cfg.CertFile)
	if err := w.st.InTx(ctx, func(tx *store.Tx) error { return tx.RecordCredential(ctx, oldSerial, n.ID, oldCert.NotAfter) }); err != nil {
		t.Fatal(err)
	}

	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	agent.BindRunFlags(fs)
	if err := fs.Parse([]string{"--config", cfgPath, "--poll-wait", "1s", "--heartbeat", "1h"}); err != nil {
		t.Fatal(err)
	}
	rc, err := agent.LoadConfig(fs)
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(rc, slog.New(slog.NewTextHandler(io.Discard, nil)), "test")
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = a.Run(runCtx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })

	var newSerial string
	deadline := time.Now().Add(60 * time.Second)
	for {
		if s, _ := certFileSerial(t, cfg.CertFile); s != oldSerial {
			newSerial = s
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("hostd did not renew a certificate 25 days into its 30 within 60s")
		}
		time.Sleep(50 * time.Millisecond) // poll interval, bounded by the deadline
	}
	_, newCert := certFileSerial(t, cfg.CertFile)
	if time.Until(newCert.NotAfter) < 29*24*time.Hour {
		t.Fatalf("renewed certificate ends %v", newCert.NotAfter)
	}
	for _, f := range []string{cfg.CertFile, cfg.KeyFile} {
		if m := permOf(t, f); m != 0o600 {
			t.Errorf("renewed %s mode %04o", f, m)
		}
	}
	if at, err := w.st.CredentialRevokedAt(ctx, oldSerial); err != nil || at == nil {
		t.Fatalf("old serial not superseded: %v %v", at, err)
	}
	if id, err := w.st.CredentialNode(ctx, newSerial); err != nil || id != n.ID {
		t.Fatalf("new serial = %q %v", id, err)
	}
	// The host still works, on the new certificate only: a task queued now is fetched and reported.
	var rec apiv1.Reconcile
	w.must("POST", "/api/v1/admin/nodes/"+n.ID+"/reconcile", w.admin, nil, 202, &rec)
	deadline = time.Now().Add(60 * time.Second)
	for {
		var tr apiv1.Task
		w.must("GET", "/api/v1/tasks/"+rec.TaskID, w.admin, nil, 200, &tr)
		if tr.Status != "queued" && tr.Status != "leased" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("task still %s 60s after renewal: the host lost its identity", tr.Status)
		}
		time.Sleep(50 * time.Millisecond) // poll interval, bounded by the deadline
	}
}
