package imagesig

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func key(t *testing.T, name string) (Key, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return Key{Name: name, Public: base64.StdEncoding.EncodeToString(pub)}, priv
}

func TestVerify(t *testing.T) {
	digest := strings.Repeat("ab", 32)
	other := strings.Repeat("cd", 32)
	pubA, privA := key(t, "publisher-a")
	pubB, privB := key(t, "publisher-b")
	trusted := []Key{pubA}
	if name, err := Verify(trusted, digest, Sign(privA, digest)); err != nil || name != "publisher-a" {
		t.Fatalf("good signature: %q %v", name, err)
	}
	for what, c := range map[string]struct {
		keys []Key
		sig  string
		want error
	}{
		"untrusted key":       {trusted, Sign(privB, digest), ErrBadSignature},
		"other digest":        {trusted, Sign(privA, other), ErrBadSignature},
		"unsigned":            {trusted, "", ErrUnsigned},
		"garbage":             {trusted, "not base64!", ErrBadSignature},
		"no keys":             {nil, Sign(privA, digest), ErrBadSignature},
		"trusted only b":      {[]Key{pubB}, Sign(privA, digest), ErrBadSignature},
		"truncated signature": {trusted, Sign(privA, digest)[:40], ErrBadSignature},
	} {
		if _, err := Verify(c.keys, digest, c.sig); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", what, err, c.want)
		}
	}
}

func TestParseKeys(t *testing.T) {
	a, _ := key(t, "a")
	keys, err := ParseKeys([]byte("# trusted publishers\n\nrelease-2026 " + a.Public + "\n"))
	if err != nil || len(keys) != 1 || keys[0].Name != "release-2026" {
		t.Fatalf("%v %v", keys, err)
	}
	for _, bad := range []string{"onlyname", "a b c", "bad/name " + a.Public, "k notakey", "k " + a.Public + "\nk " + a.Public} {
		if _, err := ParseKeys([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// The signing recipe in docs/images.md: openssl makes the key and the signature, and the
// result verifies here.
func TestOpenSSLRecipeVerifies(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("CI needs openssl (apt-get install openssl)")
		}
		t.Skip("openssl not installed (apt-get install openssl)")
	}
	dir := t.TempDir()
	digest := strings.Repeat("0f", 32)
	run := func(args ...string) []byte {
		t.Helper()
		out, err := exec.Command("openssl", args...).Output()
		if err != nil {
			t.Fatalf("openssl %v: %v", args, err)
		}
		return out
	}
	priv := filepath.Join(dir, "publisher.pem")
	run("genpkey", "-algorithm", "ed25519", "-out", priv)
	der := run("pkey", "-in", priv, "-pubout", "-outform", "DER")
	pub := base64.StdEncoding.EncodeToString(der[len(der)-32:]) // the last 32 bytes of the SPKI are the key
	msg := filepath.Join(dir, "msg")
	if err := os.WriteFile(msg, Message(digest), 0o600); err != nil {
		t.Fatal(err)
	}
	sig := base64.StdEncoding.EncodeToString(run("pkeyutl", "-sign", "-inkey", priv, "-rawin", "-in", msg))
	if name, err := Verify([]Key{{Name: "openssl", Public: pub}}, digest, sig); err != nil || name != "openssl" {
		t.Fatalf("openssl signature: %q %v", name, err)
	}
}
