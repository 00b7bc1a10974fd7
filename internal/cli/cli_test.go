package cli

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/client"
)

// fakeAPI is a TLS server answering a few routes the way the controller does. The real
// controller is exercised end to end by testdata/script; these tests pin the CLI's own
// behaviour: flags, output formats, error-to-exit-code mapping.
func fakeAPI(t *testing.T, routes map[string]func(w http.ResponseWriter, r *http.Request)) (url, caFile string, seen *[]*http.Request) {
	t.Helper()
	var reqs []*http.Request
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reqs = append(reqs, r.Clone(r.Context()))
		if h, ok := routes[r.Method+" "+r.URL.Path]; ok {
			h(w, r)
			return
		}
		w.WriteHeader(404)
		_ = json.NewEncoder(w).Encode(apiv1.Error{Code: "not_found", Message: "no route " + r.URL.Path})
	}))
	t.Cleanup(srv.Close)
	caFile = filepath.Join(t.TempDir(), "ca.crt")
	var buf bytes.Buffer
	for _, c := range srv.TLS.Certificates[0].Certificate {
		buf.WriteString("-----BEGIN CERTIFICATE-----\n")
		enc := encodeB64(c)
		for len(enc) > 64 {
			buf.WriteString(enc[:64] + "\n")
			enc = enc[64:]
		}
		buf.WriteString(enc + "\n-----END CERTIFICATE-----\n")
	}
	if err := os.WriteFile(caFile, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return srv.URL, caFile, &reqs
}

func run(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	f := &Factory{IO: IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errb}, Getenv: func(k string) string { return env[k] }}
	code := Execute(f, args)
	return code, out.String(), errb.String()
}

func jsonReply(v any, status int) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(v)
	}
}

