package cmdutil

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/client"
)

func TestExitCode(t *testing.T) {
	t.Parallel()
	api := func(code string) error { return fmt.Errorf("wrapped: %w", &apiv1.Error{Code: code, Message: "m"}) }
	cases := []struct {
		err  error
		want int
	}{
		{nil, ExitOK},
		{errors.New("boom"), ExitError},
		{FlagErrorf("bad flag"), ExitUsage},
		{&AuthError{Err: errors.New("no token")}, ExitAuth},
		{&SilentError{Code: 6}, 6},
		{&client.NetworkError{URL: "https://x", Err: errors.New("refused")}, ExitUnavailable},
		{fmt.Errorf("ctx: %w", context.Canceled), ExitError},
		{api(apiv1.CodeInvalidRequest), ExitUsage},
		{api(apiv1.CodeTooLarge), ExitUsage},
		{api(apiv1.CodeUnauthorized), ExitAuth},
		{api(apiv1.CodeForbidden), ExitAuth},
		{api(apiv1.CodeNotFound), ExitNotFound},
		{api(apiv1.CodeConflict), ExitConflict},
		{api(apiv1.CodeIdempotencyReused), ExitConflict},
		{api(apiv1.CodeSKUUnavailable), ExitSKUUnavailable},
		{api(apiv1.CodeUnavailable), ExitUnavailable},
		{api(apiv1.CodeRateLimited), ExitUnavailable},
		{api(apiv1.CodeInternal), ExitError},
		{api("something_new"), ExitError},
	}
	for _, c := range cases {
		if got := ExitCode(c.err); got != c.want {
			t.Errorf("ExitCode(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}

func TestArgs(t *testing.T) {
	t.Parallel()
	cmd := &cobra.Command{Use: "disable NODE INDEX [--flag]"}
	check := func(err error, want string) {
		t.Helper()
		var fe *FlagError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), want) {
			t.Fatalf("got %v, want a FlagError with %q", err, want)
		}
	}
	check(ExactArgs(2)(cmd, nil), "missing NODE INDEX")
	check(ExactArgs(2)(cmd, []string{"n"}), "missing INDEX")
	check(ExactArgs(2)(cmd, []string{"n", "1", "x"}), `unexpected argument "x"`)
	if err := ExactArgs(2)(cmd, []string{"n", "1"}); err != nil {
		t.Fatal(err)
	}
	check(NoArgs(&cobra.Command{Use: "list"}, []string{"x"}), `unexpected argument "x"`)
	if got := argNames("approve NODE (--all-ready | --slot N) --yes"); len(got) != 1 || got[0] != "NODE" {
		t.Fatalf("argNames = %v", got)
	}
}

func TestGroup(t *testing.T) {
	t.Parallel()
	g := Group(&cobra.Command{Use: "alloc", SilenceErrors: true, SilenceUsage: true}, &cobra.Command{Use: "list", Run: func(*cobra.Command, []string) {}})
	g.SetArgs([]string{"lst"})
	err := g.Execute()
	var fe *FlagError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), `unknown command "lst"`) || !strings.Contains(err.Error(), "did you mean list") {
		t.Fatalf("unknown subcommand: %v", err)
	}
}

func TestDecodeFileIsStrict(t *testing.T) {
	t.Parallel()
	type spec struct {
		Name  string `json:"name"`
		Count int    `json:"gpu_count"`
	}
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	var v spec
	if err := DecodeFile(nil, write("ok.yaml", "name: a\ngpu_count: 2\n"), &v); err != nil || v.Name != "a" || v.Count != 2 {
		t.Fatalf("yaml: %+v %v", v, err)
	}
	if err := DecodeFile(nil, write("ok.json", `{"name":"b","gpu_count":3}`), &v); err != nil || v.Name != "b" {
		t.Fatalf("json: %+v %v", v, err)
	}
	if err := DecodeFile(strings.NewReader("name: c\n"), "-", &v); err != nil || v.Name != "c" {
		t.Fatalf("stdin: %+v %v", v, err)
	}
	var fe *InputError
	if err := DecodeFile(nil, write("typo.yaml", "name: a\ngpu_cnt: 2\n"), &v); !errors.As(err, &fe) || !strings.Contains(err.Error(), "gpu_cnt") {
		t.Fatalf("unknown key: %v", err)
	}
	if err := DecodeFile(nil, write("empty.yaml", ""), &v); !errors.As(err, &fe) {
		t.Fatalf("empty file: %v", err)
	}
	var flagErr *FlagError
	if err := DecodeFile(nil, filepath.Join(dir, "missing.yaml"), &v); !errors.As(err, &flagErr) {
		t.Fatalf("missing file: %v", err)
	}
}

