// Package e2e runs the testscript suites in testdata/script against the real binaries:
// gpuaas-controller (with its embedded PostgreSQL) and gpuaasctl, both run in-process by
// re-executing this test binary.
package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/gpuaas/gpuaas/internal/agent"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli"
	"github.com/gpuaas/gpuaas/internal/client"
	"github.com/gpuaas/gpuaas/internal/controller"
	"github.com/gpuaas/gpuaas/internal/pgserver/pgtest"
	"github.com/gpuaas/gpuaas/internal/topology/fixture"
)

func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"gpuaasctl": func() { os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) },
		"gpuaas-controller": func() {
			os.Exit(controller.Main("e2e", os.Args[1:], os.Stdout, os.Stderr))
		},
		"gpuaas-hostd": func() {
			os.Exit(agent.MainWithKnobs("e2e", os.Args[1:], os.Stdout, os.Stderr, phaseTrapKnobs()))
		},
	})
}

func TestScripts(t *testing.T) {
	testscript.Run(t, scriptParams(t, filepath.Join("..", "..", "testdata", "script"), nil))
}

// scriptParams runs the scripts in dir with this package's setup and commands; extra, when
// set, adds to each script's environment.
func scriptParams(t *testing.T, dir string, extra func(*testscript.Env)) testscript.Params {
	pgtest.RequireServer(t)
	// The embedded PostgreSQL runs as an unprivileged user when we are root: every directory
	// above a script's $WORK must be traversable.
	root, err := os.MkdirTemp("", "gpuaas-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	return testscript.Params{
		Dir:         dir,
		WorkdirRoot: root,
		Setup: func(env *testscript.Env) error {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return err
			}
			port := l.Addr().(*net.TCPAddr).Port
			l.Close()
			if err := os.Chmod(env.WorkDir, 0o755); err != nil {
				return err
			}
			state := filepath.Join(env.WorkDir, "state")
			env.Setenv("STATE", state)
			env.Setenv("ADDR", fmt.Sprintf("127.0.0.1:%d", port))
			env.Setenv("GPUAAS_SERVER", fmt.Sprintf("https://127.0.0.1:%d", port))
			env.Setenv("GPUAAS_CA_FILE", filepath.Join(state, "tls", "ca.crt"))
			env.Setenv("GPUAAS_TOKEN_FILE", filepath.Join(state, "admin.token"))
			env.Setenv("NO_COLOR", "1")
			if extra != nil {
				extra(env)
			}
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"waitready":        waitReady,
			"mode":             checkMode,
			"jsonfield":        jsonField,
			"waitalloc":        waitAlloc,
			"waitnode":         waitNode,
			"waitspool":        waitSpool,
			"mkhost":           mkHost,
			"labbridge":        labBridge,
			"loopdisk":         loopDisk,
			"labimage":         labImage,
			"waitslots":        waitSlots,
			"waitstaged":       waitStaged,
			"waithealth":       waitHealth,
			"labmount":         labMount,
			"libvirtrelay":     libvirtRelay,
			"libvirtdown":      libvirtDown,
			"restartlibvirtd":  restartLibvirtd,
			"waitphase":        waitPhase,
			"waitunauthorized": waitUnauthorized,
			"waitsessions":     waitSessionsEnded,
			"tmuxstart":        tmuxStart,
			"tmuxkeys":         tmuxKeys,
			"tmuxwait":         tmuxWait,
			"tmuxresize":       tmuxResize,
			"armtrap":          armTrap,
			"waitparked":       waitParked,
			"recordoutcome":    recordOutcome,
			"invariants":       checkInvariants,
			"labhost":          labHost,
			"hookreceiver":     hookReceiverCmd,
			"waithook":         waitHook,
		},
		Condition:           labCondition,
		RequireExplicitExec: true,
	}
}

// waitReady polls GET /readyz over HTTPS (trusting the state dir's CA) until it answers 200
// or the deadline passes. Usage: waitready [timeout]
func waitReady(ts *testscript.TestScript, neg bool, args []string) {
	timeout := 90 * time.Second
	if len(args) == 1 {
		d, err := time.ParseDuration(args[0])
		ts.Check(err)
		timeout = d
	}
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		pem, err := os.ReadFile(ts.Getenv("GPUAAS_CA_FILE"))
		if err == nil {
			pool := x509.NewCertPool()
			pool.AppendCertsFromPEM(pem)
			c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			req, _ := http.NewRequestWithContext(ctx, "GET", ts.Getenv("GPUAAS_SERVER")+"/readyz", nil)
			resp, err := c.Do(req)
			cancel()
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					if neg {
						ts.Fatalf("controller is ready")
					}
					return
				}
				err = fmt.Errorf("readyz: %s", resp.Status)
			}
			last = err
		} else {
			last = err
		}
		time.Sleep(100 * time.Millisecond) // poll interval; the deadline bounds the wait
	}
	if !neg {
		ts.Fatalf("controller not ready after %s: %v", timeout, last)
	}
}

// checkMode asserts a file's permission bits. Usage: mode 0600 path
func checkMode(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 2 {
		ts.Fatalf("usage: mode PERM FILE")
	}
	fi, err := os.Stat(ts.MkAbs(args[1]))
	ts.Check(err)
	got := fmt.Sprintf("%04o", fi.Mode().Perm())
	if (got == args[0]) == neg {
		ts.Fatalf("%s has mode %s (want %s%s)", args[1], got, map[bool]string{true: "not ", false: ""}[neg], args[0])
	}
}

