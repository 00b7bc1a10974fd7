package pgserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// runAs picks the account PostgreSQL runs as. initdb and postgres refuse to run as root, so
// as root we use the postgres system user, else nobody; otherwise the current user (nil).
func runAs() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil || uid == 0 {
			continue
		}
		// No supplementary groups: the child must not keep root's.
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, errors.New("pgserver: running as root, but neither a postgres nor a nobody user exists to run PostgreSQL as")
}

// checkTraversable reports an error unless every directory above dir lets cred search it.
func checkTraversable(dir string, cred *syscall.Credential) error {
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
		if !searchable(fi, cred) {
			return fmt.Errorf("pgserver: %s (mode %04o) is not traversable by uid %d, which PostgreSQL runs as: chmod o+x it or choose a state directory under traversable parents",
				p, fi.Mode().Perm(), cred.Uid)
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

func searchable(fi os.FileInfo, cred *syscall.Credential) bool {
	perm := fi.Mode().Perm()
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !ok:
		return perm&0o001 != 0
	case st.Uid == cred.Uid:
		return perm&0o100 != 0
	case st.Gid == cred.Gid:
		return perm&0o010 != 0
	default:
		return perm&0o001 != 0
	}
}

// mkdirOwned creates dir (mode 0700) if needed and gives it to the PostgreSQL user.
func (s *Server) mkdirOwned(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	return s.chown(dir)
}

func (s *Server) chown(path string) error {
	if s.cred == nil {
		return nil
	}
	if err := os.Chown(path, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	return nil
}

// command runs one of the server binaries as the PostgreSQL user.
func (s *Server) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return s.commandPath(ctx, filepath.Join(s.bin, name), args...)
}

func (s *Server) commandPath(ctx context.Context, path string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = childEnv()
	cmd.Dir = "/" // the caller's working directory may not be reachable by the PostgreSQL user
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	return cmd
}

// childEnv is our environment without PG* variables (PGPORT, PGDATA, ... would override
// what we pass), in the C locale and UTC.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG=") || strings.HasPrefix(kv, "TZ=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C", "LANG=C", "TZ=UTC")
}
