package slots

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// HealthOptions are `slots quarantine` and `slots clear`'s dependencies and flags.
type HealthOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Node       string
	Index      int
	Quarantine bool // false: clear
	Reason     string
	Output     output.Format
}

// NewCmdQuarantine is `slots quarantine NODE INDEX --reason R`.
func NewCmdQuarantine(f *cmdutil.Factory, runF func(*HealthOptions) error) *cobra.Command {
	return newCmdHealth(f, runF, true, "quarantine NODE INDEX --reason TEXT",
		"Quarantine a slot: never placed again until cleared (a live allocation keeps it until release)")
}

// NewCmdClear is `slots clear NODE INDEX --reason R`.
func NewCmdClear(f *cmdutil.Factory, runF func(*HealthOptions) error) *cobra.Command {
	return newCmdHealth(f, runF, false, "clear NODE INDEX --reason TEXT",
		"Return a slot to healthy (a quarantined one needs a passed validation since it was quarantined)")
}

func newCmdHealth(f *cmdutil.Factory, runF func(*HealthOptions) error, quarantine bool, use, short string) *cobra.Command {
	opts := &HealthOptions{IO: f.IO, Client: f.Client, Quarantine: quarantine}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cmdutil.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Node = args[0]
			idx, err := parseIndex(args[1])
			if err != nil {
				return err
			}
			opts.Index = idx
			if strings.TrimSpace(opts.Reason) == "" {
				return cmdutil.FlagErrorf("--reason is required: it is kept in the slot's history and the audit log")
			}
			if runF != nil {
				return runF(opts)
			}
			return healthRun(cmd.Context(), opts)
		},
	}
	cmd.Flags().StringVar(&opts.Reason, "reason", "", "why (kept in the slot's health history and the audit log)")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

func healthRun(ctx context.Context, opts *HealthOptions) error {
	c, err := opts.Client()
	if err != nil {
		return err
	}
	var ev *apiv1.HealthEvent
	if opts.Quarantine {
		ev, err = c.QuarantineSlot(ctx, opts.Node, opts.Index, opts.Reason)
	} else {
		ev, err = c.ClearSlot(ctx, opts.Node, opts.Index, opts.Reason)
	}
	if err != nil {
		return err
	}
	return output.Print(opts.IO.Out, opts.Output, ev, func(t *output.TableWriter) {
		t.Row(fmt.Sprintf("slot %d on %s: %s -> %s (%s)", opts.Index, opts.Node, ev.HealthBefore, ev.HealthAfter, ev.Reason))
	})
}

// printHealth is the health part of `slots show`: state, recent events and validations.
func printHealth(t *output.TableWriter, h *apiv1.SlotHealth) {
	state := h.Health
	if h.HealthReason != "" {
		state += " (" + h.HealthReason + ")"
	}
	if h.HealthSince != nil {
		state += " since " + output.TimePtr(h.HealthSince)
	}
	t.Row("Health:", state)
	if len(h.Validations) > 0 {
		v := h.Validations[0]
		t.Row("Validation:", validationLine(v))
		for _, c := range v.Checks {
			t.Row("", "  "+checkLine(c))
		}
	} else {
		t.Row("Validation:", "-")
	}
	for i, e := range h.Events {
		if i == 5 {
			t.Row("", fmt.Sprintf("(%d more: --output json)", len(h.Events)-5))
			break
		}
		label := ""
		if i == 0 {
			label = "Events:"
		}
		t.Row(label, fmt.Sprintf("%s %s %s %s -> %s: %s", output.TimePtr(&e.At), e.Source, e.Signal, e.HealthBefore, e.HealthAfter, e.Reason))
	}
}

func validationLine(v apiv1.SlotValidation) string {
	res := "failed"
	if v.Passed {
		res = "passed"
	}
	if v.Simulated {
		res += " (simulated)"
	}
	return fmt.Sprintf("%s %s at %s", v.Level, res, output.TimePtr(&v.RecordedAt))
}

func checkLine(c apiv1.ValidationCheck) string {
	res := "ok"
	switch {
	case c.Simulated:
		res = "simulated"
	case c.Skipped:
		res = "skipped"
	case !c.Passed:
		res = "FAILED"
	}
	if c.Detail != "" {
		return c.Name + ": " + res + " (" + c.Detail + ")"
	}
	return c.Name + ": " + res
}
