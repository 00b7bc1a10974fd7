// Package config resolves gpuaasctl's connection settings once per invocation from, in order
// of precedence, command-line flags, GPUAAS_* environment variables and the config file
// ($XDG_CONFIG_HOME or ~/.config)/gpuaas/config.yaml. Named contexts and `login` will add
// layers here; commands only ever see the resolved Config.
package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/viper"
)

// Settings is one layer of configuration; it is also the config file's format.
type Settings struct {
	Server    string `mapstructure:"server"`
	CAFile    string `mapstructure:"ca_file"`
	Token     string `mapstructure:"token"`
	TokenFile string `mapstructure:"token_file"`
}

// Flags are the global flag values; an empty field was not given.
type Flags = Settings

// Config is the resolved configuration.
type Config struct {
	Server string
	CAFile string
	Token  string
	// TokenSource says where Token came from, e.g. "GPUAAS_TOKEN_FILE (/state/admin.token)",
	// so an "unauthorized" answer can point at the right setting. Empty when there is no token.
	TokenSource string
	// File is the config file that was consulted; it need not exist.
	File string
}

// Path is the config file location: $XDG_CONFIG_HOME/gpuaas/config.yaml, else
// $HOME/.config/gpuaas/config.yaml.
func Path(getenv func(string) string) string {
	if x := getenv("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "gpuaas", "config.yaml")
	}
	return filepath.Join(getenv("HOME"), ".config", "gpuaas", "config.yaml")
}

// layer is a Settings with the names its values are known by, for messages.
type layer struct {
	s     Settings
	names func(key string) string
}

// Load resolves flags > environment > config file. The token and token_file settings are
// resolved as a pair: the highest layer that sets either wins (within a layer, token beats
// token_file), so `--token-file` overrides a token in the config file.
func Load(flags Flags, getenv func(string) string) (*Config, error) {
	path := Path(getenv)
	file, err := readFile(path)
	if err != nil {
		return nil, err
	}
	env := Settings{
		Server:    getenv("GPUAAS_SERVER"),
		CAFile:    getenv("GPUAAS_CA_FILE"),
		Token:     getenv("GPUAAS_TOKEN"),
		TokenFile: getenv("GPUAAS_TOKEN_FILE"),
	}
	layers := []layer{
		{flags, func(k string) string { return "--" + strings.ReplaceAll(k, "_", "-") }},
		{env, func(k string) string { return "GPUAAS_" + strings.ToUpper(k) }},
		{file, func(k string) string { return k + " in " + path }},
	}
	c := &Config{File: path}
	for _, l := range layers {
		if c.Server == "" {
			c.Server = l.s.Server
		}
		if c.CAFile == "" {
			c.CAFile = l.s.CAFile
		}
	}
	for _, l := range layers {
		if l.s.Token != "" {
			c.Token, c.TokenSource = l.s.Token, l.names("token")
			break
		}
		if l.s.TokenFile != "" {
			src := l.names("token_file")
			if c.Token, err = readToken(l.s.TokenFile, src); err != nil {
				return nil, err
			}
			c.TokenSource = src + " (" + l.s.TokenFile + ")"
			break
		}
	}
	return c, nil
}

// readFile reads the optional config file with its own viper instance. Unknown keys are
// errors: a misspelt "ca-file" must not be silently ignored. Relative file paths in it are
// relative to the file's directory.
func readFile(path string) (Settings, error) {
	var s Settings
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	v := viper.New()
	v.SetConfigFile(path)
	v.SetConfigType("yaml")
	if err := v.ReadInConfig(); err != nil {
		return s, fmt.Errorf("config file %s: %w", path, err)
	}
	if err := v.UnmarshalExact(&s); err != nil {
		return s, fmt.Errorf("config file %s: %w (known keys: server, ca_file, token, token_file)", path, err)
	}
	dir := filepath.Dir(path)
	for _, p := range []*string{&s.CAFile, &s.TokenFile} {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
	return s, nil
}

// readToken reads a token file; surrounding whitespace (the trailing newline) is dropped.
func readToken(path, source string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading the token file named by %s: %w", source, err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("token file %s (from %s) is empty", path, source)
	}
	return tok, nil
}
