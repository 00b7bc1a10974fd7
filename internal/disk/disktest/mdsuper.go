package disktest

import (
	"crypto/rand"
	"encoding/binary"
	"os"
	"testing"
	"time"
)

// The Linux md superblock formats (linux/raid/md_p.h), used only where the kernel has no
// md driver for mdadm --create. One member of a two-disk RAID1 whose other disk is missing.
const (
	mdMagic         = 0xa92b4efc
	mdReservedBytes = 64 << 10 // 0.90: the superblock sits in the last 64 KiB-aligned 64 KiB
)

// writeMDSuperblock writes a version 0.90, 1.0, 1.1 or 1.2 superblock where mdadm would:
// 0.90 and 1.0 at the end of the device, 1.1 at its start, 1.2 4 KiB from its start.
func writeMDSuperblock(t *testing.T, dev, version string) {
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
	var sb []byte
	var off int64
	if version == "0.90" {
		off = size&^(mdReservedBytes-1) - mdReservedBytes
		sb = mdSuper090(size)
	} else {
		sectors := size / 512
		var dataOffset, superOffset uint64
		switch version {
		case "1.0":
			superOffset = uint64((sectors - 16) &^ 7) // 8 KiB from the end, 4 KiB aligned
		case "1.1":
			superOffset, dataOffset = 0, 2048
		case "1.2":
			superOffset, dataOffset = 8, 2048
		default:
			t.Fatalf("md superblock version %q", version)
		}
		dataSize := uint64(sectors) - dataOffset
		if version == "1.0" {
			dataSize = superOffset
		}
		off = int64(superOffset) * 512
		sb = mdSuper1(superOffset, dataOffset, dataSize)
	}
	if _, err := f.WriteAt(sb, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// mdSuper1 is struct mdp_superblock_1 (little-endian) with its dev_roles table.
func mdSuper1(superOffset, dataOffset, dataSize uint64) []byte {
	const maxDev = 2
	b := make([]byte, 256+2*maxDev)
	le := binary.LittleEndian
	le.PutUint32(b[0:], mdMagic)
	le.PutUint32(b[4:], 1) // major_version
	_, _ = rand.Read(b[16:32])
	copy(b[32:64], "gpuaas-test:0") // set_name
	now := uint64(time.Now().Unix())
	le.PutUint64(b[64:], now) // ctime
	le.PutUint32(b[72:], 1)   // level: raid1
	le.PutUint64(b[80:], dataSize)
	le.PutUint32(b[92:], 2) // raid_disks
	le.PutUint64(b[128:], dataOffset)
	le.PutUint64(b[136:], dataSize)
	le.PutUint64(b[144:], superOffset)
	le.PutUint64(b[152:], ^uint64(0)) // recovery_offset: none pending
	le.PutUint32(b[160:], 0)          // dev_number
	_, _ = rand.Read(b[168:184])      // device_uuid
	le.PutUint64(b[192:], now)        // utime
	le.PutUint64(b[200:], 1)          // events
	le.PutUint64(b[208:], ^uint64(0)) // resync_offset: clean
	le.PutUint32(b[220:], maxDev)
	le.PutUint16(b[256:], 0)      // this device plays role 0
	le.PutUint16(b[258:], 0xfffe) // the other is faulty (missing)
	// sb_csum (offset 216): the 32-bit sum of the superblock's little-endian words, carry folded.
	var sum uint64
	for i := 0; i+4 <= len(b); i += 4 {
		sum += uint64(le.Uint32(b[i:]))
	}
	if len(b)%4 == 2 {
		sum += uint64(le.Uint16(b[len(b)-2:]))
	}
	le.PutUint32(b[216:], uint32(sum&0xffffffff+sum>>32))
	return b
}

// mdSuper090 is mdp_super_t (4 KiB of host-endian words; little-endian here).
func mdSuper090(size int64) []byte {
	w := make([]uint32, 1024)
	now := uint32(time.Now().Unix())
	var uuid [16]byte
	_, _ = rand.Read(uuid[:])
	le := binary.LittleEndian
	w[0], w[1], w[2] = mdMagic, 0, 90 // magic, major, minor
	w[5] = le.Uint32(uuid[0:])
	w[6] = now // ctime
	w[7] = 1   // level: raid1
	w[8] = uint32((size&^(mdReservedBytes-1) - mdReservedBytes) / 1024)
	w[9], w[10] = 1, 2 // nr_disks, raid_disks
	w[13], w[14], w[15] = le.Uint32(uuid[4:]), le.Uint32(uuid[8:]), le.Uint32(uuid[12:])
	w[32] = now         // utime
	w[33] = 1           // state: clean
	w[34], w[35] = 1, 1 // active, working
	w[36] = 1           // failed (the missing disk)
	w[39] = 1           // events_lo
	// disks[0] (word 128) and this_disk (word 992): number 0, raid_disk 0, active|sync.
	for _, d := range []int{128, 992} {
		w[d+3], w[d+4] = 0, 1<<1|1<<2
	}
	var sum uint64
	for _, v := range w {
		sum += uint64(v)
	}
	w[38] = uint32(sum&0xffffffff + sum>>32) // sb_csum, computed with itself zero
	b := make([]byte, 4096)
	for i, v := range w {
		le.PutUint32(b[4*i:], v)
	}
	return b
}
