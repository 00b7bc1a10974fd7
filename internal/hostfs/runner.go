package hostfs

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// Runner runs host commands: the one seam through which hostd executes standard tools
// (wipefs, blkdiscard, blkid, qemu-img, ...). Tests may substitute it.
type Runner interface {
	Run(ctx context.Context, name string, args ...string) (stdout []byte, err error)
}

// ExitError is a command that ran and failed.
type ExitError struct {
	Cmd    string
	Code   int
	Stderr string
}

func (e *ExitError) Error() string {
	return fmt.Sprintf("%s: exit %d: %s", e.Cmd, e.Code, strings.TrimSpace(e.Stderr))
}

// Exec runs commands on this machine.
type Exec struct{}

// Run executes name with args, returning stdout; a non-zero exit is an *ExitError.
func (Exec) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return stdout.Bytes(), &ExitError{Cmd: name + " " + strings.Join(args, " "), Code: ee.ExitCode(), Stderr: stderr.String()}
	}
	if err != nil {
		return stdout.Bytes(), fmt.Errorf("%s: %w", name, err)
	}
	return stdout.Bytes(), nil
}
