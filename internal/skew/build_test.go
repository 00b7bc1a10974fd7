package skew

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// repoRoot is the repository this package sits in.
var repoRoot = filepath.Join("..", "..")

// previousRelease reads release/PREVIOUS: the previous release's tag and commit.
func previousRelease(t *testing.T) (tag, commit string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "release", "PREVIOUS"))
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == "tag" {
			tag = f[1]
		}
		if len(f) == 2 && f[0] == "commit" {
			commit = f[1]
		}
	}
	if tag == "" || len(commit) != 40 {
		t.Fatalf("release/PREVIOUS names no tag and 40-digit commit: %q", b)
	}
	return tag, commit
}

// needed skips the test outside CI and fails it under CI, saying why.
func needed(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

func goTool(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	needed(t, "the go tool is not on PATH: the skew tests build both releases' binaries")
	return ""
}

// buildBinaries builds gpuaas-controller and gpuaas-hostd from the module in src into dir,
// stamped with version. -trimpath keeps the build cache shared between the two source
// trees, so only the packages that differ are compiled again.
func buildBinaries(t *testing.T, src, dir, version string) {
	t.Helper()
	start := time.Now()
	cmd := exec.Command(goTool(t), "build", "-trimpath", "-o", dir+string(os.PathSeparator),
		"-ldflags", "-X github.com/gpuaas/gpuaas/internal/buildinfo.Version="+version,
		"./cmd/gpuaas-controller", "./cmd/gpuaas-hostd")
	cmd.Dir = src
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s binaries in %s: %v\n%s", version, src, err, out)
	}
	t.Logf("built %s binaries in %s", version, time.Since(start).Round(time.Millisecond))
}

// binaries builds the previous release's binaries (from release/PREVIOUS's commit, extracted
// with git archive: a worktree's files without touching the repository's worktree list) and
// this tree's, into old/ and new/ under dir.
func binaries(t *testing.T, dir string) (oldBin, newBin, oldVersion string) {
	t.Helper()
	tag, commit := previousRelease(t)
	if _, err := exec.LookPath("git"); err != nil {
		needed(t, "git is not installed: the skew tests build the previous release from its commit")
	}
	if out, err := exec.Command("git", "-C", repoRoot, "cat-file", "-e", commit+"^{commit}").CombinedOutput(); err != nil {
		needed(t, "the previous release's commit %s (%s, release/PREVIOUS) is not in this clone (%v: %s); a shallow clone lacks it: fetch it with `git fetch --unshallow` or `git fetch origin %s`",
			commit, tag, err, bytes.TrimSpace(out), tag)
	}
	src := filepath.Join(dir, "src-"+tag)
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.Command("git", "-C", repoRoot, "archive", "--format=tar", commit)
	untar := exec.Command("tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	untar.Stdin = pipe
	var aerr, uerr bytes.Buffer
	archive.Stderr, untar.Stderr = &aerr, &uerr
	if err := untar.Start(); err != nil {
		t.Fatal(err)
	}
	if err := archive.Run(); err != nil {
		t.Fatalf("git archive %s: %v: %s", commit, err, aerr.String())
	}
	if err := untar.Wait(); err != nil {
		t.Fatalf("untar %s: %v: %s", commit, err, uerr.String())
	}
	oldBin, newBin = filepath.Join(dir, "old"), filepath.Join(dir, "new")
	oldVersion = strings.TrimPrefix(tag, "v")
	buildBinaries(t, src, oldBin, oldVersion)
	buildBinaries(t, repoRoot, newBin, "skew-new")
	return oldBin, newBin, oldVersion
}
