// Package config resolves gpuaasctl's connection settings once per invocation from, in order
// of precedence, command-line flags, GPUAAS_* environment variables and the selected context
// of the config file ($XDG_CONFIG_HOME or ~/.config)/gpuaas/config.yaml. The file holds named
// contexts (server, CA file, token or token file, default region) and the current one; `login`
// and `config` write it (0600). Commands only ever see the resolved Config.
package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/spf13/viper"
	"go.yaml.in/yaml/v3"
)

// Settings is one layer of configuration; it is also one context in the config file.
type Settings struct {
	Server string `mapstructure:"server" yaml:"server,omitempty"`
	// Servers are more controller replicas to fail over to (a load balancer address in
	// Server alone is the usual setup). Server, when set, is tried first.
	Servers   []string `mapstructure:"servers" yaml:"servers,omitempty"`
	CAFile    string   `mapstructure:"ca_file" yaml:"ca_file,omitempty"`
	Token     string   `mapstructure:"token" yaml:"token,omitempty"`
	TokenFile string   `mapstructure:"token_file" yaml:"token_file,omitempty"`
	Region    string   `mapstructure:"region" yaml:"region,omitempty"`
}

// Flags are the global flag values; an empty field was not given.
type Flags struct {
	Settings `mapstructure:",squash"`
	Context  string // --context
}

// File is the config file: named contexts and the current one. The flat keys (server,
// ca_file, token, token_file, region) of a file written before contexts existed are read as
// a context named "default".
type File struct {
	CurrentContext string              `mapstructure:"current_context" yaml:"current_context,omitempty"`
	Contexts       map[string]Settings `mapstructure:"contexts" yaml:"contexts,omitempty"`
	Settings       `mapstructure:",squash" yaml:",inline"`
}

