// Package imagesig is the detached signature an image publisher puts on an OS image: an
// ed25519 signature over the image's sha256 digest. The controller trusts a set of publisher
// keys and sends them to hosts inside the signed provisioning task; a host whose SKU
// requires signed images verifies the signature before it fetches the image or writes a
// byte of it to a disk, and the digest check then ties the bytes to the signed digest.
//
// Formats (docs/images.md has the signing recipe):
//
//   - signed message: the ASCII bytes "gpuaas-image-v1 sha256:" followed by the 64 lowercase
//     hex digits of the digest, no newline;
//   - signature: the 64-byte ed25519 signature, standard base64;
//   - public key: the 32-byte ed25519 public key, standard base64; a trusted-keys file has
//     one "NAME BASE64KEY" per line, # comments and blank lines ignored.
package imagesig

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Key is a trusted publisher key.
type Key struct {
	Name   string `json:"name"`
	Public string `json:"public_key"` // base64 of the 32-byte ed25519 key
}

var digestRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// sigLen is an ed25519 signature's length (not a secret: a signature is public).
const sigLen = ed25519.SignatureSize

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$`)

// Message is the byte string a publisher signs for digest.
func Message(digest string) []byte { return []byte("gpuaas-image-v1 sha256:" + digest) }

// Sign signs digest with priv (tests and tooling; publishers may use openssl instead).
func Sign(priv ed25519.PrivateKey, digest string) string {
	return base64.StdEncoding.EncodeToString(ed25519.Sign(priv, Message(digest)))
}

// ErrUnsigned is an image without a signature where one is required.
var ErrUnsigned = errors.New("image is not signed")

// ErrBadSignature is a signature no trusted key made for this digest.
var ErrBadSignature = errors.New("image signature does not verify against any trusted publisher key")

// ParsePublic decodes a base64 ed25519 public key.
func ParsePublic(s string) (ed25519.PublicKey, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("public key is not %d bytes of standard base64", ed25519.PublicKeySize)
	}
	return ed25519.PublicKey(b), nil
}

// CheckSignature checks a signature's form (64 bytes of standard base64) without keys.
func CheckSignature(sig string) error {
	b, err := base64.StdEncoding.DecodeString(sig)
	if err != nil || len(b) != sigLen {
		return fmt.Errorf("signature is not %d bytes of standard base64", sigLen)
	}
	return nil
}

// Verify returns the name of the trusted key that signed digest, ErrUnsigned when sig is
// empty, or ErrBadSignature when none did. A malformed key in keys is an error: the trust
// list came from the controller and should never be wrong.
func Verify(keys []Key, digest, sig string) (string, error) {
	if !digestRE.MatchString(digest) {
		return "", fmt.Errorf("digest %q is not a sha256 hex digest", digest)
	}
	if sig == "" {
		return "", ErrUnsigned
	}
	if err := CheckSignature(sig); err != nil {
		return "", fmt.Errorf("%w: %v", ErrBadSignature, err)
	}
	raw, _ := base64.StdEncoding.DecodeString(sig)
	if len(keys) == 0 {
		return "", fmt.Errorf("%w (no trusted keys configured)", ErrBadSignature)
	}
	for _, k := range keys {
		pub, err := ParsePublic(k.Public)
		if err != nil {
			return "", fmt.Errorf("trusted key %q: %w", k.Name, err)
		}
		if ed25519.Verify(pub, Message(digest), raw) {
			return k.Name, nil
		}
	}
	return "", ErrBadSignature
}

// ParseKeys reads a trusted-keys file: "NAME BASE64KEY" per line.
func ParseKeys(b []byte) ([]Key, error) {
	var out []Key
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("line %d: want \"NAME BASE64KEY\"", n)
		}
		if !nameRE.MatchString(f[0]) {
			return nil, fmt.Errorf("line %d: key name %q must match %s", n, f[0], nameRE)
		}
		if seen[f[0]] {
			return nil, fmt.Errorf("line %d: key name %q repeats", n, f[0])
		}
		if _, err := ParsePublic(f[1]); err != nil {
			return nil, fmt.Errorf("line %d: %v", n, err)
		}
		seen[f[0]] = true
		out = append(out, Key{Name: f[0], Public: f[1]})
	}
	return out, sc.Err()
}
