package cmdutil

import (
	"context"
	"strings"
	"testing"
)

// TestResolveID: a whole id is taken as it is; a unique prefix or the short form tables print
// (the last 8 hex digits) names one id; two ids made in the same minute share their first 8
// characters but not their short forms; no match is not_found, several a usage error.
func TestResolveID(t *testing.T) {
	ids := []string{"01a21be3-7e0b-7c44-9f2a-4b1c2d3e4f50", "01a21be3-7e0b-7d55-8e1b-aa00bb11cc22", "01a21bff-0000-7000-8000-000000000001"}
	listed := 0
	list := func(context.Context) ([]string, error) { listed++; return ids, nil }
	ctx := context.Background()
	for arg, want := range map[string]string{
		"01a21be3-7e0b-7c44-9f2a-4b1c2d3e4f50": ids[0],
		"2d3e4f50":                             ids[0],
		"BB11CC22":                             ids[1],
		"01a21bff":                             ids[2],
		"01a21be3-7e0b-7d":                     ids[1],
	} {
		got, err := ResolveID(ctx, arg, "allocation", list)
		if err != nil || got != want {
			t.Errorf("%q = %q, %v; want %q", arg, got, err, want)
		}
	}
	before := listed
	if _, err := ResolveID(ctx, ids[2], "allocation", list); err != nil || listed != before {
		t.Errorf("a whole id was looked up (%d lists) or refused: %v", listed-before, err)
	}
	if _, err := ResolveID(ctx, "01a21be3", "allocation", list); err == nil || ExitCode(err) != ExitUsage || !strings.Contains(err.Error(), "several") {
		t.Errorf("an ambiguous prefix: %v", err)
	}
	if _, err := ResolveID(ctx, "deadbeef", "allocation", list); err == nil || ExitCode(err) != ExitNotFound {
		t.Errorf("no match: %v", err)
	}
	if _, err := ResolveID(ctx, "01a", "allocation", list); err == nil || ExitCode(err) != ExitUsage {
		t.Errorf("too short: %v", err)
	}
}
