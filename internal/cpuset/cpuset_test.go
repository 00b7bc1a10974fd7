package cpuset

import (
	"reflect"
	"testing"
)

func TestParseAndFormat(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
		text string
	}{
		{"", nil, ""},
		{"0", []int{0}, "0"},
		{"0-3,8", []int{0, 1, 2, 3, 8}, "0-3,8"},
		{" 8,0-3 ", []int{0, 1, 2, 3, 8}, "0-3,8"},
		{"0-1,1-2,96-97", []int{0, 1, 2, 96, 97}, "0-2,96-97"},
	} {
		got, err := Parse(tc.in)
		if err != nil {
			t.Fatalf("Parse(%q): %v", tc.in, err)
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Parse(%q) = %v, want %v", tc.in, got, tc.want)
		}
		if f := Format(got); f != tc.text {
			t.Errorf("Format(%v) = %q, want %q", got, f, tc.text)
		}
	}
}

func TestParseRefusesBadLists(t *testing.T) {
	for _, in := range []string{"a", "3-1", "-1", "1-", ",", "0,,1", "8192", "01", "1-2-3", "0x1"} {
		if _, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) accepted", in)
		}
	}
}

func TestOverlapAndUnion(t *testing.T) {
	if got := Overlap([]int{1, 2, 3}, []int{3, 4, 2}); !reflect.DeepEqual(got, []int{2, 3}) {
		t.Errorf("Overlap = %v", got)
	}
	if got := Overlap([]int{1}, []int{2}); got != nil {
		t.Errorf("Overlap of disjoint sets = %v", got)
	}
	if got := Union([]int{4, 1}, []int{1, 2}); !reflect.DeepEqual(got, []int{1, 2, 4}) {
		t.Errorf("Union = %v", got)
	}
}
