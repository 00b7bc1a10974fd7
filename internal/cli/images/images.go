// Package images is `gpuaasctl images`: the OS image catalog (admin): list, show, add,
// retire and delete images, and their lifecycle: smoke tests, activation, each SKU's
// default image and canary rollouts.
package images

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/cli/cmdutil"
	"github.com/gpuaas/gpuaas/internal/cli/output"
	"github.com/gpuaas/gpuaas/internal/client"
)

// NewCmdImages is the `images` command group.
func NewCmdImages(f *cmdutil.Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "images", Short: "The OS image catalog (admin)", Aliases: []string{"image"}}
	return cmdutil.Group(cmd,
		NewCmdList(f, nil),
		NewCmdShow(f, nil),
		NewCmdAdd(f, nil),
		NewCmdRetire(f, nil),
		NewCmdDelete(f, nil),
		NewCmdTest(f, nil),
		NewCmdTests(f, nil),
		NewCmdActivate(f, nil),
		NewCmdDefault(f, nil),
		NewCmdRollout(f),
	)
}

func printImages(w io.Writer, o output.Format, v any, imgs []apiv1.OSImage) error {
	return output.Print(w, o, v, func(t *output.TableWriter) {
		t.Header("images", len(imgs), "SLUG", "VERSION", "TARGET", "FORMAT", "ACTIVE", "DEFAULT", "DIGEST", "ID")
		for _, im := range imgs {
			d := im.DigestSHA256
			if len(d) > 16 {
				d = d[:16] + "…"
			}
			t.Row(im.Slug, output.Dash(im.Version), im.Target, output.Dash(im.ImageFormat), im.Active, im.IsDefault, output.Dash(d), im.ID)
		}
	})
}

// ListOptions are `images list`'s dependencies and flags.
type ListOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Output output.Format
}

// NewCmdList is `images list`.
func NewCmdList(f *cmdutil.Factory, runF func(*ListOptions) error) *cobra.Command {
	opts := &ListOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:     "list",
		Short:   "List OS images",
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
			imgs, err := c.ListImages(cmd.Context())
			if err != nil {
				return err
			}
			return printImages(opts.IO.Out, opts.Output, output.List(imgs), imgs)
		},
	}
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

// AddOptions are `images add`'s dependencies and flags.
type AddOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	File   string
	Output output.Format
}

// NewCmdAdd is `images add -f FILE`.
func NewCmdAdd(f *cmdutil.Factory, runF func(*AddOptions) error) *cobra.Command {
	opts := &AddOptions{IO: f.IO, Client: f.Client}
	cmd := &cobra.Command{
		Use:   "add -f FILE",
		Short: "Register an OS image from a YAML or JSON description (digest_sha256 required)",
		Long: `Register an OS image from a YAML or JSON description using the API's field names (slug,
display_name, version, target, family, architecture, image_format, source_type, source_ref,
digest_sha256, ...). id and timestamps are assigned by the controller. Unknown keys are
refused. "-" reads standard input.`,
		Args: cmdutil.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.File == "" {
				return cmdutil.FlagErrorf("-f FILE is required")
			}
			if runF != nil {
				return runF(opts)
			}
			var im apiv1.OSImage
			if err := cmdutil.DecodeFile(opts.IO.In, opts.File, &im); err != nil {
				return err
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			out, err := c.CreateImage(cmd.Context(), im)
			if err != nil {
				return err
			}
			return printImages(opts.IO.Out, opts.Output, out, []apiv1.OSImage{*out})
		},
	}
	cmd.Flags().StringVarP(&opts.File, "file", "f", "", "image description, YAML or JSON (- for standard input)")
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}

// RefOptions are the dependencies and flags of the commands naming one image
// (show, retire, delete).
type RefOptions struct {
	IO     cmdutil.IOStreams
	Client func() (*client.Client, error)

	Image  string // id or slug
	Output output.Format
}

// NewCmdShow is `images show ID|SLUG`.
func NewCmdShow(f *cmdutil.Factory, runF func(*RefOptions) error) *cobra.Command {
	return newCmdRef(f, runF, "show ID|SLUG", "Show an OS image (-o yaml shows every field)",
		(*client.Client).GetImage)
}

// NewCmdRetire is `images retire ID|SLUG`.
func NewCmdRetire(f *cmdutil.Factory, runF func(*RefOptions) error) *cobra.Command {
	return newCmdRef(f, runF, "retire ID|SLUG", "Retire an image: no new allocations use it; running ones keep their snapshot",
		(*client.Client).RetireImage)
}

// NewCmdDelete is `images delete ID|SLUG`.
func NewCmdDelete(f *cmdutil.Factory, runF func(*RefOptions) error) *cobra.Command {
	return newCmdRefConfirm(f, runF, "delete ID|SLUG [--yes]", "Delete an image that no allocation ever referenced (otherwise retire it)",
		"Deleting image %s removes it from the catalog for good",
		(*client.Client).DeleteImage)
}

// newCmdRef builds a command that calls one client method on one image and prints it.
func newCmdRef(f *cmdutil.Factory, runF func(*RefOptions) error, use, short string,
	call func(*client.Client, context.Context, string) (*apiv1.OSImage, error)) *cobra.Command {
	return newCmdRefConfirm(f, runF, use, short, "", call)
}

// newCmdRefConfirm is newCmdRef for a destructive call: confirm (non-empty) says what it
// destroys, and the command asks on a terminal or needs --yes.
func newCmdRefConfirm(f *cmdutil.Factory, runF func(*RefOptions) error, use, short, confirm string,
	call func(*client.Client, context.Context, string) (*apiv1.OSImage, error)) *cobra.Command {
	opts := &RefOptions{IO: f.IO, Client: f.Client}
	yes := false
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cmdutil.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Image = args[0]
			if confirm != "" {
				if err := cmdutil.Confirm(opts.IO, yes, fmt.Sprintf(confirm, opts.Image)); err != nil {
					return err
				}
			}
			if runF != nil {
				return runF(opts)
			}
			c, err := opts.Client()
			if err != nil {
				return err
			}
			im, err := call(c, cmd.Context(), opts.Image)
			if err != nil {
				return err
			}
			return printImages(opts.IO.Out, opts.Output, im, []apiv1.OSImage{*im})
		},
	}
	if confirm != "" {
		cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask")
	}
	cmdutil.AddOutputFlag(cmd, &opts.Output)
	return cmd
}
