package cli

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// NewCmdAlloc is `gpuaasctl alloc`.
func NewCmdAlloc(f *Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "alloc", Short: "Create, inspect and release allocations", Aliases: []string{"allocations"}}
	cmd.AddCommand(NewCmdAllocCreate(f, nil), NewCmdAllocList(f), NewCmdAllocShow(f), NewCmdAllocRelease(f), NewCmdAllocExplain(f), NewCmdAllocWait(f))
	return cmd
}

// AllocCreateOptions holds `alloc create` flags and dependencies.
type AllocCreateOptions struct {
	F              *Factory
	SKU            string
	GPUs           int
	Region         string
	Image          string
	Profile        string
	SSHKeyFiles    []string
	TenantID       string
	IdempotencyKey string
	Wait           bool
	Timeout        time.Duration
}

// NewCmdAllocCreate is `gpuaasctl alloc create`.
func NewCmdAllocCreate(f *Factory, runF func(*AllocCreateOptions) error) *cobra.Command {
	o := &AllocCreateOptions{F: f}
	cmd := &cobra.Command{
		Use:   "create --sku SKU --gpus N",
		Short: "Create an allocation (places and reserves it)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.SKU == "" || o.GPUs <= 0 {
				return &FlagError{Err: fmt.Errorf("--sku and a positive --gpus are required")}
			}
			if runF != nil {
				return runF(o)
			}
			return allocCreate(o)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.SKU, "sku", "", "SKU, e.g. h200-sxm-slice")
	fl.IntVar(&o.GPUs, "gpus", 0, "number of GPUs")
	fl.StringVar(&o.Region, "region", "", "region (default: any)")
	fl.StringVar(&o.Image, "image", "", "OS image slug (default: the SKU's default image)")
	fl.StringVar(&o.Profile, "profile", "", "slice VM profile override (admin only)")
	fl.StringArrayVar(&o.SSHKeyFiles, "ssh-key", nil, "OpenSSH public key file (repeatable)")
	fl.StringVar(&o.TenantID, "tenant", "", "tenant id (admins creating on a tenant's behalf)")
	fl.StringVar(&o.IdempotencyKey, "idempotency-key", "", "retry-safe key (default: random per invocation)")
	fl.BoolVar(&o.Wait, "wait", false, "wait until active, showing the host's phases as they complete")
	fl.DurationVar(&o.Timeout, "timeout", 30*time.Minute, "with --wait: give up after this long")
	return cmd
}

func allocCreate(o *AllocCreateOptions) error {
	cfg, err := o.F.Config()
	if err != nil {
		return err
	}
	req := apiv1.AllocationCreate{SKU: o.SKU, GPUs: o.GPUs, Region: o.Region, Image: o.Image, Profile: o.Profile, TenantID: o.TenantID}
	for _, p := range o.SSHKeyFiles {
		b, err := os.ReadFile(p)
		if err != nil {
			return &FlagError{Err: fmt.Errorf("--ssh-key: %w", err)}
		}
		for _, line := range strings.Split(string(b), "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				req.SSHPublicKeys = append(req.SSHPublicKeys, line)
			}
		}
	}
	key := o.IdempotencyKey
	if key == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		key = hex.EncodeToString(b[:])
	}
	c, err := o.F.Client()
	if err != nil {
		return err
	}
	a, _, err := c.CreateAllocation(ctxb(), req, key)
	if err != nil {
		return err
	}
	if o.Wait {
		if a, err = waitAlloc(o.F, a.ID, "active", o.Timeout); err != nil {
			return err
		}
	}
	return printAllocs(o.F, cfg.Output, a, []apiv1.Allocation{*a})
}

func printAllocs(f *Factory, format string, v any, list []apiv1.Allocation) error {
	return render(f.IO.Out, format, v, func(t *tabwriter.Writer) {
		row(t, "ID", "STATUS", "SKU", "GPUS", "REGION", "NODE", "SLOTS", "CREATED")
		for _, a := range list {
			var idx []string
			for _, c := range a.Claims {
				if c.SlotIndex != nil {
					idx = append(idx, fmt.Sprint(*c.SlotIndex))
				}
			}
			row(t, a.ID, a.Status, a.SKU, a.GPUs, dash(a.Region), dash(a.NodeName), dash(strings.Join(idx, ",")), a.CreatedAt.Format("2006-01-02 15:04:05"))
		}
	})
}

