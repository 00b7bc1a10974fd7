package sshcmd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
)

// NewCmdSSHConfig is `ssh-config [ALLOCATION]`: a Host block for OpenSSH.
func NewCmdSSHConfig(f *cmdutil.Factory) *cobra.Command {
	user := ""
	return &cobra.Command{
		Use:   "ssh-config [ALLOCATION] [--user NAME]",
		Short: "Print an OpenSSH Host block that reaches slice VMs through gpuaasctl ssh --stdio",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctxFlag := ""
			if c, err := f.Config(); err == nil && c.Context != "" {
				ctxFlag = " --context " + c.Context
			}
			host := "????????-????-????-????-????????????"
			comment := "# gpuaas slice VMs: ssh USER@ALLOCATION_ID"
			if len(args) == 1 {
				host, comment = args[0], "# gpuaas allocation "+args[0]
			}
			fmt.Fprintf(f.IO.Out, "%s\nHost %s\n    ProxyCommand gpuaasctl%s ssh --stdio %%h\n    StrictHostKeyChecking accept-new\n    ServerAliveInterval 30\n", comment, host, ctxFlag)
			if user != "" {
				fmt.Fprintf(f.IO.Out, "    User %s\n", user)
			}
			return nil
		},
	}
}

// NewCmdSessions is the `sessions` group: the relay's audited session log.
func NewCmdSessions(f *cmdutil.Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "sessions", Short: "Terminal sessions: who entered which VM, how long, bytes, exit status; replay recordings"}
	return cmdutil.Group(cmd, newCmdSessionsList(f), newCmdSessionsShow(f), newCmdSessionsPlay(f))
}

func newCmdSessionsList(f *cmdutil.Factory) *cobra.Command {
	format := output.Table
	alloc := ""
	cmd := &cobra.Command{
		Use:     "list [--allocation ID]",
		Short:   "List sessions, newest first (tenants: their own)",
		Aliases: []string{"ls"},
		Args:    cmdutil.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.Client()
			if err != nil {
				return err
			}
			items, err := c.ListSessions(cmd.Context(), alloc)
			if err != nil {
				return err
			}
			return output.Print(f.IO.Out, format, output.List(items), func(t *output.TableWriter) {
				t.Header("sessions", len(items), "ID", "ALLOCATION", "ACTOR", "MODE", "STATUS", "STARTED", "SECONDS", "IN", "OUT", "EXIT", "ENDED BECAUSE")
				for _, s := range items {
					secs, exit := "-", "-"
					if s.StartedAt != nil && s.EndedAt != nil {
						secs = fmt.Sprintf("%.1f", s.EndedAt.Sub(*s.StartedAt).Seconds())
					}
					if s.ExitStatus != nil {
						exit = fmt.Sprint(*s.ExitStatus)
					}
					t.Row(output.Short(s.ID), output.Short(s.AllocationID), s.Actor, s.Mode, s.Status, output.TimePtr(s.StartedAt), secs, s.BytesIn, s.BytesOut, exit, output.Dash(s.EndReason))
				}
			})
		},
	}
	cmd.Flags().StringVar(&alloc, "allocation", "", "only this allocation's sessions")
	cmdutil.AddOutputFlag(cmd, &format)
	return cmd
}

func newCmdSessionsShow(f *cmdutil.Factory) *cobra.Command {
	format := output.Table
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show one session",
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.Client()
			if err != nil {
				return err
			}
			id, err := cmdutil.SessionID(cmd.Context(), c, args[0])
			if err != nil {
				return err
			}
			s, err := c.GetSession(cmd.Context(), id)
			if err != nil {
				return err
			}
			return output.Print(f.IO.Out, format, s, func(t *output.TableWriter) {
				t.Row("Session:", s.ID)
				t.Row("Allocation:", s.AllocationID)
				t.Row("Actor:", s.Actor+" ("+s.ActorRole+")")
				t.Row("Mode:", s.Mode)
				t.Row("Command:", output.Dash(s.Command))
				t.Row("Status:", s.Status)
				t.Row("Created:", output.Time(s.CreatedAt))
				t.Row("Started:", output.TimePtr(s.StartedAt))
				t.Row("Ended:", output.TimePtr(s.EndedAt))
				t.Row("Bytes in/out:", fmt.Sprintf("%d / %d", s.BytesIn, s.BytesOut))
				if s.ExitStatus != nil {
					t.Row("Exit status:", *s.ExitStatus)
				}
				t.Row("Ended because:", output.Dash(s.EndReason))
				t.Row("Recorded:", s.Recorded)
			})
		},
	}
	cmdutil.AddOutputFlag(cmd, &format)
	return cmd
}

func newCmdSessionsPlay(f *cmdutil.Factory) *cobra.Command {
	speed := 1.0
	maxWait := 2 * time.Second
	raw, latest := false, false
	cmd := &cobra.Command{
		Use:   "play (ID | --latest) [--speed 2] [--raw]",
		Short: "Replay a recorded terminal session (asciicast v2); --raw prints the file",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if speed <= 0 {
				return cmdutil.FlagErrorf("--speed must be positive")
			}
			if (len(args) == 1) == latest {
				return cmdutil.FlagErrorf("give a session ID or --latest")
			}
			c, err := f.Client()
			if err != nil {
				return err
			}
			id := ""
			if latest {
				items, err := c.ListSessions(cmd.Context(), "")
				if err != nil {
					return err
				}
				for _, s := range items {
					if s.Recorded {
						id = s.ID
						break
					}
				}
				if id == "" {
					return fmt.Errorf("no recorded session (the controller records terminal mode with --terminal-record-dir)")
				}
			} else if id, err = cmdutil.SessionID(cmd.Context(), c, args[0]); err != nil {
				return err
			}
			cast, err := c.Recording(cmd.Context(), id)
			if err != nil {
				return err
			}
			if raw {
				_, err = f.IO.Out.Write(cast)
				return err
			}
			return Play(cmd.Context(), f.IO.Out, bytes.NewReader(cast), speed, maxWait)
		},
	}
	cmd.Flags().Float64Var(&speed, "speed", speed, "playback speed factor")
	cmd.Flags().DurationVar(&maxWait, "max-wait", maxWait, "cap pauses at this long")
	cmd.Flags().BoolVar(&raw, "raw", false, "print the asciicast file instead of replaying it")
	cmd.Flags().BoolVar(&latest, "latest", false, "the newest recorded session")
	return cmd
}

// Play replays asciicast v2 output events to w with their timing (pauses capped at maxWait,
// scaled by speed).
func Play(ctx context.Context, w io.Writer, r io.Reader, speed float64, maxWait time.Duration) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	if !sc.Scan() {
		return fmt.Errorf("empty recording")
	}
	var hdr struct {
		Version int `json:"version"`
	}
	if err := json.Unmarshal(sc.Bytes(), &hdr); err != nil || hdr.Version != 2 {
		return fmt.Errorf("not an asciicast v2 recording")
	}
	last := 0.0
	for sc.Scan() {
		var ev []any
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil || len(ev) != 3 {
			return fmt.Errorf("bad event %q", strings.TrimSpace(sc.Text()))
		}
		at, _ := ev[0].(float64)
		kind, _ := ev[1].(string)
		data, _ := ev[2].(string)
		if kind != "o" {
			continue
		}
		wait := min(time.Duration((at-last)/speed*float64(time.Second)), maxWait)
		last = at
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
		}
		if _, err := io.WriteString(w, data); err != nil {
			return err
		}
	}
	return sc.Err()
}
