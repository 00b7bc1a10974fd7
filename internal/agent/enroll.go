package agent

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/pki"
)

// EnrollOptions are the inputs of `gpuaas-hostd enroll`.
type EnrollOptions struct {
	Server     string   // one controller, or a comma-separated list (tried in order)
	Servers    []string // more controllers (repeated --server); all are recorded in the config
	CAFile     string
	Token      string
	ConfigPath string
	Runtime    string
	LabHost    bool // the lab host VM (Config.LabHost)
	HostRoot   string
	StateDir   string
}

// Enroll generates a key pair, exchanges the bootstrap token for a node certificate, and
// writes key, certificate, CA and the pinned task-signing key (all 0600) beside the config.
func Enroll(ctx context.Context, o EnrollOptions) (Config, error) {
	list := Config{Server: o.Server, Servers: o.Servers}.ServerList()
	if o.Token == "" || len(list) == 0 || o.CAFile == "" || o.ConfigPath == "" {
		return Config{}, fmt.Errorf("--server, --ca-file, --token and --config are required")
	}
	tlsCfg, err := pki.ClientTLSConfig(o.CAFile)
	if err != nil {
		return Config{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Config{}, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return Config{}, err
	}
	runtime := o.Runtime
	if runtime == "" {
		runtime = "libvirt" // the config's default (Config.defaults)
	}
	// The runtime goes with the enrollment: the controller records a sim host as simulated.
	body, _ := json.Marshal(apiv1.EnrollRequest{BootstrapToken: strings.TrimSpace(o.Token),
		PublicKeyPEM: string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})), Runtime: runtime, LabHost: o.LabHost})
	for _, s := range list {
		if err := validServer(s); err != nil {
			return Config{}, err
		}
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg}}
	// The first controller that answers enrolls the host (the token is single-use, so a
	// replica that answered is never asked again).
	var resp *http.Response
	for _, s := range list {
		req, err := http.NewRequestWithContext(ctx, "POST", s+"/api/v1/agent/enroll", bytes.NewReader(body))
		if err != nil {
			return Config{}, err
		}
		req.Header.Set("Content-Type", "application/json")
		if resp, err = hc.Do(req); err != nil {
			if s == list[len(list)-1] {
				return Config{}, fmt.Errorf("enroll: cannot reach %s: %w", strings.Join(list, ", "), err)
			}
			continue
		}
		break
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusCreated {
		var ae apiv1.Error
		if json.Unmarshal(data, &ae) == nil && ae.Message != "" {
			return Config{}, fmt.Errorf("enroll refused: %s (%s)", ae.Message, ae.Code)
		}
		return Config{}, fmt.Errorf("enroll refused: %s", resp.Status)
	}
	var en apiv1.Enrollment
	if err := json.Unmarshal(data, &en); err != nil {
		return Config{}, fmt.Errorf("enroll: bad response: %w", err)
	}
	return writeIdentity(o, key, en)
}

func writeIdentity(o EnrollOptions, key *ecdsa.PrivateKey, en apiv1.Enrollment) (Config, error) {
	dir := filepath.Dir(o.ConfigPath)
	list := Config{Server: o.Server, Servers: o.Servers}.ServerList()
	c := Config{Server: list[0], Servers: list[1:], NodeID: en.NodeID, Runtime: o.Runtime, LabHost: o.LabHost, HostRoot: o.HostRoot, StateDir: o.StateDir,
		CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "hostd.crt"), KeyFile: filepath.Join(dir, "hostd.key"),
		SigningPubFile: filepath.Join(dir, "task-signing.pub")}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return c, err
	}
	files := []struct {
		path string
		data []byte
	}{
		{c.KeyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})},
		{c.CertFile, []byte(en.CertificatePEM)},
		{c.CAFile, []byte(en.CAPEM)},
		{c.SigningPubFile, []byte(en.TaskSigningPublicKeyPEM)},
	}
	for _, f := range files {
		if err := mkdirWrite(f.path, f.data); err != nil {
			return c, err
		}
	}
	if _, err := pki.LoadSigningPub(c.SigningPubFile); err != nil {
		return c, fmt.Errorf("enroll: controller sent an unusable signing key: %w", err)
	}
	return c, WriteConfig(o.ConfigPath, c)
}