// Config is the resolved configuration.
type Config struct {
	Server string // one URL, or several comma-separated (tried in order; client.Options)
	CAFile string
	Token  string
	Region string // default region for placement (alloc create, capacity, explain)
	// TokenSource says where Token came from, e.g. "GPUAAS_TOKEN_FILE (/state/admin.token)",
	// so an "unauthorized" answer can point at the right setting. Empty when there is no token.
	TokenSource string
	// Context is the config-file context in use ("" when none).
	Context string
	// File is the config file that was consulted; it need not exist.
	File string
	// Warning says the config file could not be read and was ignored ("" when it was fine).
	Warning string
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

// Load resolves flags > environment > the selected context of the config file (--context,
// else GPUAAS_CONTEXT, else current_context). The token and token_file settings are
// resolved as a pair: the highest layer that sets either wins (within a layer, token beats
// token_file), so `--token-file` overrides a token in the config file.
func Load(flags Flags, getenv func(string) string) (*Config, error) {
	path := Path(getenv)
	name := flags.Context
	if name == "" {
		name = getenv("GPUAAS_CONTEXT")
	}
	f, err := ReadFile(path)
	warning := ""
	if err != nil {
		// A broken file must not lock the user out: with no context asked for and a server
		// given by flag or environment, the file is not needed, so go on without it and say so.
		if name != "" || (flags.Server == "" && len(flags.Servers) == 0 && getenv("GPUAAS_SERVER") == "") {
			return nil, err
		}
		f, warning = &File{Contexts: map[string]Settings{}}, err.Error()+"; ignoring it and using flags and environment only"
	}
	ctxName, file, err := f.Select(name)
	if err != nil {
		return nil, err
	}
	env := Settings{
		Server:    getenv("GPUAAS_SERVER"),
		CAFile:    getenv("GPUAAS_CA_FILE"),
		Token:     getenv("GPUAAS_TOKEN"),
		TokenFile: getenv("GPUAAS_TOKEN_FILE"),
		Region:    getenv("GPUAAS_REGION"),
	}
	where := path
	if ctxName != "" {
		where = fmt.Sprintf("context %q of %s", ctxName, path)
	}
	layers := []layer{
		{flags.Settings, func(k string) string { return "--" + strings.ReplaceAll(k, "_", "-") }},
		{env, func(k string) string { return "GPUAAS_" + strings.ToUpper(k) }},
		{file, func(k string) string { return k + " in " + where }},
	}
	c := &Config{File: path, Context: ctxName, Warning: warning}
	for _, l := range layers {
		if c.Server == "" {
			c.Server = strings.Join(append(nonEmpty(l.s.Server), l.s.Servers...), ",")
		}
		if c.CAFile == "" {
			c.CAFile = l.s.CAFile
		}
		if c.Region == "" {
			c.Region = l.s.Region
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

// IsZero reports whether nothing is set.
func (s Settings) IsZero() bool {
	return s.Server == "" && len(s.Servers) == 0 && s.CAFile == "" && s.Token == "" && s.TokenFile == "" && s.Region == ""
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

// ServerFlag is --server: repeatable, each value possibly comma-separated; the values are
// kept comma-joined in *P (the form Config.Server and client.Options.Server take).
type ServerFlag struct{ P *string }

// String is the joined list.
func (f ServerFlag) String() string {
	if f.P == nil {
		return ""
	}
	return *f.P
}

// Set appends a value.
func (f ServerFlag) Set(v string) error {
	if *f.P != "" {
		v = *f.P + "," + v
	}
	*f.P = v
	return nil
}

// Type names the value in help.
func (ServerFlag) Type() string { return "urls" }

// Select returns the named context (name "" = the current one; none at all = the flat
// settings). An unknown name is an error listing the known ones.
func (f *File) Select(name string) (string, Settings, error) {
	if name == "" {
		name = f.CurrentContext
	}
	if name == "" {
		return "", f.Settings, nil
	}
	s, ok := f.Contexts[name]
	if !ok {
		return "", Settings{}, fmt.Errorf("no context %q in the config file (have: %s); see gpuaasctl config get-contexts", name, strings.Join(f.Names(), ", "))
	}
	return name, s, nil
}

// Names are the context names, sorted.
func (f *File) Names() []string {
	names := make([]string, 0, len(f.Contexts))
	for n := range f.Contexts {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

var contextNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// ValidContextName checks a context name.
func ValidContextName(n string) error {
	if !contextNameRE.MatchString(n) {
		return fmt.Errorf("context name %q: use letters, digits, '.', '_' and '-' (at most 63)", n)
	}
	return nil
}

// ReadFile reads the optional config file with its own viper instance. Unknown keys are
// errors: a misspelt "ca-file" must not be silently ignored. Relative file paths in it are
// relative to the file's directory. Flat keys become the context "default".
func ReadFile(path string) (*File, error) {
	f := &File{Contexts: map[string]Settings{}}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return f, nil
	}
	// Context names hold dots ("127.0.0.1", "prod.eu"); viper's default key delimiter is the
	// dot, which would split such a name into nested keys. "::" cannot occur in a name.
	v := viper.NewWithOptions(viper.KeyDelimiter("::"))
	v.SetConfigFile(path)
	v.SetConfigType("yaml")
	if err := v.ReadInConfig(); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	if err := v.UnmarshalExact(f); err != nil {
		return nil, fmt.Errorf("config file %s: %w (known keys: current_context, contexts, and per context server, ca_file, token, token_file, region)", path, err)
	}
	if f.Contexts == nil {
		f.Contexts = map[string]Settings{}
	}
	dir := filepath.Dir(path)
	abs := func(s Settings) Settings {
		for _, p := range []*string{&s.CAFile, &s.TokenFile} {
			if *p != "" && !filepath.IsAbs(*p) {
				*p = filepath.Join(dir, *p)
			}
		}
		return s
	}
	for n, s := range f.Contexts {
		if err := ValidContextName(n); err != nil {
			return nil, fmt.Errorf("config file %s: %w", path, err)
		}
		f.Contexts[n] = abs(s)
	}
	f.Settings = abs(f.Settings)
	if f.CurrentContext != "" {
		if _, ok := f.Contexts[f.CurrentContext]; !ok {
			return nil, fmt.Errorf("config file %s: current_context %q is not among its contexts", path, f.CurrentContext)
		}
	}
	return f, nil
}

// Write saves the file atomically with mode 0600 (its directory 0700): it may hold tokens.
// Flat legacy settings are folded into the context "default".
func (f *File) Write(path string) error {
	if !f.Settings.IsZero() {
		if _, ok := f.Contexts["default"]; !ok {
			f.Contexts["default"] = f.Settings
			if f.CurrentContext == "" {
				f.CurrentContext = "default"
			}
		}
		f.Settings = Settings{}
	}
	b, err := yaml.Marshal(f)
	if err != nil {
		return err
	}
	return writePrivate(path, b)
}

// writePrivate replaces path atomically with b, mode 0600 in a 0700 directory.
func writePrivate(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".config-*.yaml")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// Redacted is s with its token hidden (the last 4 characters kept), for `config view`.
func Redacted(s Settings) Settings {
	if s.Token != "" {
		keep := ""
		if len(s.Token) > 12 {
			keep = s.Token[len(s.Token)-4:]
		}
		s.Token = "REDACTED…" + keep
	}
	return s
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

// DeleteContextRaw removes context name from a config file that ReadFile refuses (a key it
// does not know, a dangling current_context), without judging the rest of it, so `config
// delete-context` can always repair a file. It reports whether the context was there.
func DeleteContextRaw(path, name string) (bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return false, fmt.Errorf("config file %s is not YAML (%v): fix or remove it", path, err)
	}
	ctxs, _ := doc["contexts"].(map[string]any)
	if _, ok := ctxs[name]; !ok {
		return false, nil
	}
	delete(ctxs, name)
	if doc["current_context"] == name {
		delete(doc, "current_context")
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		return false, err
	}
	return true, writePrivate(path, out)
}