// jsonField extracts a top-level string field from a JSON file into an env var.
// Usage: jsonfield FILE FIELD VAR
func jsonField(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 3 {
		ts.Fatalf("usage: jsonfield FILE FIELD VAR")
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(ts.ReadFile(args[0])), &m); err != nil {
		ts.Fatalf("%s: %v", args[0], err)
	}
	v, ok := m[args[1]].(string)
	if !ok {
		ts.Fatalf("%s has no string field %s", args[0], args[1])
	}
	ts.Setenv(args[2], v)
}

func scriptClient(ts *testscript.TestScript) *client.Client {
	tok := ts.Getenv("GPUAAS_TOKEN")
	if tok == "" {
		tok = strings.TrimSpace(ts.ReadFile(ts.Getenv("GPUAAS_TOKEN_FILE")))
	}
	c, err := client.New(client.Options{Server: ts.Getenv("GPUAAS_SERVER"), CAFile: ts.Getenv("GPUAAS_CA_FILE"), Token: tok})
	ts.Check(err)
	return c
}

// waitAlloc polls an allocation until it reaches a status. Usage: waitalloc ID STATUS [timeout]
func waitAlloc(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) < 2 {
		ts.Fatalf("usage: waitalloc ID STATUS [timeout]")
	}
	timeout := 60 * time.Second
	if len(args) == 3 {
		d, err := time.ParseDuration(args[2])
		ts.Check(err)
		timeout = d
	}
	c := scriptClient(ts)
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		a, err := c.GetAllocation(context.Background(), args[0])
		if err == nil {
			last = a.Status
			if a.Status == args[1] {
				return
			}
			if a.Status == "failed" && args[1] != "failed" {
				ts.Fatalf("allocation failed: %s", a.FailureReason)
			}
		}
		time.Sleep(100 * time.Millisecond) // status poll; the deadline bounds it
	}
	ts.Fatalf("allocation %s is %q after %s, want %q", args[0], last, timeout, args[1])
}

// waitUnauthorized polls whoami with a token until the controller refuses it (an expiring
// token), within a deadline. Usage: waitunauthorized TOKEN [timeout]
func waitUnauthorized(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 1 {
		ts.Fatalf("usage: waitunauthorized TOKEN [timeout]")
	}
	timeout := 30 * time.Second
	if len(args) == 2 {
		d, err := time.ParseDuration(args[1])
		ts.Check(err)
		timeout = d
	}
	c, err := client.New(client.Options{Server: ts.Getenv("GPUAAS_SERVER_SAVED"), CAFile: ts.Getenv("GPUAAS_CA_SAVED"), Token: args[0]})
	ts.Check(err)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		_, err := c.Whoami(context.Background())
		var ae *apiv1.Error
		if errors.As(err, &ae) && ae.Code == apiv1.CodeUnauthorized {
			return
		}
		time.Sleep(200 * time.Millisecond) // poll; the deadline bounds it
	}
	ts.Fatalf("token still accepted after %s", timeout)
}

// waitSessionsEnded waits until no terminal session the caller can see is still open: a
// session's end is recorded when the relay notices its client left, a moment after the
// client has exited. Usage: waitsessions [timeout]
func waitSessionsEnded(ts *testscript.TestScript, neg bool, args []string) {
	timeout := 30 * time.Second
	if len(args) == 1 {
		d, err := time.ParseDuration(args[0])
		ts.Check(err)
		timeout = d
	}
	c := scriptClient(ts)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		items, err := c.ListSessions(context.Background(), "")
		open := 0
		for _, s := range items {
			if s.Status == "open" {
				open++
			}
		}
		if err == nil && open == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond) // poll; the deadline bounds it
	}
	ts.Fatalf("terminal sessions still open after %s", timeout)
}

// waitNode waits until a node has reported a heartbeat. Usage: waitnode NAME [timeout]
func waitNode(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) < 1 {
		ts.Fatalf("usage: waitnode NAME [timeout]")
	}
	c := scriptClient(ts)
	wait := 30 * time.Second
	if len(args) > 1 {
		d, err := time.ParseDuration(args[1])
		ts.Check(err)
		wait = d
	}
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		n, err := c.GetNode(context.Background(), args[0])
		if err == nil && n.LastHeartbeatAt != nil {
			return
		}
		time.Sleep(100 * time.Millisecond) // heartbeat poll; the deadline bounds it
	}
	ts.Fatalf("node %s never reported a heartbeat", args[0])
}

// waitSpool waits until a spool directory holds a result. Usage: waitspool DIR [timeout]
func waitSpool(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) < 1 {
		ts.Fatalf("usage: waitspool DIR [timeout]")
	}
	timeout := 30 * time.Second
	if len(args) == 2 {
		d, err := time.ParseDuration(args[1])
		ts.Check(err)
		timeout = d
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		entries, _ := os.ReadDir(ts.MkAbs(args[0]))
		for _, e := range entries {
			if strings.HasSuffix(e.Name(), ".json") {
				return
			}
		}
		time.Sleep(50 * time.Millisecond) // directory poll, bounded by the deadline
	}
	ts.Fatalf("no spooled result in %s after %s", args[0], timeout)
}

// mkHost writes a fixture host tree. Usage: mkhost DIR VARIANT (h200, h200-no-vfs, ...)
func mkHost(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 2 {
		ts.Fatalf("usage: mkhost DIR VARIANT")
	}
	spec, ok := fixture.Variants[args[1]]
	if !ok {
		ts.Fatalf("unknown fixture variant %q", args[1])
	}
	ts.Check(fixture.Write(ts.MkAbs(args[0]), spec()))
}