// NewCmdAllocList is `gpuaasctl alloc list`.
func NewCmdAllocList(f *Factory) *cobra.Command {
	var status string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List allocations (tenants: their own; admins: all)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			items, err := c.ListAllocations(ctxb(), status)
			if err != nil {
				return err
			}
			return printAllocs(f, cfg.Output, apiv1.List[apiv1.Allocation]{Items: items}, items)
		},
	}
	cmd.Flags().StringVar(&status, "status", "", "only allocations in this status")
	return cmd
}

// NewCmdAllocShow is `gpuaasctl alloc show ID`.
func NewCmdAllocShow(f *Factory) *cobra.Command {
	return &cobra.Command{
		Use:   "show ID",
		Short: "Show an allocation: state, placement, profile, image, price and cost",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			a, err := c.GetAllocation(ctxb(), args[0])
			if err != nil {
				return err
			}
			return render(f.IO.Out, cfg.Output, a, func(t *tabwriter.Writer) { allocDetail(t, a) })
		},
	}
}

func allocDetail(t *tabwriter.Writer, a *apiv1.Allocation) {
	row(t, "ID:", a.ID)
	row(t, "Tenant:", a.TenantID)
	row(t, "SKU:", a.SKU+" ("+a.CapacityShape+")")
	row(t, "GPUs:", a.GPUs)
	row(t, "Region:", dash(a.Region))
	row(t, "Status:", a.Status)
	if a.FailureReason != "" {
		row(t, "Failure:", a.FailureReason)
	}
	row(t, "Placement:", a.PlacementStatus)
	if a.NodeName != "" {
		row(t, "Node:", a.NodeName+" ("+a.NodeID+")")
	}
	row(t, "Profile:", fmt.Sprintf("%s (%s): %d vCPU, %d MiB", a.Profile.Name, a.Profile.Source, a.Profile.VCPUCount, a.Profile.MemoryMiB))
	if a.Image != nil {
		row(t, "Image:", a.Image.Slug+" sha256:"+a.Image.DigestSHA256)
	}
	row(t, "Price:", fmt.Sprintf("%s per GPU-hour x %d GPUs", money(a.Price.GPUHourlyPriceMinor, a.Price.Currency), a.Price.GPUs))
	row(t, "Cost so far:", fmt.Sprintf("%s (%ds billed)", money(a.Cost.AccruedMinor, a.Cost.Currency), a.Cost.BilledSeconds))
	row(t, "Created:", a.CreatedAt.Format("2006-01-02 15:04:05 MST"))
	if a.ActiveAt != nil {
		row(t, "Active since:", a.ActiveAt.Format("2006-01-02 15:04:05 MST"))
	}
	if a.ReleasedAt != nil {
		row(t, "Released:", a.ReleasedAt.Format("2006-01-02 15:04:05 MST"))
	}
	for _, tk := range a.Tasks {
		row(t, "")
		row(t, fmt.Sprintf("Task %s (%s, attempt %d): %s", tk.ID[:8], tk.Type, tk.Attempt, tk.Status))
		var ms int64
		for _, p := range tk.Phases {
			ms += p.DurationMS
			row(t, "", p.Name, p.Status, (time.Duration(p.DurationMS) * time.Millisecond).String(), dash(p.Error))
		}
		if len(tk.Phases) > 0 {
			row(t, "", "total", "", (time.Duration(ms) * time.Millisecond).String())
		}
	}
	if len(a.Claims) > 0 {
		row(t, "")
		row(t, "CLAIM", "KIND", "STATUS", "SLOT", "NUMA", "GPU PCI", "NVME", "FABRIC VF", "MAC", "IP")
		for _, c := range a.Claims {
			row(t, c.ID[:8], c.Kind, c.Status, intp(c.SlotIndex), intp(c.NUMANode), dash(c.PCIAddress), dash(c.NVMeDevice), dash(c.FabricVF), dash(c.MACAddress), dash(c.PrivateIP))
		}
	}
}

