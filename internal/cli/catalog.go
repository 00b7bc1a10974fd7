package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// NewCmdWhoami is `gpuaasctl whoami`.
func NewCmdWhoami(f *Factory) *cobra.Command {
	return &cobra.Command{
		Use:   "whoami",
		Short: "Show the identity of the configured token",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			w, err := c.Whoami(ctxb())
			if err != nil {
				return err
			}
			return render(f.IO.Out, cfg.Output, w, func(t *tabwriter.Writer) {
				row(t, "Name:", w.Name)
				row(t, "Role:", w.Role)
				row(t, "Tenant:", dash(w.TenantID))
				row(t, "Server:", c.Server())
			})
		},
	}
}

// NewCmdSKUs is `gpuaasctl skus list`.
func NewCmdSKUs(f *Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "skus", Short: "The product catalog"}
	var all bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List SKUs",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			skus, err := c.ListSKUs(ctxb(), all)
			if err != nil {
				return err
			}
			return render(f.IO.Out, cfg.Output, apiv1.List[apiv1.SKU]{Items: skus}, func(t *tabwriter.Writer) {
				row(t, "SKU", "SHAPE", "MODEL", "FABRIC", "GPU COUNTS", "PRICE/GPU-HOUR", "ACTIVE")
				for _, s := range skus {
					row(t, s.SKU, s.CapacityShape, dash(s.AcceleratorModel), s.NetworkFabric, joinInts(s.AllowedGPUCounts), money(s.GPUHourlyPriceMinor, s.Currency), s.Active)
				}
			})
		},
	}
	list.Flags().BoolVar(&all, "all", false, "include inactive SKUs (admin)")
	var file string
	create := &cobra.Command{
		Use:   "create -f FILE",
		Short: "Add a SKU from a YAML or JSON description (admin)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			var in apiv1.SKU
			if err := readStrict(file, &in); err != nil {
				return err
			}
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			out, err := c.CreateSKU(ctxb(), in)
			if err != nil {
				return err
			}
			return render(f.IO.Out, cfg.Output, out, func(t *tabwriter.Writer) {
				row(t, "SKU", "SHAPE", "GPU COUNTS", "PRICE/GPU-HOUR")
				row(t, out.SKU, out.CapacityShape, joinInts(out.AllowedGPUCounts), money(out.GPUHourlyPriceMinor, out.Currency))
			})
		},
	}
	create.Flags().StringVarP(&file, "file", "f", "", "SKU description")
	cmd.AddCommand(list, create)
	return cmd
}

// NewCmdCapacity is `gpuaasctl capacity`.
func NewCmdCapacity(f *Factory) *cobra.Command {
	var sku, region string
	cmd := &cobra.Command{
		Use:   "capacity",
		Short: "Raw free slots and topology-safe capacity per SKU",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			caps, err := c.Capacity(ctxb(), sku, region)
			if err != nil {
				return err
			}
			return render(f.IO.Out, cfg.Output, apiv1.List[apiv1.Capacity]{Items: caps}, func(t *tabwriter.Writer) {
				row(t, "SKU", "REGION", "SHAPE", "RAW FREE SLOTS", "BLOCKED BY POLICY", "FREE NODES", "LAUNCHABLE (GPUS:COUNT)")
				for _, cp := range caps {
					var keys []string
					for k := range cp.Launchable {
						keys = append(keys, k)
					}
					sort.Slice(keys, func(i, j int) bool {
						return len(keys[i]) < len(keys[j]) || (len(keys[i]) == len(keys[j]) && keys[i] < keys[j])
					})
					var parts []string
					for _, k := range keys {
						parts = append(parts, fmt.Sprintf("%s:%d", k, cp.Launchable[k]))
					}
					row(t, cp.SKU, cp.Region, cp.CapacityShape, cp.RawFreeSlots, cp.BlockedByPolicy, cp.FreeNodes, strings.Join(parts, " "))
				}
			})
		},
	}
	cmd.Flags().StringVar(&sku, "sku", "", "only this SKU")
	cmd.Flags().StringVar(&region, "region", "", "only this region")
	return cmd
}

// NewCmdImages is `gpuaasctl images`.
func NewCmdImages(f *Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "images", Short: "The OS image catalog (admin)"}
	list := &cobra.Command{
		Use:   "list",
		Short: "List OS images",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			imgs, err := c.ListImages(ctxb())
			if err != nil {
				return err
			}
			return printImages(f, cfg.Output, apiv1.List[apiv1.OSImage]{Items: imgs}, imgs)
		},
	}
	var file string
	add := &cobra.Command{
		Use:   "add -f FILE",
		Short: "Register an image from a YAML or JSON description (digest_sha256 required)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			var im apiv1.OSImage
			if err := readStrict(file, &im); err != nil {
				return err
			}
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			out, err := c.CreateImage(ctxb(), im)
			if err != nil {
				return err
			}
			return printImages(f, cfg.Output, out, []apiv1.OSImage{*out})
		},
	}
	add.Flags().StringVarP(&file, "file", "f", "", "image description")
	mkDelete := func(hard bool) *cobra.Command {
		use, short := "retire ID|SLUG", "Retire an image (running allocations keep their snapshot)"
		if hard {
			use, short = "delete ID|SLUG", "Delete an image no allocation ever referenced"
		}
		return &cobra.Command{
			Use:   use,
			Short: short,
			Args:  cobra.ExactArgs(1),
			RunE: func(_ *cobra.Command, args []string) error {
				cfg, c, err := setup(f)
				if err != nil {
					return err
				}
				out, err := c.DeleteImage(ctxb(), args[0], hard)
				if err != nil {
					return err
				}
				return printImages(f, cfg.Output, out, []apiv1.OSImage{*out})
			},
		}
	}
	cmd.AddCommand(list, add, mkDelete(false), mkDelete(true))
	return cmd
}

