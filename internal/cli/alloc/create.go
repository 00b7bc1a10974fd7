package alloc

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// CreateOptions are `alloc create`'s dependencies and flags.
type CreateOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	SKU            string
	GPUs           int
	Region         string
	Image          string
	Profile        string
	SSHKeyFiles    []string
	TenantID       string
	Reservation    string
	IdempotencyKey string
	Wait           bool
	Timeout        time.Duration
	Output         output.Format
}

// NewCmdCreate is `alloc create`.
func NewCmdCreate(f *cmdutil.Factory, runF func(*CreateOptions) error) *cobra.Command {
	opts := &CreateOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "create --sku SKU --gpus N",
		Short: "Create an allocation: place it and reserve its GPUs",
		Long: `Create an allocation: place it and reserve its GPUs.

Every invocation sends a fresh random Idempotency-Key; pass --idempotency-key to make a
retried command return the allocation the first attempt created instead of a second one.`,
		Example: `  gpuaasctl alloc create --sku h200-sxm-slice --gpus 2 --ssh-key ~/.ssh/id_ed25519.pub
  gpuaasctl alloc create --sku h200-sxm-slice --gpus 4 --tenant TENANT_ID --wait -o json
  gpuaasctl alloc create --reservation RESERVATION_ID --gpus 2`,
		Args: cmdutil.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.Region == "" && opts.Reservation == "" {
				opts.Region = f.DefaultRegion()
			}
			if opts.SKU == "" && opts.Reservation == "" {
				return cmdutil.FlagErrorf("--sku is required (or --reservation)")
			}
			if opts.GPUs <= 0 {
				return cmdutil.FlagErrorf("--gpus must be a positive number")
			}
			if runF != nil {
				return runF(opts)
			}
			return createRun(cmd.Context(), opts)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&opts.SKU, "sku", "", "SKU, e.g. h200-sxm-slice (gpuaasctl skus list shows them)")
	fl.IntVar(&opts.GPUs, "gpus", 0, "number of GPUs")
	fl.StringVar(&opts.Region, "region", "", "region (default: the context's region, else any)")
	fl.StringVar(&opts.Image, "image", "", "OS image slug (default: the SKU's default image)")
	fl.StringVar(&opts.Profile, "profile", "", "slice VM profile override (admin only)")
	fl.StringArrayVar(&opts.SSHKeyFiles, "ssh-key", nil, "OpenSSH public key file (repeatable)")
	fl.StringVar(&opts.TenantID, "tenant", "", "tenant id (admins creating on a tenant's behalf)")
	fl.StringVar(&opts.Reservation, "reservation", "", "capacity reservation id: place inside it (its SKU unless --sku)")
	fl.StringVar(&opts.IdempotencyKey, "idempotency-key", "", "retry-safe key (default: random per invocation)")
	fl.BoolVar(&opts.Wait, "wait", false, "wait until active, showing the host's phases as they complete")
	fl.DurationVar(&opts.Timeout, "timeout", 30*time.Minute, "with --wait: give up after this long")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

func createRun(ctx context.Context, opts *CreateOptions) error {
	req := apiv1.AllocationCreate{
		SKU: opts.SKU, GPUs: opts.GPUs, Region: opts.Region, Image: opts.Image,
		Profile: opts.Profile, TenantID: opts.TenantID, ReservationID: opts.Reservation,
	}
	for _, p := range opts.SSHKeyFiles {
		keys, err := readSSHKeys(p)
		if err != nil {
			return err
		}
		req.SSHPublicKeys = append(req.SSHPublicKeys, keys...)
	}
	key := opts.IdempotencyKey
	if key == "" {
		key = rand.Text()
	}
	c, err := opts.Client()
	if err != nil {
		return err
	}
	a, err := c.CreateAllocation(ctx, req, key)
	if errors.Is(err, client.ErrUnreachable) || (err != nil && ctx.Err() != nil) {
		// The request may have reached the controller: retrying with the same key is safe.
		return fmt.Errorf("%w\n(retry with --idempotency-key %s: it returns the allocation if the first attempt created one)", err, key)
	}
	if err != nil {
		return err
	}
	if opts.Wait {
		// The id goes out before the wait: an interrupted or failed wait must not lose the
		// allocation, which goes on (and is billed) whatever happens to this command.
		fmt.Fprintf(opts.IO.ErrOut, "Created allocation %s (%s); waiting for it to become active\n", a.ID, a.Status)
		id := a.ID
		if a, err = waitFor(ctx, opts.IO.ErrOut, c, a, "active", opts.Timeout); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("interrupted: allocation %s is still running and is billed until released; "+
					"follow it with `gpuaasctl alloc wait %s`, release it with `gpuaasctl alloc release %s`", id, id, id)
			}
			return err
		}
	}
	return printList(opts.IO.Out, opts.Output, a, []apiv1.Allocation{*a})
}

// readSSHKeys reads an authorized_keys-style file: one key per line, comments skipped.
func readSSHKeys(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, cmdutil.FlagErrorf("--ssh-key: %w", err)
	}
	var keys []string
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			keys = append(keys, line)
		}
	}
	if len(keys) == 0 {
		return nil, cmdutil.FlagErrorf("--ssh-key %s holds no public key", path)
	}
	return keys, nil
}
