package cmdutil

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// completer lists candidates for a resource kind from the controller.
type completer func(ctx context.Context, f *Factory) ([]string, error)

var completers = map[string]completer{
	"NODE": func(ctx context.Context, f *Factory) ([]string, error) {
		c, err := f.Client()
		if err != nil {
			return nil, err
		}
		nodes, err := c.ListNodes(ctx)
		out := make([]string, 0, len(nodes))
		for _, n := range nodes {
			out = append(out, n.Name+"\t"+n.Mode)
		}
		return out, err
	},
	"ALLOCATION": func(ctx context.Context, f *Factory) ([]string, error) {
		c, err := f.Client()
		if err != nil {
			return nil, err
		}
		allocs, err := c.ListAllocations(ctx, "")
		out := make([]string, 0, len(allocs))
		for _, a := range allocs {
			if a.Status != "released" {
				out = append(out, a.ID+"\t"+a.Status+" "+a.SKU)
			}
		}
		return out, err
	},
	"SKU": func(ctx context.Context, f *Factory) ([]string, error) {
		c, err := f.Client()
		if err != nil {
			return nil, err
		}
		skus, err := c.ListSKUs(ctx)
		out := make([]string, 0, len(skus))
		for _, s := range skus {
			out = append(out, s.SKU+"\t"+s.DisplayName)
		}
		return out, err
	},
}

func complete(f *Factory, kind string) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(cmd *cobra.Command, _ []string, prefix string) ([]string, cobra.ShellCompDirective) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		all, err := completers[kind](ctx, f)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveError
		}
		var out []string
		for _, c := range all {
			if strings.HasPrefix(c, prefix) {
				out = append(out, c)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

// AddDynamicCompletion walks the command tree and completes, from the controller: a first
// argument named NODE (node names), ID under `alloc` (allocation ids), SKU (SKU names), and
// every --sku flag. Shell completion then offers live names: `gpuaasctl nodes show <TAB>`.
func AddDynamicCompletion(root *cobra.Command, f *Factory) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if names := argNames(c.Use); len(names) > 0 && c.ValidArgsFunction == nil {
			kind := names[0]
			if kind == "ID" && c.Parent() != nil && c.Parent().Name() == "alloc" {
				kind = "ALLOCATION"
			}
			if _, ok := completers[kind]; ok {
				first := complete(f, kind)
				c.ValidArgsFunction = func(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
					if len(args) > 0 {
						return nil, cobra.ShellCompDirectiveNoFileComp
					}
					return first(cmd, args, prefix)
				}
			}
		}
		if fl := c.Flags().Lookup("sku"); fl != nil {
			_ = c.RegisterFlagCompletionFunc("sku", complete(f, "SKU"))
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}
