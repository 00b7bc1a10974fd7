// Package cli is gpuaasctl: the operator and tenant command line. Commands are built by
// constructors (NewCmdX(f, runF)) from a Factory made once in Main; configuration is loaded
// once through its own viper (flags > GPUAAS_* env > ~/.config/gpuaas/config.yaml).
package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"github.com/gpuaas/gpuaas/internal/buildinfo"
	"github.com/gpuaas/gpuaas/internal/client"
)

// IOStreams are the command's standard streams.
type IOStreams struct {
	In     io.Reader
	Out    io.Writer
	ErrOut io.Writer
}

// Config is gpuaasctl's resolved configuration.
type Config struct {
	Server    string `mapstructure:"server"`
	CAFile    string `mapstructure:"ca_file"`
	Token     string `mapstructure:"token"`
	TokenFile string `mapstructure:"token_file"`
	Output    string `mapstructure:"output"`
}

// Factory lazily builds what commands need, once.
type Factory struct {
	IO      IOStreams
	Flags   *pflag.FlagSet // the root's persistent flags
	Getenv  func(string) string
	cfg     *Config
	client  *client.Client
	NewHTTP func(Config) (*client.Client, error) // tests may replace
}

// ConfigPath is the config file location: $XDG_CONFIG_HOME/gpuaas/config.yaml or ~/.config/...
func (f *Factory) ConfigPath() string {
	if x := f.Getenv("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "gpuaas", "config.yaml")
	}
	return filepath.Join(f.Getenv("HOME"), ".config", "gpuaas", "config.yaml")
}

// Config loads the configuration once.
func (f *Factory) Config() (Config, error) {
	if f.cfg != nil {
		return *f.cfg, nil
	}
	v := viper.New()
	for _, k := range []string{"server", "ca_file", "token", "token_file", "output"} {
		if val := f.Getenv("GPUAAS_" + strings.ToUpper(k)); val != "" {
			v.Set(k, val) // env beats the file
		}
	}
	path := f.ConfigPath()
	if _, err := os.Stat(path); err == nil {
		fv := viper.New()
		fv.SetConfigFile(path)
		fv.SetConfigType("yaml")
		if err := fv.ReadInConfig(); err != nil {
			return Config{}, fmt.Errorf("config %s: %w", path, err)
		}
		for _, k := range fv.AllKeys() {
			if !v.IsSet(k) {
				v.SetDefault(k, fv.Get(k))
			}
		}
	}
	if f.Flags != nil {
		f.Flags.VisitAll(func(fl *pflag.Flag) {
			if fl.Changed {
				v.Set(strings.ReplaceAll(fl.Name, "-", "_"), fl.Value.String())
			}
		})
	}
	var c Config
	if err := v.Unmarshal(&c); err != nil {
		return Config{}, err
	}
	if c.Token == "" && c.TokenFile != "" {
		b, err := os.ReadFile(c.TokenFile)
		if err != nil {
			return Config{}, fmt.Errorf("token file: %w", err)
		}
		c.Token = strings.TrimSpace(string(b))
	}
	if c.Output == "" {
		c.Output = "table"
	}
	switch c.Output {
	case "table", "json", "yaml":
	default:
		return Config{}, &FlagError{Err: fmt.Errorf("--output must be table, json or yaml, not %q", c.Output)}
	}
	f.cfg = &c
	return c, nil
}

// Client returns the API client, built once.
func (f *Factory) Client() (*client.Client, error) {
	if f.client != nil {
		return f.client, nil
	}
	c, err := f.Config()
	if err != nil {
		return nil, err
	}
	if f.NewHTTP != nil {
		f.client, err = f.NewHTTP(c)
		return f.client, err
	}
	if c.Token == "" {
		return nil, &AuthError{Err: errors.New("no API token: set --token, --token-file, GPUAAS_TOKEN or GPUAAS_TOKEN_FILE")}
	}
	f.client, err = client.New(client.Options{Server: c.Server, CAFile: c.CAFile, Token: c.Token,
		UserAgent: "gpuaasctl/" + buildinfo.Version})
	return f.client, err
}
