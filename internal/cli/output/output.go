// Package output renders gpuaasctl results: JSON and YAML with the API's JSON field names
// (the contract scripts rely on), or an aligned table for people. Table styling lives here
// only, so a later renderer can replace text/tabwriter without touching the commands.
package output

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"go.yaml.in/yaml/v3"

	"github.com/gpuaas/gpuaas/internal/apiv1"
)

// Format is an output format; it implements pflag.Value so a bad -o is a flag error.
type Format string

// The output formats.
const (
	Table Format = "table"
	JSON  Format = "json"
	YAML  Format = "yaml"
	Name  Format = "name" // one name (or id) per line, for scripts
)

// Formats lists the accepted -o values.
var Formats = []string{string(Table), string(JSON), string(YAML), string(Name)}

func (f *Format) String() string { return string(f.Kind()) }

// Set validates and stores a -o value (keeping a --jq expression given before it).
func (f *Format) Set(s string) error {
	switch Format(s) {
	case Table, JSON, YAML, Name:
		q := f.jq()
		*f = Format(s)
		if q != "" {
			*f += Format(jqSep + q)
		}
		return nil
	}
	return fmt.Errorf("must be one of %s", strings.Join(Formats, ", "))
}

// Type names the flag's value in help.
func (f *Format) Type() string { return "format" }

// Print writes v as JSON or YAML, or calls table for the table format.
func Print(w io.Writer, format Format, v any, table func(t *TableWriter)) error {
	if q := format.jq(); q != "" {
		if k := format.Kind(); k != Table && k != JSON {
			return fmt.Errorf("--jq filters JSON output: drop -o %s", k)
		}
		return printJQ(w, q, v)
	}
	switch format {
	case Name:
		return printNames(w, v)
	case JSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case YAML:
		// Through JSON so YAML keys are the JSON field names and RawMessages stay structured.
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		var generic any
		if err := json.Unmarshal(b, &generic); err != nil {
			return err
		}
		enc := yaml.NewEncoder(w)
		enc.SetIndent(2)
		if err := enc.Encode(generic); err != nil {
			return err
		}
		return enc.Close()
	default:
		t := &TableWriter{out: w, tw: newTabwriter(w), styled: Styled(w), tty: terminal(w)}
		table(t)
		return t.Flush()
	}
}

// List wraps items as the API does ({"items": [...]}), never as null.
func List[T any](items []T) apiv1.List[T] {
	if items == nil {
		items = []T{}
	}
	return apiv1.List[T]{Items: items}
}

// TableWriter aligns rows into columns. A Blank line ends a block of aligned rows. On a
// colour terminal the rows are buffered and rendered styled (bold headers, coloured status
// words); otherwise text/tabwriter writes plain text.
type TableWriter struct {
	out    io.Writer
	tw     *tabwriter.Writer
	styled bool
	tty    bool // a terminal: empty lists are said in words
	blocks [][][]string
}

// Header writes a list's header row, or, for an empty list on a terminal, "No NOUN found."
// instead (piped output keeps the bare header, which scripts may expect).
func (t *TableWriter) Header(noun string, n int, cols ...any) {
	if n == 0 && t.tty {
		fmt.Fprintf(t.out, "No %s found.\n", noun)
		return
	}
	t.Row(cols...)
}

func newTabwriter(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

// Row writes one row; each value is formatted with fmt.Sprint.
func (t *TableWriter) Row(cols ...any) {
	parts := make([]string, len(cols))
	for i, c := range cols {
		parts[i] = strings.ReplaceAll(fmt.Sprint(c), "\t", " ")
	}
	if t.styled {
		if len(t.blocks) == 0 {
			t.blocks = [][][]string{nil}
		}
		t.blocks[len(t.blocks)-1] = append(t.blocks[len(t.blocks)-1], parts)
		return
	}
	fmt.Fprintln(t.tw, strings.Join(parts, "\t"))
}

// Blank writes an empty line, which also starts a new column alignment.
func (t *TableWriter) Blank() {
	if t.styled {
		t.blocks = append(t.blocks, nil)
		return
	}
	fmt.Fprintln(t.tw)
}

// Raw flushes the aligned rows so far and lets fn write unaligned text (e.g. a table some
// other package renders).
func (t *TableWriter) Raw(fn func(w io.Writer) error) error {
	if err := t.Flush(); err != nil {
		return err
	}
	return fn(t.out)
}

// Flush writes out buffered rows.
func (t *TableWriter) Flush() error {
	if t.styled {
		blocks := t.blocks
		t.blocks = nil
		if len(blocks) == 0 {
			return nil
		}
		return renderStyled(t.out, blocks)
	}
	return t.tw.Flush()
}
