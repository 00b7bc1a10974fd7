package output

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/charmbracelet/lipgloss"
	"github.com/muesli/termenv"
)

type item struct {
	ID    string          `json:"id"`
	Count int             `json:"gpu_count"`
	Meta  json.RawMessage `json:"meta"`
}

func TestFormats(t *testing.T) {
	v := List([]item{{ID: "a", Count: 2, Meta: json.RawMessage(`{"k":"v"}`)}})
	var b bytes.Buffer
	if err := Print(&b, JSON, v, nil); err != nil || !strings.Contains(b.String(), `"gpu_count": 2`) || !strings.Contains(b.String(), `"items"`) {
		t.Fatalf("json: %q %v", b.String(), err)
	}
	b.Reset()
	if err := Print(&b, YAML, v, nil); err != nil || !strings.Contains(b.String(), "gpu_count: 2") || !strings.Contains(b.String(), "k: v") {
		t.Fatalf("yaml: %q %v", b.String(), err)
	}
	b.Reset()
	err := Print(&b, Table, v, func(t *TableWriter) {
		t.Row("ID", "GPUS")
		t.Row("abc", 2)
	})
	if err != nil || b.String() != "ID   GPUS\nabc  2\n" {
		t.Fatalf("table: %q %v", b.String(), err)
	}
	b.Reset()
	_ = Print(&b, JSON, List[item](nil), nil)
	if !strings.Contains(b.String(), `"items": []`) {
		t.Fatalf("nil list: %q", b.String())
	}
}

func TestFormatFlagValue(t *testing.T) {
	f := Table
	if err := f.Set("yaml"); err != nil || f != YAML {
		t.Fatal(f, err)
	}
	if err := f.Set("xml"); err == nil || f != YAML {
		t.Fatalf("xml accepted: %v", f)
	}
}

func TestCells(t *testing.T) {
	n := 3
	for _, c := range [][2]string{
		{Dash(""), "-"}, {Dash("x"), "x"}, {IntPtr(nil), "-"}, {IntPtr(&n), "3"}, {Ints([]int{1, 2}), "1,2"}, {Ints(nil), "-"},
		{Money(123456, "USD"), "1234.56 USD"}, {Money(-5, "EUR"), "-0.05 EUR"}, {Millis(1500), "1.5s"},
		{Short("01a21be3-7e0b-7c44-9f2a-4b1c2d3e4f50"), "2d3e4f50"}, {Short("0123456"), "0123456"}, {Time(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)), "2026-01-02 03:04:05Z"},
	} {
		if c[0] != c[1] {
			t.Errorf("got %q, want %q", c[0], c[1])
		}
	}
}

func TestStyledTableMatchesPlainLayout(t *testing.T) {
	lipgloss.SetColorProfile(termenv.ANSI)
	t.Cleanup(func() { lipgloss.SetColorProfile(termenv.Ascii) })
	rows := func(tw *TableWriter) {
		tw.Row("NAME", "STATUS", "SLOTS")
		tw.Row("h200-01", "active", 8)
		tw.Row("h200-long-name", "failed", 12)
		tw.Blank()
		tw.Row("Total:", 20)
	}
	var plain bytes.Buffer
	if err := Print(&plain, Table, nil, rows); err != nil {
		t.Fatal(err)
	}
	var styled bytes.Buffer
	tw := &TableWriter{out: &styled, tw: newTabwriter(&styled), styled: true}
	rows(tw)
	if err := tw.Flush(); err != nil {
		t.Fatal(err)
	}
	s := styled.String()
	if !strings.Contains(s, "\x1b[1mNAME") || !strings.Contains(s, "\x1b[32mactive") || !strings.Contains(s, "\x1b[31mfailed") {
		t.Fatalf("no styling: %q", s)
	}
	stripped := regexp.MustCompile("\x1b\\[[0-9;]*m").ReplaceAllString(s, "")
	if stripped != plain.String() {
		t.Fatalf("styled layout differs from the plain one:\n%s\n---\n%s", stripped, plain.String())
	}
}