// TestInputFilesAreBoundedAndNeverEchoed: -f reads at most maxInputFile bytes from a file too
// (a device like /dev/zero is refused at the bound, not read to exhaustion), and an input
// that is not what the command wants is refused without quoting its content.
func TestInputFilesAreBoundedAndNeverEchoed(t *testing.T) {
	t.Parallel()
	var v struct {
		Name string `json:"name"`
	}
	if _, err := os.Stat("/dev/zero"); err == nil {
		err := DecodeFile(nil, "/dev/zero", &v)
		if err == nil || !strings.Contains(err.Error(), "larger than") || ExitCode(err) != ExitUsage {
			t.Fatalf("/dev/zero: %v", err)
		}
	}
	dir := t.TempDir()
	for name, content := range map[string]string{
		"shadow": "root:$y$j9T$SECRETHASH:19700:0:99999:7:::\ndaemon:*:SECRETTWO:0:99999:7:::\n",
		"keys":   "name: a\nSECRET-KEY-NAME with spaces: 1\n",
		"list":   "- SECRETITEM\n",
		"broken": "a: [SECRETVALUE\n",
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		err := DecodeFile(nil, p, &v)
		if err == nil || ExitCode(err) != ExitUsage || strings.Contains(err.Error(), "SECRET") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestPoll(t *testing.T) {
	t.Parallel()
	n := 0
	err := Poll(context.Background(), time.Millisecond, func(context.Context) (bool, error) { n++; return n == 3, nil })
	if err != nil || n != 3 {
		t.Fatalf("poll: n=%d err=%v", n, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := Poll(ctx, time.Millisecond, func(context.Context) (bool, error) { return false, nil }); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline: %v", err)
	}
}

func TestFactoryClientNeedsServerAndToken(t *testing.T) {
	t.Parallel()
	env := map[string]string{"HOME": t.TempDir()}
	f := New(IOStreams{}, func(k string) string { return env[k] }, "test")
	if _, err := f.Client(); !errors.Is(err, client.ErrInvalidServer) {
		t.Fatalf("no server: %v", err)
	}
	env2 := map[string]string{"HOME": t.TempDir(), "GPUAAS_SERVER": "https://ctl:8443"}
	f = New(IOStreams{}, func(k string) string { return env2[k] }, "test")
	var ae *AuthError
	if _, err := f.Client(); !errors.As(err, &ae) {
		t.Fatalf("no token: %v", err)
	}
	env3 := map[string]string{"HOME": t.TempDir(), "GPUAAS_SERVER": "https://ctl:8443", "GPUAAS_TOKEN": "t"}
	f = New(IOStreams{}, func(k string) string { return env3[k] }, "test")
	c1, err := f.Client()
	c2, _ := f.Client()
	if err != nil || c1 != c2 {
		t.Fatalf("client built once: %v %p %p", err, c1, c2)
	}
}

func TestWatchWritesOnlyChanges(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out bytes.Buffer
	calls := 0
	frames := []string{"a\n", "a\n", "b\n", "b\n"}
	w := WatchFlags{Watch: true, Interval: 200 * time.Millisecond}
	err := w.Render(ctx, IOStreams{Out: &out}, func(wr io.Writer) error {
		_, err := io.WriteString(wr, frames[calls])
		calls++
		if calls == len(frames) {
			cancel() // Ctrl-C after the fourth read
		}
		return err
	})
	if err != nil || out.String() != "a\nb\n" || calls != 4 {
		t.Fatalf("watch wrote %q after %d reads (%v); want each change once", out.String(), calls, err)
	}
	out.Reset()
	if err := (WatchFlags{}).Render(ctx, IOStreams{Out: &out}, func(wr io.Writer) error { _, err := io.WriteString(wr, "once\n"); return err }); err != nil || out.String() != "once\n" {
		t.Fatalf("no --watch: %q %v", out.String(), err)
	}
	if err := (WatchFlags{Watch: true, Interval: time.Millisecond}).Render(ctx, IOStreams{Out: &out}, nil); err == nil {
		t.Fatal("a too-short interval was accepted")
	}
}

// TestUnquotedDigitsAreExplained: YAML reads an unquoted all-digit value as a number; the
// error says to quote it, in our words, as an input error (no usage text).
func TestUnquotedDigitsAreExplained(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "image.yaml")
	if err := os.WriteFile(p, []byte("slug: x\ndigest_sha256: 1234567890123456789012345678901234567890123456789012345678901234\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var v struct {
		Slug   string `json:"slug"`
		Digest string `json:"digest_sha256"`
	}
	err := DecodeFile(nil, p, &v)
	var ie *InputError
	if !errors.As(err, &ie) || !strings.Contains(err.Error(), "digest_sha256: YAML read its value as a number: quote it") || strings.Contains(err.Error(), "Go struct") {
		t.Fatalf("unquoted digest: %v", err)
	}
}
