package cmdutil

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/client"
)

var fullID = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// minIDPrefix is the shortest id prefix accepted: shorter ones match too much to be meant.
const minIDPrefix = 4

// ResolveID turns an id argument into a whole id, as docker and gh do: a whole id is used as
// it is (no look-up); otherwise the argument is a prefix of one id (4 characters or more) or
// the short form tables print (output.Short: the id's last 8 hex digits), and list gives the
// ids it may match. No match is not_found (exit 4); several are a usage error naming them.
func ResolveID(ctx context.Context, arg, noun string, list func(context.Context) ([]string, error)) (string, error) {
	if fullID.MatchString(arg) {
		return arg, nil
	}
	if len(arg) < minIDPrefix {
		return "", FlagErrorf("%q is too short to name the %s: give its whole id, the short form tables print, or a prefix of %d characters or more", arg, noun, minIDPrefix)
	}
	ids, err := list(ctx)
	if err != nil {
		return "", err
	}
	want := strings.ToLower(arg)
	var matches []string
	for _, id := range ids {
		hex := strings.ReplaceAll(strings.ToLower(id), "-", "")
		if strings.HasPrefix(strings.ToLower(id), want) || (len(want) == 8 && strings.HasSuffix(hex, want)) {
			matches = append(matches, id)
		}
	}
	switch len(matches) {
	case 1:
		return matches[0], nil
	case 0:
		return "", &apiv1.Error{Code: apiv1.CodeNotFound, Message: fmt.Sprintf("no %s matches %q", noun, arg)}
	}
	if len(matches) > 5 {
		matches = append(matches[:5], "...")
	}
	return "", FlagErrorf("%q matches several %ss (%s): give more of the id", arg, noun, strings.Join(matches, ", "))
}

// AllocationID resolves an allocation argument among those the caller can see.
func AllocationID(ctx context.Context, c *client.Client, arg string) (string, error) {
	return ResolveID(ctx, arg, "allocation", func(ctx context.Context) ([]string, error) {
		items, err := c.ListAllocations(ctx, "")
		return idsOf(items, err, func(a apiv1.Allocation) string { return a.ID })
	})
}

// TaskID resolves a node task argument (admins).
func TaskID(ctx context.Context, c *client.Client, arg string) (string, error) {
	return ResolveID(ctx, arg, "task", func(ctx context.Context) ([]string, error) {
		items, err := c.ListTasks(ctx, "", "")
		return idsOf(items, err, func(t apiv1.Task) string { return t.ID })
	})
}

// SessionID resolves a terminal session argument among those the caller can see.
func SessionID(ctx context.Context, c *client.Client, arg string) (string, error) {
	return ResolveID(ctx, arg, "session", func(ctx context.Context) ([]string, error) {
		items, err := c.ListSessions(ctx, "")
		return idsOf(items, err, func(s apiv1.TerminalSession) string { return s.ID })
	})
}

// TokenID resolves an API token argument (admins).
func TokenID(ctx context.Context, c *client.Client, arg string) (string, error) {
	return ResolveID(ctx, arg, "token", func(ctx context.Context) ([]string, error) {
		items, err := c.ListTokens(ctx)
		return idsOf(items, err, func(t apiv1.Token) string { return t.ID })
	})
}

func idsOf[T any](items []T, err error, id func(T) string) ([]string, error) {
	if err != nil {
		return nil, err
	}
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = id(it)
	}
	return out, nil
}
