// Package configcmd is `gpuaasctl config` (view, get-contexts, use-context, set-context,
// delete-context) and `gpuaasctl login`: named contexts in the config file, written 0600.
package configcmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/config"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// NewCmdConfig is the `config` command group.
func NewCmdConfig(f *cmdutil.Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "config", Short: "Named contexts: which controller, CA, token and default region to use"}
	return cmdutil.Group(cmd, newCmdView(f), newCmdGetContexts(f), newCmdUseContext(f), newCmdSetContext(f), newCmdDeleteContext(f))
}

func load(f *cmdutil.Factory) (*config.File, string, error) {
	path := f.ConfigPath()
	file, err := config.ReadFile(path)
	return file, path, err
}

// view is the file as `config view` shows it: tokens redacted.
type view struct {
	File           string                     `json:"file"`
	CurrentContext string                     `json:"current_context"`
	Contexts       map[string]config.Settings `json:"contexts"`
}

func newCmdView(f *cmdutil.Factory) *cobra.Command {
	format := output.YAML
	cmd := &cobra.Command{
		Use:   "view",
		Short: "Show the config file with tokens redacted",
		Args:  cmdutil.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			file, path, err := load(f)
			if err != nil {
				return err
			}
			v := view{File: path, CurrentContext: file.CurrentContext, Contexts: map[string]config.Settings{}}
			for n, s := range file.Contexts {
				v.Contexts[n] = config.Redacted(s)
			}
			if !file.Settings.IsZero() {
				v.Contexts["(flat keys)"] = config.Redacted(file.Settings)
			}
			return output.Print(f.IO.Out, format, v, func(t *output.TableWriter) { contextTable(t, file) })
		},
	}
	cmdutil.AddOutputFlag(cmd, &format)
	return cmd
}

func contextTable(t *output.TableWriter, file *config.File) {
	t.Row("CURRENT", "NAME", "SERVER", "REGION", "TOKEN")
	for _, n := range file.Names() {
		s := file.Contexts[n]
		cur := ""
		if n == file.CurrentContext {
			cur = "*"
		}
		tok := "-"
		switch {
		case s.Token != "":
			tok = "inline (redacted)"
		case s.TokenFile != "":
			tok = s.TokenFile
		}
		t.Row(cur, n, output.Dash(s.Server), output.Dash(s.Region), tok)
	}
}

func newCmdGetContexts(f *cmdutil.Factory) *cobra.Command {
	format := output.Table
	cmd := &cobra.Command{
		Use:   "get-contexts",
		Short: "List the contexts; * marks the current one",
		Args:  cmdutil.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			file, _, err := load(f)
			if err != nil {
				return err
			}
			names := file.Names()
			return output.Print(f.IO.Out, format, map[string]any{"current_context": file.CurrentContext, "contexts": names},
				func(t *output.TableWriter) { contextTable(t, file) })
		},
	}
	cmdutil.AddOutputFlag(cmd, &format)
	return cmd
}

func newCmdUseContext(f *cmdutil.Factory) *cobra.Command {
	return &cobra.Command{
		Use:   "use-context NAME",
		Short: "Make NAME the current context",
		Args:  cmdutil.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			file, path, err := load(f)
			if err != nil {
				return err
			}
			if _, _, err := file.Select(args[0]); err != nil {
				return err
			}
			file.CurrentContext = args[0]
			if err := file.Write(path); err != nil {
				return err
			}
			fmt.Fprintf(f.IO.ErrOut, "current context is now %q\n", args[0])
			return nil
		},
	}
}

func newCmdSetContext(f *cmdutil.Factory) *cobra.Command {
	var s config.Settings
	cmd := &cobra.Command{
		Use:   "set-context NAME [--server URL] [--ca-file F] [--token-file F] [--region R]",
		Short: "Create or update a context (only the given fields change)",
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := config.ValidContextName(args[0]); err != nil {
				return &cmdutil.FlagError{Err: err}
			}
			if s.Server != "" && !strings.HasPrefix(s.Server, "https://") {
				return &cmdutil.FlagError{Err: fmt.Errorf("--server must be https://host:port")}
			}
			file, path, err := load(f)
			if err != nil {
				return err
			}
			cur := file.Contexts[args[0]]
			for _, x := range []struct {
				flag string
				dst  *string
				val  string
			}{{"server", &cur.Server, s.Server}, {"ca-file", &cur.CAFile, s.CAFile}, {"token-file", &cur.TokenFile, s.TokenFile}, {"region", &cur.Region, s.Region}} {
				if cmd.Flags().Changed(x.flag) {
					*x.dst = x.val
				}
			}
			if cmd.Flags().Changed("token-file") {
				cur.Token = "" // one token setting per context
			}
			file.Contexts[args[0]] = cur
			if file.CurrentContext == "" {
				file.CurrentContext = args[0]
			}
			return file.Write(path)
		},
	}
	cmd.Flags().StringVar(&s.Server, "server", "", "controller URL, https://host:port")
	cmd.Flags().StringVar(&s.CAFile, "ca-file", "", "CA certificate to trust")
	cmd.Flags().StringVar(&s.TokenFile, "token-file", "", "file holding the API token")
	cmd.Flags().StringVar(&s.Region, "region", "", "default region for placement")
	return cmd
}

