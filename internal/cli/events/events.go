// Package events is `gpuaasctl events`: the caller's event log (allocation state changes,
// provisioning phases, wipes, maintenance notices), printed once or followed with -w.
package events

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// Options are `events`' dependencies and flags.
type Options struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Watch  bool
	Since  string
	After  string
	Output output.Format
}

// pollWait is each long poll's wait while following (the API allows up to 60 s; the client's
// own timeout is 60 s).
const pollWait = 30 * time.Second

// NewCmdEvents is `events [-w] [--since 1h | --after CURSOR]`.
func NewCmdEvents(f *cmdutil.Factory, runF func(*Options) error) *cobra.Command {
	opts := &Options{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "events [-w] [--since 1h | --after CURSOR]",
		Short: "Show your event log: allocation state changes, provisioning phases, wipes, maintenance notices",
		Long: `Show the event log, oldest first: for a tenant its own events, for an admin every event
(with the node). Without -w it prints what is there and exits; the JSON output's next_cursor
resumes it later with --after. With -w it keeps following (a long poll per page), and -o json
prints one event per line. Resuming by cursor never repeats or skips an event.`,
		Args: cmdutil.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.Since != "" && opts.After != "" {
				return cmdutil.FlagErrorf("--since and --after exclude each other")
			}
			if runF != nil {
				return runF(opts)
			}
			return run(cmd.Context(), opts)
		},
	}
	cmd.Flags().BoolVarP(&opts.Watch, "watch", "w", false, "keep following new events until interrupted")
	cmd.Flags().StringVar(&opts.Since, "since", "", "start at events this recent: a duration (1h) or an RFC 3339 time")
	cmd.Flags().StringVar(&opts.After, "after", "", "start after this cursor (a previous next_cursor)")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

func run(ctx context.Context, opts *Options) error {
	c, err := opts.Client()
	if err != nil {
		return err
	}
	q := client.EventQuery{After: opts.After, Since: opts.Since, Limit: 500}
	if !opts.Watch {
		var all []apiv1.Event
		next := opts.After
		for {
			page, err := c.Events(ctx, q)
			if err != nil {
				return err
			}
			all = append(all, page.Events...)
			if page.NextCursor != "" {
				next = page.NextCursor
			}
			if len(page.Events) < q.Limit {
				break
			}
			q = client.EventQuery{After: next, Limit: q.Limit}
		}
		return output.Print(opts.IO.Out, opts.Output, apiv1.EventPage{Events: nonNil(all), NextCursor: next}, func(t *output.TableWriter) {
			t.Header("events", len(all), "TIME", "TYPE", "ALLOCATION", "DETAIL")
			for _, e := range all {
				t.Row(output.Time(e.CreatedAt), e.Type, output.Dash(e.AllocationID), Detail(e))
			}
		})
	}
	q.Wait = pollWait
	for ctx.Err() == nil {
		page, err := c.Events(ctx, q)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if err := printFollow(opts.IO.Out, opts.Output, page.Events); err != nil {
			return err
		}
		if page.NextCursor != "" {
			q = client.EventQuery{After: page.NextCursor, Limit: q.Limit, Wait: pollWait}
		}
	}
	return nil
}

func nonNil(evs []apiv1.Event) []apiv1.Event {
	if evs == nil {
		return []apiv1.Event{}
	}
	return evs
}

// printFollow writes events as they arrive: one JSON object per line, or one table row each.
func printFollow(w io.Writer, o output.Format, evs []apiv1.Event) error {
	for _, e := range evs {
		if o.Kind() == output.JSON || o.Kind() == output.YAML {
			b, err := json.Marshal(e)
			if err != nil {
				return err
			}
			if _, err := fmt.Fprintf(w, "%s\n", b); err != nil {
				return err
			}
			continue
		}
		if _, err := fmt.Fprintf(w, "%s  %-22s  %-36s  %s\n", output.Time(e.CreatedAt), e.Type, output.Dash(e.AllocationID), Detail(e)); err != nil {
			return err
		}
	}
	return nil
}

// Detail is an event's data in a few words.
func Detail(e apiv1.Event) string {
	var d map[string]any
	_ = json.Unmarshal(e.Data, &d)
	str := func(k string) string {
		if v, ok := d[k]; ok && v != nil {
			return fmt.Sprint(v)
		}
		return ""
	}
	switch {
	case e.Type == "allocation.phase":
		s := fmt.Sprintf("phase %s %s", str("phase"), str("phase_status"))
		if ms, ok := d["duration_ms"].(float64); ok {
			s += " " + output.Millis(int64(ms))
		}
		return s
	case e.Type == "allocation.wipe":
		if d["verified"] == true {
			return "disk wiped and verified (" + str("method") + ")"
		}
		return "disk wipe NOT verified"
	case e.Type == "maintenance.scheduled":
		return "maintenance by " + str("deadline") + ": " + str("reason")
	case strings.HasPrefix(e.Type, "allocation."):
		s := str("status")
		if p := str("previous_status"); p != "" {
			s = p + " -> " + s
		}
		if r := str("reason"); r != "" {
			s += ": " + r
		}
		return s
	}
	return string(e.Data)
}