func printImages(f *Factory, format string, v any, imgs []apiv1.OSImage) error {
	return render(f.IO.Out, format, v, func(t *tabwriter.Writer) {
		row(t, "SLUG", "TARGET", "FORMAT", "ACTIVE", "DEFAULT", "DIGEST")
		for _, im := range imgs {
			d := im.DigestSHA256
			if len(d) > 16 {
				d = d[:16] + "…"
			}
			row(t, im.Slug, im.Target, im.ImageFormat, im.Active, im.IsDefault, dash(d))
		}
	})
}

// NewCmdTenants is `gpuaasctl tenants`.
func NewCmdTenants(f *Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "tenants", Short: "Customer accounts (admin)"}
	print := func(format string, v any, ts []apiv1.Tenant) error {
		return render(f.IO.Out, format, v, func(t *tabwriter.Writer) {
			row(t, "ID", "NAME", "CREATED")
			for _, tn := range ts {
				row(t, tn.ID, tn.Name, tn.CreatedAt.Format("2006-01-02 15:04:05"))
			}
		})
	}
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a tenant",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			tn, err := c.CreateTenant(ctxb(), args[0])
			if err != nil {
				return err
			}
			return print(cfg.Output, tn, []apiv1.Tenant{*tn})
		},
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "List tenants",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			ts, err := c.ListTenants(ctxb())
			if err != nil {
				return err
			}
			return print(cfg.Output, apiv1.List[apiv1.Tenant]{Items: ts}, ts)
		},
	}
	cmd.AddCommand(create, list)
	return cmd
}

// NewCmdTokens is `gpuaasctl tokens create`.
func NewCmdTokens(f *Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "tokens", Short: "API tokens (admin)"}
	var req apiv1.TokenCreate
	create := &cobra.Command{
		Use:   "create --name N --role admin|tenant [--tenant ID]",
		Short: "Create a token; it is shown once",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if req.Name == "" || (req.Role != "admin" && req.Role != "tenant") {
				return &FlagError{Err: fmt.Errorf("--name and --role admin|tenant are required")}
			}
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			tok, err := c.CreateToken(ctxb(), req)
			if err != nil {
				return err
			}
			if cfg.Output == "table" {
				fmt.Fprintln(f.IO.Out, tok.Token)
				fmt.Fprintf(f.IO.ErrOut, "token %s (%s) created; store it now: it is not shown again\n", tok.Name, tok.ID)
				return nil
			}
			return render(f.IO.Out, cfg.Output, tok, nil)
		},
	}
	create.Flags().StringVar(&req.Name, "name", "", "token name")
	create.Flags().StringVar(&req.Role, "role", "", "admin or tenant")
	create.Flags().StringVar(&req.TenantID, "tenant", "", "tenant id (tenant tokens)")
	create.Flags().StringVar(&req.TTL, "ttl", "", "lifetime, e.g. 720h (default: no expiry)")
	cmd.AddCommand(create)
	return cmd
}

// NewCmdAudit is `gpuaasctl audit`.
func NewCmdAudit(f *Factory) *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Show the audit log, newest first (admin)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			cfg, c, err := setup(f)
			if err != nil {
				return err
			}
			items, err := c.Audit(ctxb(), limit)
			if err != nil {
				return err
			}
			return render(f.IO.Out, cfg.Output, apiv1.List[apiv1.AuditEntry]{Items: items}, func(t *tabwriter.Writer) {
				row(t, "AT", "ACTOR", "ROLE", "ACTION", "TARGET")
				for _, e := range items {
					row(t, e.At.Format("2006-01-02 15:04:05"), e.Actor, e.ActorRole, e.Action, e.TargetKind+"/"+e.TargetID)
				}
			})
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 50, "entries to show (1..1000)")
	return cmd
}

// readStrict decodes a YAML or JSON file into v using the API's JSON field names, rejecting
// unknown keys (a typo must not silently drop a field).
func readStrict(path string, v any) error {
	if path == "" {
		return &FlagError{Err: fmt.Errorf("-f FILE is required")}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return &FlagError{Err: err}
	}
	var generic any
	if err := yaml.Unmarshal(b, &generic); err != nil {
		return &FlagError{Err: fmt.Errorf("%s: %w", path, err)}
	}
	j, err := json.Marshal(generic)
	if err != nil {
		return &FlagError{Err: fmt.Errorf("%s: %w", path, err)}
	}
	dec := json.NewDecoder(strings.NewReader(string(j)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &FlagError{Err: fmt.Errorf("%s: %w", path, err)}
	}
	return nil
}
