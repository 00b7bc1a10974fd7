package fanout

import (
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/hex"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/pki"
)

func TestLedgerCountsLostDuplicateAndUnexpected(t *testing.T) {
	l := newLedger()
	t0 := time.Unix(1000, 0)
	l.commit("a", t0)
	l.commit("b", t0)
	l.commit("c", t0)
	l.receive("d", t0, true) // delivered before its commit was recorded
	l.commit("d", t0.Add(-time.Millisecond))
	if n := l.outstanding(); n != 3 {
		t.Fatalf("outstanding %d, want 3", n)
	}
	l.receive("a", t0.Add(5*time.Millisecond), true)
	l.receive("a", t0.Add(9*time.Millisecond), true)
	l.receive("b", t0.Add(2*time.Millisecond), false)
	l.receive("zz", t0, true)
	if n := l.outstanding(); n != 1 {
		t.Fatalf("outstanding %d, want 1 (c)", n)
	}
	l.pollEmpty(t0.Add(1500 * time.Millisecond))
	l.pollEmpty(t0.Add(1600 * time.Millisecond))
	s := l.summary(t0.Add(-time.Second), 3)
	if s.committed != 4 || s.lost != 1 || s.duplicates != 1 || s.unexpected != 1 || len(s.latencies) != 3 || l.refused != 1 {
		t.Fatalf("summary %+v refused %d", s, l.refused)
	}
	want := []Second{{At: 0, Tasks: 1, P99ms: 1, MaxMs: 1}, {At: 1, Tasks: 2, P99ms: 5, MaxMs: 5}, {At: 2, EmptyPolls: 2}}
	if len(s.series) != 3 || s.series[0] != want[0] || s.series[1] != want[1] || s.series[2] != want[2] {
		t.Fatalf("series %+v, want %+v", s.series, want)
	}
	var sum time.Duration
	for _, d := range s.latencies {
		sum += d
	}
	if sum != 8*time.Millisecond { // a: 5 ms (first receipt), b: 2 ms, d: 1 ms
		t.Fatalf("latencies %v", s.latencies)
	}
}

func TestProcParsers(t *testing.T) {
	stat := "4242 (gpuaas contr) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 75 0 0 20 0 12 0 99 123456 789 ..."
	if d, err := cpuTime(stat); err != nil || d != 3250*time.Millisecond {
		t.Fatalf("cpuTime = %v, %v; want 3.25s", d, err)
	}
	if n, err := vmRSS("Name:\tx\nVmPeak:\t  9 kB\nVmRSS:\t   2048 kB\nThreads: 3\n"); err != nil || n != 2<<20 {
		t.Fatalf("vmRSS = %d, %v", n, err)
	}
	if _, err := vmRSS("Name:\tx\n"); err == nil {
		t.Fatal("vmRSS without the line: no error")
	}
	prof := "heap profile: 1: 2 [3: 4] @ heap/1048576\n# runtime.MemStats\n# Alloc = 10\n# HeapInuse = 4096\n# Stack = 1024 / 2048\n"
	if n, err := heapInUse(prof); err != nil || n != 5120 {
		t.Fatalf("heapInUse = %d, %v; want 5120", n, err)
	}
	if _, err := heapInUse("# HeapInuse = 1\n"); err == nil {
		t.Fatal("heapInUse without Stack: no error")
	}
}

func TestIssueIdentities(t *testing.T) {
	dir := t.TempDir()
	if _, err := pki.Init(pki.InitOptions{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := issueIdentities(ca, []string{"n1", "n2"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 2 || ids[0].serial == ids[1].serial {
		t.Fatalf("identities %+v", ids)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	for i, id := range ids {
		leaf := id.cert.Leaf
		if leaf.Subject.CommonName != "node:"+[]string{"n1", "n2"}[i] || id.nodeID != []string{"n1", "n2"}[i] {
			t.Errorf("%d: CN %q node %q", i, leaf.Subject.CommonName, id.nodeID)
		}
		if id.serial != hex.EncodeToString(leaf.SerialNumber.Bytes()) || !id.notAfter.Equal(leaf.NotAfter) {
			t.Errorf("%d: serial %s / not after %s do not match the certificate", i, id.serial, id.notAfter)
		}
		if !id.cert.PrivateKey.(*ecdsa.PrivateKey).PublicKey.Equal(leaf.PublicKey) {
			t.Errorf("%d: key does not match the certificate", i)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("%d: not a client certificate of the CA: %v", i, err)
		}
	}
}