func TestAllocCreateParsesFlags(t *testing.T) {
	var got *AllocCreateOptions
	f := &Factory{IO: IOStreams{Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}}, Getenv: func(string) string { return "" }}
	cmd := NewCmdAllocCreate(f, func(o *AllocCreateOptions) error { got = o; return nil })
	cmd.SetArgs([]string{"--sku", "h200-sxm-slice", "--gpus", "4", "--region", "lab", "--ssh-key", "a.pub", "--ssh-key", "b.pub"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if got.SKU != "h200-sxm-slice" || got.GPUs != 4 || got.Region != "lab" || len(got.SSHKeyFiles) != 2 {
		t.Fatalf("options = %+v", got)
	}
	cmd = NewCmdAllocCreate(f, func(*AllocCreateOptions) error { return nil })
	cmd.SetArgs([]string{"--sku", "x"})
	cmd.SilenceErrors, cmd.SilenceUsage = true, true
	var fe *FlagError
	if err := cmd.Execute(); err == nil || !asFlag(err, &fe) {
		t.Fatalf("missing --gpus: %v", err)
	}
}

func asFlag(err error, fe **FlagError) bool {
	e, ok := err.(*FlagError)
	*fe = e
	return ok
}

func TestAllocCreateSendsIdempotencyKeyAndPrints(t *testing.T) {
	a := apiv1.Allocation{ID: "0c989b43-1027-4099-a9e1-70c9acad3fff", Status: "requested", SKU: "h200-sxm-slice", GPUs: 2, CreatedAt: time.Now()}
	url, ca, seen := fakeAPI(t, map[string]func(http.ResponseWriter, *http.Request){
		"POST /api/v1/allocations": jsonReply(a, 201),
	})
	env := map[string]string{"GPUAAS_SERVER": url, "GPUAAS_CA_FILE": ca, "GPUAAS_TOKEN": "tok"}
	code, out, errOut := run(t, env, "alloc", "create", "--sku", "h200-sxm-slice", "--gpus", "2")
	if code != 0 || !strings.Contains(out, a.ID) || !strings.Contains(out, "requested") {
		t.Fatalf("code %d out %q err %q", code, out, errOut)
	}
	r := (*seen)[0]
	if r.Header.Get("Authorization") != "Bearer tok" || len(r.Header.Get("Idempotency-Key")) != 32 {
		t.Fatalf("headers = %v", r.Header)
	}
	code, out, _ = run(t, env, "alloc", "create", "--sku", "h200-sxm-slice", "--gpus", "2", "-o", "json")
	var back apiv1.Allocation
	if code != 0 || json.Unmarshal([]byte(out), &back) != nil || back.ID != a.ID {
		t.Fatalf("json output: %d %q", code, out)
	}
	code, out, _ = run(t, env, "alloc", "create", "--sku", "h200-sxm-slice", "--gpus", "2", "-o", "yaml")
	if code != 0 || !strings.Contains(out, "id: "+a.ID) {
		t.Fatalf("yaml output: %d %q", code, out)
	}
}

func TestErrorsMapToExitCodes(t *testing.T) {
	url, ca, _ := fakeAPI(t, map[string]func(http.ResponseWriter, *http.Request){
		"POST /api/v1/allocations": jsonReply(apiv1.Error{Code: "sku_unavailable", Message: "no capacity", Details: map[string]any{"reason": "topology_fragmented"}}, 409),
		"GET /api/v1/admin/nodes":  jsonReply(apiv1.Error{Code: "forbidden", Message: "admin role required"}, 403),
		"GET /api/v1/whoami":       jsonReply(apiv1.Error{Code: "unauthorized", Message: "invalid token"}, 401),
	})
	env := map[string]string{"GPUAAS_SERVER": url, "GPUAAS_CA_FILE": ca, "GPUAAS_TOKEN": "tok"}
	code, _, errOut := run(t, env, "alloc", "create", "--sku", "s", "--gpus", "4")
	if code != ExitSKUUnavailable || !strings.Contains(errOut, "topology_fragmented") || !strings.Contains(errOut, "hint:") {
		t.Fatalf("sku_unavailable: %d %q", code, errOut)
	}
	if code, _, _ := run(t, env, "nodes", "list"); code != ExitAuth {
		t.Fatalf("forbidden: %d", code)
	}
	if code, _, errOut := run(t, env, "whoami"); code != ExitAuth || !strings.Contains(errOut, "--token") {
		t.Fatalf("unauthorized: %d %q", code, errOut)
	}
	if code, _, _ := run(t, env, "alloc", "show", "nope"); code != ExitNotFound {
		t.Fatalf("not found: %d", code)
	}
	if code, _, errOut := run(t, env, "alloc", "show"); code != ExitUsage || !strings.Contains(errOut, "Usage") {
		t.Fatalf("missing arg: %d %q", code, errOut)
	}
	if code, _, _ := run(t, env, "alloc", "list", "--bogus"); code != ExitUsage {
		t.Fatalf("unknown flag: %d", code)
	}
	unreach := map[string]string{"GPUAAS_SERVER": "https://127.0.0.1:1", "GPUAAS_TOKEN": "tok"}
	if code, _, errOut := run(t, unreach, "whoami"); code != ExitUnavailable || !strings.Contains(errOut, "is the controller running") {
		t.Fatalf("unreachable: %d %q", code, errOut)
	}
	if code, _, errOut := run(t, map[string]string{"GPUAAS_SERVER": "http://127.0.0.1:1", "GPUAAS_TOKEN": "t"}, "whoami"); code == 0 || !strings.Contains(errOut, "https") {
		t.Fatalf("plain http accepted: %d %q", code, errOut)
	}
	if code, _, errOut := run(t, map[string]string{"GPUAAS_SERVER": url}, "whoami"); code != ExitAuth || !strings.Contains(errOut, "no API token") {
		t.Fatalf("no token: %d %q", code, errOut)
	}
}

func TestConfigPrecedence(t *testing.T) {
	home := t.TempDir()
	cfgDir := filepath.Join(home, ".config", "gpuaas")
	_ = os.MkdirAll(cfgDir, 0o700)
	_ = os.WriteFile(filepath.Join(cfgDir, "config.yaml"), []byte("server: https://file:1\ntoken: file-token\noutput: yaml\n"), 0o600)
	tokFile := filepath.Join(home, "tok")
	_ = os.WriteFile(tokFile, []byte("from-file\n"), 0o600)

	load := func(env map[string]string, args ...string) Config {
		t.Helper()
		env["HOME"] = home
		f := &Factory{IO: IOStreams{Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}}, Getenv: func(k string) string { return env[k] }}
		root := NewRootCmd(f)
		if err := root.PersistentFlags().Parse(args); err != nil {
			t.Fatal(err)
		}
		c, err := f.Config()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if c := load(map[string]string{}); c.Server != "https://file:1" || c.Token != "file-token" || c.Output != "yaml" {
		t.Fatalf("file only: %+v", c)
	}
	if c := load(map[string]string{"GPUAAS_SERVER": "https://env:2"}); c.Server != "https://env:2" || c.Token != "file-token" {
		t.Fatalf("env over file: %+v", c)
	}
	if c := load(map[string]string{"GPUAAS_SERVER": "https://env:2"}, "--server", "https://flag:3", "-o", "json"); c.Server != "https://flag:3" || c.Output != "json" {
		t.Fatalf("flag over env: %+v", c)
	}
	if c := load(map[string]string{"GPUAAS_TOKEN": "", "GPUAAS_TOKEN_FILE": tokFile}, "--token", ""); c.Token != "file-token" && c.Token != "from-file" {
		t.Fatalf("token file: %+v", c)
	}
}

func TestSlotMapFileValidation(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	_ = os.WriteFile(bad, []byte("slots:\n  - slot_index: 0\n    pci_adress: typo\n"), 0o644)
	if _, err := readSlotMap(bad); err == nil || !strings.Contains(err.Error(), "pci_adress") {
		t.Fatalf("unknown key accepted: %v", err)
	}
	good := filepath.Join(dir, "good.yaml")
	_ = os.WriteFile(good, []byte("- slot_index: 3\n  pci_address: 0000:1b:00.0\n  nvme_device: /dev/disk/by-id/nvme-x\n  mac_address: \"52:54:00:00:00:01\"\n  private_ip: 10.0.0.1\n  numa_node: 0\n"), 0o644)
	specs, err := readSlotMap(good)
	if err != nil || len(specs) != 1 || specs[0].SlotIndex != 3 || specs[0].PCIAddress != "0000:1b:00.0" {
		t.Fatalf("specs = %+v, %v", specs, err)
	}
}

var _ = client.ErrUnreachable
