// Package reservations is `gpuaasctl reservations`: capacity held for a tenant, which only
// allocations created inside it (`alloc create --reservation ID`) can use.
package reservations

import (
	"io"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// NewCmdReservations is the `reservations` command group.
func NewCmdReservations(f *cmdutil.Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "reservations", Short: "Capacity reservations: GPUs held for you", Aliases: []string{"reservation", "rsv"}}
	return cmdutil.Group(cmd, NewCmdCreate(f, nil), NewCmdList(f, nil), NewCmdShow(f, nil), NewCmdCancel(f, nil))
}

func ends(r apiv1.Reservation) string {
	if r.EndsAt == nil {
		return "until cancelled"
	}
	return output.Time(*r.EndsAt)
}

func printReservations(w io.Writer, o output.Format, v any, rs []apiv1.Reservation) error {
	return output.Print(w, o, v, func(t *output.TableWriter) {
		t.Header("reservations", len(rs), "ID", "SKU", "GPUS", "REGION", "HOST", "STATUS", "IN USE", "FREE", "PRICE/GPU-H", "ENDS")
		for _, r := range rs {
			t.Row(r.ID, r.SKU, strconv.Itoa(r.GPUs), r.Region, r.Node, r.Status, strconv.Itoa(r.InUse), strconv.Itoa(r.Free),
				output.Money(r.Price.GPUHourlyPriceMinor, r.Price.Currency), ends(r))
		}
	})
}

// CreateOptions are `reservations create`'s dependencies and flags.
type CreateOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	SKU      string
	GPUs     int
	Region   string
	Duration time.Duration
	TenantID string
	Output   output.Format
}

// NewCmdCreate is `reservations create --sku SKU --gpus N [--duration D]`.
func NewCmdCreate(f *cmdutil.Factory, runF func(*CreateOptions) error) *cobra.Command {
	opts := &CreateOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "create --sku SKU --gpus N [--duration D]",
		Short: "Hold GPUs of a slice SKU from now, for --duration or until cancelled",
		Long: `Hold GPUs of a slice SKU from now, for --duration or until cancelled. The reservation is
placed as an allocation of that size would be (one host, the same NUMA rules), but no VM is
built: the GPUs wait for 'gpuaasctl alloc create --reservation ID'. Held GPUs are billed at
the SKU's catalog GPU-hour price while the reservation lasts, and count against your quota.`,
		Example: `  gpuaasctl reservations create --sku h200-sxm-slice --gpus 8 --duration 72h
  gpuaasctl alloc create --reservation RESERVATION_ID --gpus 2`,
		Args: cmdutil.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.Region == "" {
				opts.Region = f.DefaultRegion()
			}
			if opts.SKU == "" {
				return cmdutil.FlagErrorf("--sku is required")
			}
			if opts.GPUs <= 0 {
				return cmdutil.FlagErrorf("--gpus must be a positive number")
			}
			if opts.Duration < 0 || (opts.Duration > 0 && opts.Duration < time.Second) {
				return cmdutil.FlagErrorf("--duration must be at least 1s (leave it out: until cancelled)")
			}
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			r, err := c.CreateReservation(cmd.Context(), apiv1.ReservationCreate{SKU: opts.SKU, GPUs: opts.GPUs, Region: opts.Region,
				DurationSeconds: int64(opts.Duration / time.Second), TenantID: opts.TenantID})
			if err != nil {
				return err
			}
			return printReservations(opts.IO.Out, opts.Output, r, []apiv1.Reservation{*r})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&opts.SKU, "sku", "", "slice SKU, e.g. h200-sxm-slice")
	fl.IntVar(&opts.GPUs, "gpus", 0, "GPUs to hold (a count the SKU allows)")
	fl.StringVar(&opts.Region, "region", "", "region (default: the context's region, else any)")
	fl.DurationVar(&opts.Duration, "duration", 0, "how long to hold them (default: until cancelled)")
	fl.StringVar(&opts.TenantID, "tenant", "", "tenant id (admins reserving for a tenant)")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

// ListOptions are `reservations list`'s dependencies and flags.
type ListOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Active bool
	Output output.Format
}

// NewCmdList is `reservations list`.
func NewCmdList(f *cmdutil.Factory, runF func(*ListOptions) error) *cobra.Command {
	opts := &ListOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:     "list",
		Short:   "List reservations, newest first",
		Aliases: []string{"ls"},
		Args:    cmdutil.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			rs, err := c.ListReservations(cmd.Context(), opts.Active)
			if err != nil {
				return err
			}
			return printReservations(opts.IO.Out, opts.Output, output.List(rs), rs)
		},
	}
	cmd.Flags().BoolVar(&opts.Active, "active", false, "only reservations still holding capacity")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

// ShowOptions are `reservations show`'s dependencies and flags.
type ShowOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	ID     string
	Output output.Format
}

// NewCmdShow is `reservations show ID`.
func NewCmdShow(f *cmdutil.Factory, runF func(*ShowOptions) error) *cobra.Command {
	opts := &ShowOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show a reservation",
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.ID = args[0]
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			r, err := c.GetReservation(cmd.Context(), opts.ID)
			if err != nil {
				return err
			}
			return output.Print(opts.IO.Out, opts.Output, r, func(t *output.TableWriter) {
				t.Row("ID:", r.ID)
				t.Row("SKU:", r.SKU)
				t.Row("GPUs:", strconv.Itoa(r.GPUs))
				t.Row("Region:", r.Region)
				t.Row("Host:", r.Node)
				t.Row("Status:", r.Status)
				t.Row("In use:", strconv.Itoa(r.InUse))
				t.Row("Free:", strconv.Itoa(r.Free))
				t.Row("Price:", output.Money(r.Price.GPUHourlyPriceMinor, r.Price.Currency)+" per GPU-hour")
				t.Row("Billing:", r.PricePolicy)
				t.Row("Created:", output.Time(r.CreatedAt))
				t.Row("Ends:", ends(*r))
				t.Row("Ended:", output.TimePtr(r.EndedAt))
			})
		},
	}
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

// CancelOptions are `reservations cancel`'s dependencies and flags.
type CancelOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	ID     string
	Yes    bool
	Output output.Format
}

// NewCmdCancel is `reservations cancel ID --yes`.
func NewCmdCancel(f *cmdutil.Factory, runF func(*CancelOptions) error) *cobra.Command {
	opts := &CancelOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "cancel ID [--yes]",
		Short: "Cancel a reservation: its free GPUs return to the fleet now (running allocations go on)",
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.ID = args[0]
			if err := cmdutil.Confirm(opts.IO, opts.Yes, "Cancelling "+opts.ID+" gives its held GPUs back to the fleet"); err != nil {
				return err
			}
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			r, err := c.CancelReservation(cmd.Context(), opts.ID)
			if err != nil {
				return err
			}
			return printReservations(opts.IO.Out, opts.Output, r, []apiv1.Reservation{*r})
		},
	}
	cmd.Flags().BoolVarP(&opts.Yes, "yes", "y", false, "do not ask")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}
