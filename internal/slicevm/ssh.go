package slicevm

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

// EnsureTerminalKey loads or creates the host relay key (ed25519, 0600; .pub 0644) and
// returns its signer and authorized_keys line.
func EnsureTerminalKey(path string) (ssh.Signer, string, error) {
	if b, err := os.ReadFile(path); err == nil {
		s, err := ssh.ParsePrivateKey(b)
		if err != nil {
			return nil, "", fmt.Errorf("terminal key %s: %w", path, err)
		}
		return s, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey()))) + " gpuaas-terminal", nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, "", err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, "", err
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, "", err
	}
	blk, err := ssh.MarshalPrivateKey(priv, "gpuaas-terminal")
	if err != nil {
		return nil, "", err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(blk), 0o600); err != nil {
		return nil, "", err
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, "", err
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, "", err
	}
	pub := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey()))) + " gpuaas-terminal"
	return s, pub, os.WriteFile(path+".pub", []byte(pub+"\n"), 0o644)
}

// dialGuest opens SSH to the guest as user with the relay key. The guest's host key is
// pinned to pinFile on first contact (readiness) and checked on every later connection.
func dialGuest(ctx context.Context, addr, user string, signer ssh.Signer, pinFile string) (*ssh.Client, error) {
	cb := func(_ string, _ net.Addr, key ssh.PublicKey) error {
		line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key)))
		pinned, err := os.ReadFile(pinFile)
		if errors.Is(err, os.ErrNotExist) {
			return os.WriteFile(pinFile, []byte(line+"\n"), 0o600)
		}
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(pinned)) != line {
			return fmt.Errorf("guest host key changed (pinned %s)", pinFile)
		}
		return nil
	}
	// ed25519 first: small guests (dropbear) often carry only an ed25519 host key and some
	// builds mis-negotiate when RSA is preferred.
	cfg := &ssh.ClientConfig{User: user, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: cb, Timeout: 10 * time.Second,
		HostKeyAlgorithms: []string{ssh.KeyAlgoED25519, ssh.KeyAlgoECDSA256, ssh.KeyAlgoECDSA384, ssh.KeyAlgoECDSA521, ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256}}
	d := net.Dialer{Timeout: 5 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	c, chans, reqs, err := ssh.NewClientConn(conn, addr, cfg)
	if err != nil {
		conn.Close()
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	return ssh.NewClient(c, chans, reqs), nil
}

func runSSH(cl *ssh.Client, cmd string) ([]byte, error) {
	s, err := cl.NewSession()
	if err != nil {
		return nil, err
	}
	defer s.Close()
	out, err := s.CombinedOutput(cmd)
	if len(out) > 4096 {
		out = out[:4096]
	}
	return out, err
}