// NewCmdAllocRelease is `gpuaasctl alloc release ID`.
func NewCmdAllocRelease(f *Factory) *cobra.Command {
	var wait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "release ID",
		Short: "Release an allocation",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			a, err := c.ReleaseAllocation(ctxb(), args[0])
			if err != nil {
				return err
			}
			if wait {
				if a, err = waitAlloc(f, a.ID, "released", timeout); err != nil {
					return err
				}
			}
			return printAllocs(f, cfg.Output, a, []apiv1.Allocation{*a})
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until released (VM torn down, disks wiped), showing phases")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Minute, "with --wait: give up after this long")
	return cmd
}

// NewCmdAllocWait is `gpuaasctl alloc wait ID --for active|released`.
func NewCmdAllocWait(f *Factory) *cobra.Command {
	var target string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "wait ID --for active|released",
		Short: "Wait for an allocation to reach a state, showing the host's phases as they complete",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if target != "active" && target != "released" {
				return &FlagError{Err: fmt.Errorf("--for must be active or released")}
			}
			cfg, err := f.Config()
			if err != nil {
				return err
			}
			a, err := waitAlloc(f, args[0], target, timeout)
			if err != nil {
				return err
			}
			return printAllocs(f, cfg.Output, a, []apiv1.Allocation{*a})
		},
	}
	cmd.Flags().StringVar(&target, "for", "active", "state to wait for: active or released")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Minute, "give up after this long")
	return cmd
}

// waitAlloc polls the allocation until it reaches target, printing each host phase once as
// it completes (a plain line per phase, to stderr so -o json stays clean). A failed
// allocation is an error carrying its reason.
func waitAlloc(f *Factory, id, target string, timeout time.Duration) (*apiv1.Allocation, error) {
	c, err := f.Client()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	seen := map[string]bool{}
	for {
		a, err := c.GetAllocation(ctxb(), id)
		if err != nil {
			return nil, err
		}
		for _, tk := range a.Tasks {
			for _, p := range tk.Phases {
				key := fmt.Sprintf("%s/%d/%s", tk.ID, tk.Attempt, p.Name)
				if seen[key] {
					continue
				}
				seen[key] = true
				line := fmt.Sprintf("[%6.1fs] %s #%d %-26s %-6s %s", time.Since(start).Seconds(), tk.Type, tk.Attempt, p.Name, p.Status,
					(time.Duration(p.DurationMS) * time.Millisecond).String())
				if p.Error != "" {
					line += "  " + p.Error
				}
				fmt.Fprintln(f.IO.ErrOut, line)
			}
		}
		switch {
		case a.Status == target:
			return a, nil
		case a.Status == "failed" && target != "failed":
			return a, fmt.Errorf("allocation %s failed: %s", id, a.FailureReason)
		case time.Since(start) > timeout:
			return a, fmt.Errorf("allocation %s is still %s after %s", id, a.Status, timeout)
		}
		time.Sleep(500 * time.Millisecond) // status poll interval
	}
}

// NewCmdAllocExplain is `gpuaasctl alloc explain`.
func NewCmdAllocExplain(f *Factory) *cobra.Command {
	var req apiv1.PlacementRequest
	cmd := &cobra.Command{
		Use:   "explain --sku SKU --gpus N",
		Short: "Placement dry run: where a request would land, or why it cannot (reserves nothing)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if req.SKU == "" || req.GPUs <= 0 {
				return &FlagError{Err: fmt.Errorf("--sku and a positive --gpus are required")}
			}
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			ex, err := c.ExplainPlacement(ctxb(), req)
			if err != nil {
				return err
			}
			return render(f.IO.Out, cfg.Output, ex, func(t *tabwriter.Writer) {
				row(t, "Feasible:", ex.Feasible)
				if ex.Reason != "" {
					row(t, "Reason:", ex.Reason)
				}
				for _, line := range strings.Split(ex.Message, "\n") {
					row(t, "", line)
				}
				if len(ex.Choices) > 0 {
					row(t, "")
					row(t, "RANK", "NODE", "SLOTS", "NUMA", "WHY")
					for i, ch := range ex.Choices {
						row(t, i+1, dash(ch.NodeName), dash(joinInts(ch.SlotIndexes)), dash(joinInts(ch.NUMANodes)), ch.Reason)
					}
				}
			})
		},
	}
	cmd.Flags().StringVar(&req.SKU, "sku", "", "SKU")
	cmd.Flags().IntVar(&req.GPUs, "gpus", 0, "number of GPUs")
	cmd.Flags().StringVar(&req.Region, "region", "", "region")
	return cmd
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}
