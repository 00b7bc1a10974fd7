package pgserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

const childDirEnv = "PGSERVER_TEST_CHILD_DIR"

// TestEphemeralChild is the process TestEphemeralClusterDiesWithProcess kills: it starts a
// cluster, reports the postmaster's pid, and waits to be killed.
func TestEphemeralChild(t *testing.T) {
	dir := os.Getenv(childDirEnv)
	if dir == "" {
		t.Skip("helper process for TestEphemeralClusterDiesWithProcess")
	}
	if _, err := Start(context.Background(), Options{Dir: dir, Ephemeral: true}); err != nil {
		fmt.Println("error:", err)
		return
	}
	pid, err := postmasterPID(filepath.Join(dir, "data"))
	fmt.Println("pid:", pid, err)
	_, _ = io.Copy(io.Discard, os.Stdin) // until killed
}

func TestEphemeralClusterDiesWithProcess(t *testing.T) {
	t.Parallel()
	dir := clusterDir(t)
	child := exec.Command(os.Args[0], "-test.run=^TestEphemeralChild$", "-test.count=1")
	child.Env = append(os.Environ(), childDirEnv+"="+dir)
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })

	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("child: %q, %v", line, err)
	}
	pidStr, ok := strings.CutPrefix(strings.TrimSpace(line), "pid: ")
	pidStr, _, _ = strings.Cut(pidStr, " ")
	pid, _ := strconv.Atoi(pidStr)
	if !ok || pid == 0 {
		t.Fatalf("child said %q", line)
	}
	if !postmasterOf(pid, filepath.Join(dir, "data")) {
		t.Fatalf("postmaster %d not running", pid)
	}

	if err := child.Process.Kill(); err != nil { // no Stop, no deferred cleanup
		t.Fatal(err)
	}
	_ = child.Wait()
	waitFor(t, "the orphaned postmaster to stop", 30*time.Second, func() bool {
		return !postmasterOf(pid, filepath.Join(dir, "data"))
	})
	waitFor(t, "the cluster files to go", 30*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(dir, "data"))
		return errors.Is(err, os.ErrNotExist)
	})
}
