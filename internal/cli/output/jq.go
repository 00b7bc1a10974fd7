package output

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/itchyny/gojq"
)

// jqSep separates the output kind from a --jq expression inside a Format value, so every
// command that takes -o gets --jq without a field of its own (AddJQFlag).
const jqSep = "\x00jq="

// Kind is the output format without a --jq expression.
func (f Format) Kind() Format {
	k, _, _ := strings.Cut(string(f), jqSep)
	return Format(k)
}

func (f Format) jq() string {
	_, q, _ := strings.Cut(string(f), jqSep)
	return q
}

// JQFlag is --jq EXPR: it filters the JSON output through a jq expression (gojq), as gh does.
type JQFlag struct{ P *Format }

// String is the expression.
func (j JQFlag) String() string {
	if j.P == nil {
		return ""
	}
	return j.P.jq()
}

// Set checks the expression and stores it beside the -o value.
func (j JQFlag) Set(s string) error {
	if _, err := gojq.Parse(s); err != nil {
		return fmt.Errorf("not a jq expression: %v", err)
	}
	*j.P = Format(string(j.P.Kind()) + jqSep + s)
	return nil
}

// Type names the flag's value in help.
func (JQFlag) Type() string { return "expression" }

// printJQ runs expr over v's JSON and prints each result on a line: strings as they are,
// everything else as compact JSON (gh's --jq).
func printJQ(w io.Writer, expr string, v any) error {
	q, err := gojq.Parse(expr)
	if err != nil {
		return err
	}
	var doc any
	if err := roundTrip(v, &doc); err != nil {
		return err
	}
	iter := q.Run(doc)
	for {
		r, ok := iter.Next()
		if !ok {
			return nil
		}
		if err, isErr := r.(error); isErr {
			if herr, halt := err.(*gojq.HaltError); halt && herr.Value() == nil {
				return nil
			}
			return fmt.Errorf("--jq: %v", err)
		}
		if s, isString := r.(string); isString {
			if _, err := fmt.Fprintln(w, s); err != nil {
				return err
			}
			continue
		}
		b, err := gojq.Marshal(r)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintln(w, string(b)); err != nil {
			return err
		}
	}
}

// printNames prints, one per line, the name of each item (its "name" field, else its "id"):
// -o name, for scripts (kubectl's).
func printNames(w io.Writer, v any) error {
	var doc any
	if err := roundTrip(v, &doc); err != nil {
		return err
	}
	items := []any{doc}
	switch d := doc.(type) {
	case []any:
		items = d
	case map[string]any:
		if list, ok := d["items"].([]any); ok {
			items = list
		}
	}
	for _, it := range items {
		m, _ := it.(map[string]any)
		name, _ := m["name"].(string)
		if name == "" {
			name, _ = m["id"].(string)
		}
		if name == "" {
			continue
		}
		if _, err := fmt.Fprintln(w, name); err != nil {
			return err
		}
	}
	return nil
}

// roundTrip turns v into the generic form its JSON decodes to (the API's field names).
func roundTrip(v any, out *any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, out)
}
