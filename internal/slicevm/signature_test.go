package slicevm

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gpuaas/gpuaas/internal/hostfs"
	"github.com/gpuaas/gpuaas/internal/imagesig"
	"github.com/gpuaas/gpuaas/internal/task"
)

// recordingRunner runs commands through the real runner and remembers them.
type recordingRunner struct {
	inner hostfs.Runner
	mu    sync.Mutex
	cmds  []string
}

func (r *recordingRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	r.mu.Lock()
	r.cmds = append(r.cmds, name+" "+strings.Join(args, " "))
	r.mu.Unlock()
	return r.inner.Run(ctx, name, args...)
}

func publisher(t *testing.T, name string) (imagesig.Key, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return imagesig.Key{Name: name, Public: base64.StdEncoding.EncodeToString(pub)}, priv
}

// A lab host provisioning for a SKU that requires signed images refuses an image signed by
// a key the controller does not trust, and an unsigned one, in image_stat_download: the
// image server is never asked for a byte, nothing lands in the cache, no qemu-img convert or
// other disk command runs, and the slot's disk keeps its bytes. The same plan with the
// trusted publisher's signature gets past the check.
func TestLabHostRefusesBadImageSignatureBeforeAnyDiskWrite(t *testing.T) {
	h := labHost(t, 3600e9)
	rr := &recordingRunner{inner: h.cfg.Run}
	h.cfg.Run = rr
	image := []byte("a qcow2 image the publisher never signed")
	sum := sha256.Sum256(image)
	digest := hex.EncodeToString(sum[:])
	var fetched atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fetched.Add(1)
		_, _ = w.Write(image)
	}))
	defer srv.Close()
	disk := filepath.Join(t.TempDir(), "nvme0")
	before := bytes.Repeat([]byte("tenant-free disk "), 1024)
	if err := os.WriteFile(disk, before, 0o600); err != nil {
		t.Fatal(err)
	}
	trusted, trustedPriv := publisher(t, "release")
	_, roguePriv := publisher(t, "rogue")

	for what, sig := range map[string]string{"untrusted key": imagesig.Sign(roguePriv, digest), "unsigned": ""} {
		p := plan()
		p.AllocationID = "sig-" + strings.ReplaceAll(what, " ", "-")
		p.Bundles = p.Bundles[:1]
		p.Bundles[0].NVMeDevice = disk
		p.Image = task.Image{Slug: "signed-only", Username: "debian", SourceType: "http", SourceRef: srv.URL + "/img.qcow2",
			DigestSHA256: digest, Format: "qcow2", Signature: sig, SignatureRequired: true}
		p.ImageKeys = []imagesig.Key{trusted}
		rec := &Recorder{TaskID: "t-" + p.AllocationID}
		_, err := h.Provision(context.Background(), p, rec)
		want := imagesig.ErrBadSignature
		if sig == "" {
			want = imagesig.ErrUnsigned
		}
		if !errors.Is(err, want) {
			t.Fatalf("%s: provision = %v, want %v", what, err, want)
		}
		var last task.Phase
		for _, ph := range rec.Phases() {
			last = ph
			if ph.Name == "image_write_convert" || ph.Name == "domain_define_start" {
				t.Fatalf("%s: phase %s ran", what, ph.Name)
			}
		}
		if last.Name != "image_stat_download" || last.Status != "failed" {
			t.Fatalf("%s: last phase %+v, want image_stat_download failed", what, last)
		}
		if _, err := os.Stat(h.SliceDir(p.AllocationID)); !os.IsNotExist(err) {
			t.Fatalf("%s: slice directory left behind: %v", what, err)
		}
	}
	if n := fetched.Load(); n != 0 {
		t.Fatalf("the image server was asked %d times", n)
	}
	if ents, _ := h.cfg.Images.Entries(); len(ents) != 0 {
		t.Fatalf("cache holds %v", ents)
	}
	for _, c := range rr.cmds {
		if !strings.HasSuffix(c, " --version") {
			t.Fatalf("a command ran: %q", c)
		}
	}
	if after, err := os.ReadFile(disk); err != nil || !bytes.Equal(after, before) {
		t.Fatalf("the slot disk changed (%v)", err)
	}

	// The trusted publisher's signature passes: the check names the key.
	p := plan()
	p.Image = task.Image{Slug: "signed-only", DigestSHA256: digest, Signature: imagesig.Sign(trustedPriv, digest), SignatureRequired: true}
	p.ImageKeys = []imagesig.Key{trusted}
	if note, err := verifyImageSignature(p); err != nil || !strings.Contains(note, "signature by release verified") {
		t.Fatalf("trusted signature: %q %v", note, err)
	}
	// A SKU that does not require signatures is not checked.
	p.Image.Signature, p.Image.SignatureRequired = "", false
	if note, err := verifyImageSignature(p); err != nil || note != "" {
		t.Fatalf("unrequired: %q %v", note, err)
	}
}
