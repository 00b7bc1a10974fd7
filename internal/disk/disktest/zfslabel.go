package disktest

import (
	"crypto/rand"
	"encoding/binary"
	"os"
	"testing"
	"time"
)

// The ZFS vdev label as the on-disk format defines it (OpenZFS vdev_impl.h, uberblock_impl.h),
// hand-made where zfsutils-linux is not installable. Four 256 KiB labels, two at the start
// and two at the end of the device (the end ones aligned down to 256 KiB); each is 8 KiB of
// blank space, an 8 KiB boot header, 112 KiB of XDR-encoded nvlist describing the pool and
// this vdev, then a 128 KiB ring of 1 KiB uberblocks.
const (
	zfsLabelSize     = 256 << 10
	zfsNVListOffset  = 16 << 10
	zfsUberOffset    = 128 << 10
	zfsUberblockSize = 1 << 10
	zfsUberMagic     = 0x00bab10c
	zfsVersion       = 5000 // feature-flags pools
	zfsTypeUint64    = 8
	zfsTypeString    = 9
)

func writeZFSLabels(t *testing.T, dev string) {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	size, err := f.Seek(0, 2)
	if err != nil {
		t.Fatal(err)
	}
	var g [24]byte
	_, _ = rand.Read(g[:])
	le := binary.LittleEndian
	poolGUID, vdevGUID := le.Uint64(g[0:])>>1, le.Uint64(g[8:])>>1
	const txg = 4
	nv := zfsNVList([]zfsPair{
		{"version", zfsVersion, ""},
		{"name", 0, "gpuaastest"},
		{"state", 1, ""}, // POOL_STATE_EXPORTED
		{"txg", txg, ""},
		{"pool_guid", poolGUID, ""},
		{"top_guid", vdevGUID, ""},
		{"guid", vdevGUID, ""},
		{"vdev_children", 1, ""},
	})
	label := make([]byte, zfsLabelSize)
	copy(label[zfsNVListOffset:], nv)
	// One uberblock per synced txg, in ring slot txg % 128.
	for tx := uint64(1); tx <= txg; tx++ {
		ub := label[zfsUberOffset+tx*zfsUberblockSize:]
		le.PutUint64(ub[0:], zfsUberMagic)
		le.PutUint64(ub[8:], zfsVersion)
		le.PutUint64(ub[16:], tx)
		le.PutUint64(ub[24:], poolGUID+vdevGUID) // guid_sum
		le.PutUint64(ub[32:], uint64(time.Now().Unix()))
	}
	align := size % zfsLabelSize
	for l := int64(0); l < 4; l++ {
		off := l * zfsLabelSize
		if l >= 2 {
			off += size - 4*zfsLabelSize - align
		}
		if _, err := f.WriteAt(label, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

type zfsPair struct {
	name string
	u64  uint64
	str  string // a string pair when set
}

// zfsNVList XDR-encodes pairs as a packed nvlist: the 4-byte stream header (encoding XDR,
// little-endian host), the list's version and flags, each pair (encoded size, decoded size,
// name, type, element count, value), and two zero words at the end.
func zfsNVList(pairs []zfsPair) []byte {
	be := binary.BigEndian
	word := func(b []byte, v uint32) []byte { return be.AppendUint32(b, v) }
	xdrString := func(b []byte, s string) []byte {
		b = word(b, uint32(len(s)))
		b = append(b, s...)
		for len(s)%4 != 0 {
			b, s = append(b, 0), s+"\x00"
		}
		return b
	}
	out := []byte{1, 1, 0, 0} // NV_ENCODE_XDR, little-endian host
	out = word(out, 0)        // NV_VERSION
	out = word(out, 1)        // NV_UNIQUE_NAME
	for _, p := range pairs {
		var body []byte
		body = xdrString(body, p.name)
		if p.str != "" {
			body = word(body, zfsTypeString)
			body = word(body, 1)
			body = xdrString(body, p.str)
		} else {
			body = word(body, zfsTypeUint64)
			body = word(body, 1)
			body = be.AppendUint64(body, p.u64)
		}
		enc := uint32(8 + len(body))
		dec := uint32(16 + (len(p.name)+1+7)&^7 + 8) // the native nvpair_t it decodes to
		if p.str != "" {
			dec = uint32(16 + (len(p.name)+1+7)&^7 + (len(p.str)+1+7)&^7)
		}
		out = word(word(out, enc), dec)
		out = append(out, body...)
	}
	return word(word(out, 0), 0)
}
