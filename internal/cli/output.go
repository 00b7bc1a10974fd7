package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"go.yaml.in/yaml/v3"
)

// render writes v as JSON or YAML (using the API's JSON field names), or calls table.
func render(w io.Writer, format string, v any, table func(t *tabwriter.Writer)) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		var generic any
		if err := json.Unmarshal(b, &generic); err != nil {
			return err
		}
		y, err := yaml.Marshal(generic)
		if err != nil {
			return err
		}
		_, err = w.Write(y)
		return err
	default:
		t := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		table(t)
		return t.Flush()
	}
}

func row(t io.Writer, cols ...any) {
	parts := make([]string, len(cols))
	for i, c := range cols {
		parts[i] = fmt.Sprint(c)
	}
	fmt.Fprintln(t, strings.Join(parts, "\t"))
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func intp(p *int) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprint(*p)
}

func money(minor int64, cur string) string {
	return fmt.Sprintf("%d.%02d %s", minor/100, minor%100, cur)
}