func newCmdDeleteContext(f *cmdutil.Factory) *cobra.Command {
	return &cobra.Command{
		Use:   "delete-context NAME",
		Short: "Remove a context (and its token) from the config file",
		Args:  cmdutil.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			file, path, err := load(f)
			if err != nil {
				// The file is refused as a whole; still let the user remove the context.
				if found, rerr := config.DeleteContextRaw(path, args[0]); rerr != nil || !found {
					return err
				}
				fmt.Fprintf(f.IO.ErrOut, "Deleted context %q from %s (the rest of the file was left as it was: %v)\n", args[0], path, err)
				return nil
			}
			if _, ok := file.Contexts[args[0]]; !ok {
				_, _, err := file.Select(args[0])
				return err
			}
			delete(file.Contexts, args[0])
			if file.CurrentContext == args[0] {
				file.CurrentContext = ""
			}
			return file.Write(path)
		},
	}
}

// LoginOptions are `login`'s flags.
type LoginOptions struct {
	Context   string
	Server    string
	CAFile    string
	TokenFile string
	WithToken bool
	Region    string
}

// NewCmdLogin is `gpuaasctl login`.
func NewCmdLogin(f *cmdutil.Factory) *cobra.Command {
	var o LoginOptions
	cmd := &cobra.Command{
		Use:   "login --server URL [--ca-file F] (--with-token < TOKEN | --token-file F) [--context NAME] [--region R]",
		Short: "Check a token against a controller and save it as a named context (0600), made current",
		Long: `Verifies the token by asking the controller who it belongs to, then saves server, CA file,
token (read from standard input with --with-token, stored in the 0600 config file) or token
file, and default region as a context, and makes it current. The context name defaults to
the server's host name.`,
		Example: `  gpuaasctl login --server https://ctl.example:8443 --ca-file ca.crt --with-token < admin.token
  gpuaasctl login --server https://ctl.example:8443 --token-file ~/.gpuaas/acme.token --context acme --region eu-1`,
		Args: cmdutil.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return loginRun(cmd.Context(), f, &o) },
	}
	cmd.Flags().StringVar(&o.Context, "context", "", "context name (default: the server's host)")
	cmd.Flags().StringVar(&o.Server, "server", "", "controller URL, https://host:port (required)")
	cmd.Flags().StringVar(&o.CAFile, "ca-file", "", "CA certificate to trust for the controller")
	cmd.Flags().StringVar(&o.TokenFile, "token-file", "", "file holding the API token (referenced, not copied)")
	cmd.Flags().BoolVar(&o.WithToken, "with-token", false, "read the token from standard input")
	cmd.Flags().StringVar(&o.Region, "region", "", "default region for placement")
	return cmd
}

func loginRun(ctx context.Context, f *cmdutil.Factory, o *LoginOptions) error {
	if o.Server == "" || !strings.HasPrefix(o.Server, "https://") {
		return &cmdutil.FlagError{Err: errors.New("--server https://host:port is required")}
	}
	if o.WithToken == (o.TokenFile != "") {
		return &cmdutil.FlagError{Err: errors.New("give exactly one of --with-token (token on standard input) or --token-file")}
	}
	name := o.Context
	if name == "" {
		name = strings.TrimPrefix(o.Server, "https://")
		if i := strings.IndexAny(name, ":/"); i > 0 {
			name = name[:i]
		}
	}
	if err := config.ValidContextName(name); err != nil {
		return &cmdutil.FlagError{Err: err}
	}
	s := config.Settings{Server: o.Server, CAFile: absPath(o.CAFile), TokenFile: absPath(o.TokenFile), Region: o.Region}
	token := ""
	if o.WithToken {
		b, err := io.ReadAll(io.LimitReader(f.IO.In, 4096))
		if err != nil {
			return err
		}
		token = strings.TrimSpace(string(b))
		if token == "" || strings.ContainsAny(token, " \n\r\t") {
			return &cmdutil.FlagError{Err: errors.New("--with-token: standard input must hold one token")}
		}
		s.Token = token
	} else {
		b, err := os.ReadFile(s.TokenFile)
		if err != nil {
			return err
		}
		token = strings.TrimSpace(string(b))
	}
	c, err := client.New(client.Options{Server: s.Server, CAFile: s.CAFile, Token: token, UserAgent: "gpuaasctl/" + f.AppVersion})
	if err != nil {
		return err
	}
	who, err := c.Whoami(ctx)
	if err != nil {
		return err // the token or server is wrong: nothing is saved
	}
	file, path, err := load(f)
	if err != nil {
		return err
	}
	file.Contexts[name] = s
	file.CurrentContext = name
	if err := file.Write(path); err != nil {
		return err
	}
	tenant := ""
	if who.TenantID != "" {
		tenant = ", tenant " + who.TenantID
	}
	fmt.Fprintf(f.IO.ErrOut, "Logged in to %s as %s (%s%s); context %q saved in %s and made current\n", s.Server, who.Name, who.Role, tenant, name, path)
	return nil
}
