package cmdutil

import (
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/cli/output"
)

// ExactArgs requires n positional arguments; a wrong count is a FlagError naming the
// arguments from the command's Use line ("show ID" -> "missing ID").
func ExactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) == n {
			return nil
		}
		if len(args) > n {
			return FlagErrorf("unexpected argument %q", args[n])
		}
		names := argNames(cmd.Use)
		if len(names) >= n {
			return FlagErrorf("missing %s", strings.Join(names[len(args):n], " "))
		}
		return FlagErrorf("%s needs %d argument(s), got %d", cmd.CommandPath(), n, len(args))
	}
}

// NoArgs refuses positional arguments with a FlagError.
func NoArgs(cmd *cobra.Command, args []string) error { return ExactArgs(0)(cmd, args) }

// argNames are the upper-case placeholders after the command name in Use, up to the first
// flag or optional part: "approve NODE (--all-ready | --slot N) --yes" -> [NODE].
func argNames(use string) []string {
	fields := strings.Fields(use)
	var names []string
	for _, f := range fields[min(1, len(fields)):] {
		if strings.HasPrefix(f, "-") || strings.HasPrefix(f, "[") || strings.HasPrefix(f, "(") {
			break
		}
		names = append(names, f)
	}
	return names
}

// Group makes cmd a command group holding subs: without a subcommand it shows its help; an
// unknown subcommand is a usage error (cobra's default would print help and exit 0).
func Group(cmd *cobra.Command, subs ...*cobra.Command) *cobra.Command {
	cmd.Args = cobra.ArbitraryArgs
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2 // cobra's default, which it sets only on its own path
	}
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if len(args) == 0 {
			return c.Help()
		}
		msg := "unknown command " + `"` + args[0] + `" for "` + c.CommandPath() + `"`
		if s := c.SuggestionsFor(args[0]); len(s) > 0 {
			msg += "; did you mean " + strings.Join(s, " or ") + "?"
		}
		return FlagErrorf("%s", msg)
	}
	cmd.AddCommand(subs...)
	return cmd
}

// AddOutputFlag adds -o/--output (table, json or yaml; default table) bound to p. A bad
// value is rejected while parsing, as a flag error.
func AddOutputFlag(cmd *cobra.Command, p *output.Format) {
	if *p == "" {
		*p = output.Table
	}
	cmd.Flags().VarP(p, "output", "o", "output format: table, json, yaml or name (one name or id per line)")
	cmd.Flags().Var(output.JQFlag{P: p}, "jq", "filter the JSON output with a jq expression (strings print bare), e.g. --jq '.items[].id'")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(output.Formats, cobra.ShellCompDirectiveNoFileComp))
}
