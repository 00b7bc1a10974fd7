package store

import (
	"regexp"
	"testing"
)

// IsUUID accepts exactly what the canonical-form regular expression it replaced accepted.
func TestIsUUIDMatchesTheCanonicalForm(t *testing.T) {
	re := regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	good := "0196b3c0-1a2b-7c3d-8e4f-A0B1C2D3E4F5"
	cases := []string{good, "", "x", noSuchID, good[:35], good + "0", "{" + good[1:],
		"0196b3c01a2b-7c3d-8e4f-a0b1c2d3e4f5-", "0196b3c0-1a2b-7c3d-8e4f-a0b1c2d3e4fg", "0196b3c0-1a2b-7c3d-8e4fa0b1c2d3e4f5a",
		"0196b3c0-1a2b-7c3d-8e4f-a0b1c2d3e4é", "0196b3c0+1a2b-7c3d-8e4f-a0b1c2d3e4f5"}
	// Every single-byte change of a valid id, at every position.
	for i := range len(good) {
		for _, c := range []byte{'-', '0', 'f', 'F', 'g', 'G', ' ', 0, 0xff} {
			b := []byte(good)
			b[i] = c
			cases = append(cases, string(b))
		}
	}
	for _, s := range cases {
		if got, want := IsUUID(s), re.MatchString(s); got != want {
			t.Errorf("IsUUID(%q) = %v, the canonical form says %v", s, got, want)
		}
	}
}

func FuzzIsUUID(f *testing.F) {
	re := regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	f.Add("0196b3c0-1a2b-7c3d-8e4f-a0b1c2d3e4f5")
	f.Add(noSuchID)
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := IsUUID(s), re.MatchString(s); got != want {
			t.Fatalf("IsUUID(%q) = %v, the canonical form says %v", s, got, want)
		}
	})
}
