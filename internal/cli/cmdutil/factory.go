// Package cmdutil is what every gpuaasctl command shares: the Factory (IO streams,
// configuration and API client, built lazily and once), the typed errors and their single
// mapping to exit codes, argument and flag helpers, and file decoding.
package cmdutil

import (
	"errors"
	"fmt"
	"io"

	"github.com/gpuaas/gpuaas/internal/cli/config"
	"github.com/gpuaas/gpuaas/internal/client"
)

// IOStreams are a command's standard streams. Results go to Out; progress, notices and
// errors go to ErrOut so `-o json` output stays machine-readable.
type IOStreams struct {
	In     io.Reader
	Out    io.Writer
	ErrOut io.Writer
}

// Factory is made once per invocation and handed to every command constructor.
type Factory struct {
	IO IOStreams
	// AppVersion is gpuaasctl's version (shown by `version`, sent in the User-Agent).
	AppVersion string
	// Flags receives the global flags (--server, --ca-file, --token, --token-file); they are
	// read when Config is first called, i.e. after parsing.
	Flags config.Flags

	// Config returns the resolved configuration, loaded once.
	Config func() (*config.Config, error)
	// Client returns the API client for the configured controller, built once.
	Client func() (*client.Client, error)
	// Getenv is the environment (tests give a fake one).
	Getenv func(string) string
}

// DefaultRegion is the configured default region (--region wins; "" = any).
func (f *Factory) DefaultRegion() string {
	if f.Config == nil {
		return ""
	}
	if c, err := f.Config(); err == nil {
		return c.Region
	}
	return ""
}

// ConfigPath is the config file gpuaasctl reads and `login`/`config` write.
func (f *Factory) ConfigPath() string { return config.Path(f.Getenv) }

// New builds a Factory whose Config reads getenv (and the config file it names) once.
func New(io IOStreams, getenv func(string) string, appVersion string) *Factory {
	f := &Factory{IO: io, AppVersion: appVersion, Getenv: getenv}
	var cfg *config.Config
	var cfgErr error
	f.Config = func() (*config.Config, error) {
		if cfg == nil && cfgErr == nil {
			cfg, cfgErr = config.Load(f.Flags, getenv)
			if cfgErr == nil && cfg.Warning != "" && f.IO.ErrOut != nil {
				fmt.Fprintln(f.IO.ErrOut, "warning: "+cfg.Warning)
			}
		}
		return cfg, cfgErr
	}
	var c *client.Client
	var cErr error
	f.Client = func() (*client.Client, error) {
		if c == nil && cErr == nil {
			c, cErr = newClient(f)
		}
		return c, cErr
	}
	return f
}

func newClient(f *Factory) (*client.Client, error) {
	cfg, err := f.Config()
	if err != nil {
		return nil, err
	}
	if cfg.Server == "" {
		return nil, fmt.Errorf("%w: set --server or GPUAAS_SERVER (https://host:port), or server in %s", client.ErrInvalidServer, cfg.File)
	}
	if cfg.Token == "" {
		return nil, &AuthError{Err: errors.New("no API token: set --token, --token-file, GPUAAS_TOKEN or GPUAAS_TOKEN_FILE")}
	}
	return client.New(client.Options{
		Server:    cfg.Server,
		CAFile:    cfg.CAFile,
		Token:     cfg.Token,
		UserAgent: "gpuaasctl/" + f.AppVersion,
	})
}
