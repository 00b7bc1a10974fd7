package imagecache

import (
	"fmt"
	"os"
	"syscall"
)

// An image is hashed once: a cached file whose size, modification and change times, inode
// and device are what they were when its bytes were last hashed (or written by the download
// that hashed them) is not read again. Anything that rewrites, replaces or truncates the
// file changes its change time (which no caller can set back) and usually more, so the next
// use hashes it again and refuses it on a mismatch. The stamps live in memory: a restarted
// hostd hashes each image once more. (A rewrite of the same size within the file system's
// timestamp granularity of the previous stamp, a few milliseconds, would go unseen; the
// cache directory is root's, 0700.)

// stamp is what the file system says about a file without reading it.
type stamp struct {
	size, mtimeNS, ctimeNS int64
	ino, dev               uint64
}

func statStamp(p string) (stamp, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return stamp{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return stamp{}, fmt.Errorf("imagecache: no inode data for %s", p)
	}
	return stamp{size: fi.Size(), mtimeNS: st.Mtim.Nano(), ctimeNS: st.Ctim.Nano(), ino: st.Ino, dev: uint64(st.Dev)}, nil
}

// remember records digest's file as verified now; the caller holds c.mu.
func (c *Cache) remember(digest string) {
	s, err := statStamp(c.path(digest))
	if err != nil {
		delete(c.stamps, digest)
		return
	}
	if c.stamps == nil {
		c.stamps = map[string]stamp{}
	}
	c.stamps[digest] = s
}

// unchanged says whether digest's file has the stamp it had when last verified; the caller
// holds c.mu.
func (c *Cache) unchanged(digest string) bool {
	want, ok := c.stamps[digest]
	if !ok {
		return false
	}
	got, err := statStamp(c.path(digest))
	return err == nil && got == want
}

// Verify checks that the cached image of digest still holds the bytes of that digest,
// hashing it only when its stamp changed since it was last verified (hashed reports
// whether it did). A mismatching file is removed (ErrDigestMismatch): the next Get
// downloads it again.
func (c *Cache) Verify(digest string) (hashed bool, err error) {
	if !digestRE.MatchString(digest) {
		return false, fmt.Errorf("imagecache: digest %q is not a sha256 hex digest", digest)
	}
	c.mu.Lock()
	ok := c.unchanged(digest)
	c.mu.Unlock()
	if ok {
		return false, nil
	}
	return true, c.rehash(digest)
}

// rehash hashes digest's file (outside the lock: it takes seconds for a large image) and
// remembers its stamp when it matched and did not change while being read.
func (c *Cache) rehash(digest string) error {
	p := c.path(digest)
	before, err := statStamp(p)
	if err != nil {
		return err
	}
	c.n.hashes.Add(1)
	got, err := fileDigest(p)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if got != digest {
		delete(c.stamps, digest)
		_ = os.Remove(p)
		return fmt.Errorf("%w: the cached file of %s… now has sha256 %s", ErrDigestMismatch, digest[:16], got)
	}
	if after, err := statStamp(p); err == nil && after == before {
		if c.stamps == nil {
			c.stamps = map[string]stamp{}
		}
		c.stamps[digest] = after
	}
	return nil
}

// Hashes counts the cached files read again to re-verify them (a download's own hashing
// as the bytes arrive is not counted).
func (c *Cache) Hashes() int64 { return c.n.hashes.Load() }
