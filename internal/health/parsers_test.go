package health

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/internal/hostfs"
)

func read(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func signals(fs []Finding) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Signal)
	}
	return out
}

// The real healthy captures parse and say nothing; variants made from them (counters and
// flags changed in place) say exactly what changed.
func TestNvidiaSMIRealCaptures(t *testing.T) {
	for _, name := range []string{"nvidia-smi-q-x-h100.xml", "nvidia-smi-q-x-h200.xml"} {
		raw := read(t, name)
		gpus, err := ParseNvidiaSMI(raw)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(gpus) != 1 || NormalizePCI(gpus[0].PCI.BusID) != "0000:00:06.0" || !strings.HasPrefix(gpus[0].Product, "NVIDIA H") {
			t.Fatalf("%s: %+v", name, gpus)
		}
		if f := gpus[0].Findings(); len(f) != 0 {
			t.Fatalf("%s: a healthy GPU has findings %+v", name, f)
		}
		bad := strings.NewReplacer(
			"<dram_uncorrectable>0</dram_uncorrectable>", "<dram_uncorrectable>2</dram_uncorrectable>",
			"<remapped_row_pending>No</remapped_row_pending>", "<remapped_row_pending>Yes</remapped_row_pending>",
			"<remapped_row_failure>No</remapped_row_failure>", "<remapped_row_failure>Yes</remapped_row_failure>",
			"<current_link_width>16x</current_link_width>", "<current_link_width>8x</current_link_width>",
		).Replace(string(raw))
		gpus, err = ParseNvidiaSMI([]byte(bad))
		if err != nil {
			t.Fatal(err)
		}
		got := signals(gpus[0].Findings())
		want := []string{"gpu:ecc_uncorrectable", "gpu:remapped_rows_failure", "gpu:remapped_rows_pending", "pcie:link_downtrained"}
		if !slices.Equal(got, want) {
			t.Fatalf("%s variant: %v, want %v", name, got, want)
		}
	}
	for _, bad := range []string{"", "<nvidia_smi_log></nvidia_smi_log>", "<nvidia_smi_log><gpu>", "not xml"} {
		if _, err := ParseNvidiaSMI([]byte(bad)); err == nil {
			t.Fatalf("%q parsed", bad)
		}
	}
}

// Kernel Xid lines in the forms the driver prints them (dmesg, journal, the older form
// without "PCI:") are mapped to their GPU's PCI address; the real H200 kernel log, with its
// NVRM lines, has none.
func TestXidLines(t *testing.T) {
	if f := XidFindings(string(read(t, "dmesg-h200.txt"))); len(f) != 0 {
		t.Fatalf("a healthy kernel log has Xids: %+v", f)
	}
	log := string(read(t, "dmesg-h200.txt")) +
		"[ 8123.551904] NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n" +
		"Nov 27 11:00:00 h200-01 kernel: NVRM: Xid (PCI:0000:9A:00): 48, pid=2291, name=python3, DBE (double bit error) ECC error.\n" +
		"NVRM: Xid (0000:43:00): 13, Graphics Exception: ESR 0x405840=0x0\n" +
		"NVRM: Xid (PCI:0000:1b:00): xx, not a code\n"
	f := XidFindings(log)
	if len(f) != 3 {
		t.Fatalf("findings %+v", f)
	}
	want := []struct{ addr, sig string }{{"0000:1b:00.0", "xid:79"}, {"0000:9a:00.0", "xid:48"}, {"0000:43:00.0", "xid:13"}}
	for i, w := range want {
		if f[i].PCIAddress != w.addr || f[i].Signal != w.sig || f[i].Source != "kernel" {
			t.Fatalf("finding %d = %+v, want %v", i, f[i], w)
		}
	}
	if r, _ := Decide(f[0].Signal); r.Action != Quarantine {
		t.Fatalf("Xid 79 is a quarantine, got %v", r.Action)
	}
}

// nvme-cli's smart-log JSON: healthy says nothing; the spec's warnings, spare below threshold
// and rising media errors say so; malformed input is an error, not a zero reading.
func TestSmartLog(t *testing.T) {
	raw := read(t, "smart-log-healthy.json")
	s, err := ParseSmartLog(raw)
	if err != nil {
		t.Fatal(err)
	}
	if s.AvailSpare != 100 || s.SpareThresh != 10 || len(s.Findings("nvme0n1", nil)) != 0 {
		t.Fatalf("healthy: %+v %+v", s, s.Findings("nvme0n1", nil))
	}
	bad := strings.NewReplacer(`"critical_warning":0`, `"critical_warning":9`, `"avail_spare":100`, `"avail_spare":5`,
		`"media_errors":0`, `"media_errors":3`).Replace(string(raw))
	s2, err := ParseSmartLog([]byte(bad))
	if err != nil {
		t.Fatal(err)
	}
	got := signals(s2.Findings("nvme0n1", &s))
	if !slices.Equal(got, []string{"nvme:critical_warning", "nvme:spare_below_threshold", "nvme:media_errors_rising"}) {
		t.Fatalf("findings %v", got)
	}
	if f := s2.Findings("nvme0n1", nil); !strings.Contains(f[0].Detail, "available spare below threshold") || !strings.Contains(f[0].Detail, "media read-only") {
		t.Fatalf("critical_warning bits: %q", f[0].Detail)
	}
	obj := strings.Replace(string(raw), `"critical_warning":0`, `"critical_warning":{"value":4,"available_spare":0}`, 1)
	if s3, err := ParseSmartLog([]byte(obj)); err != nil || s3.CriticalWarning != 4 {
		t.Fatalf("object form: %+v %v", s3, err)
	}
	for _, b := range []string{"", "{}", `{"critical_warning":"x","avail_spare":1,"spare_thresh":1,"percent_used":1,"media_errors":0}`, "[1]"} {
		if _, err := ParseSmartLog([]byte(b)); err == nil {
			t.Fatalf("%q parsed", b)
		}
	}
}

// hostTree copies the real H200 GPU's sysfs attributes to addr under a fresh root.
func hostTree(t *testing.T, root, addr string) string {
	t.Helper()
	dir := filepath.Join(root, "sys/bus/pci/devices", addr)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join("testdata", "h200-sysfs-gpu")
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b := read(t, filepath.Join("h200-sysfs-gpu", e.Name()))
		if e.Name() == "driver.link" {
			if err := os.Symlink(strings.TrimSpace(string(b)), filepath.Join(dir, "driver")); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// The real H200's sysfs reads healthy; the same tree with its link downtrained, its config
// space reading 0xffff, or AER counters rising between two readings says so.
func TestPCIeSysfs(t *testing.T) {
	root := t.TempDir()
	dir := hostTree(t, root, "0000:00:06.0")
	fs := hostfs.New(root)
	r := ReadPCIe(fs, "0000:00:06.0")
	if !r.Present || r.VendorID != 0x10de || r.CurSpeed != 32 || r.MaxWidth != 16 || r.Driver != "nvidia" || r.AERFatal != nil {
		t.Fatalf("real reading %+v", r)
	}
	if f := r.Findings(nil, "nvidia"); len(f) != 0 {
		t.Fatalf("healthy: %+v", f)
	}
	if f := r.Findings(nil, "vfio-pci"); !slices.Equal(signals(f), []string{"pcie:driver_unexpected"}) {
		t.Fatalf("driver: %v", signals(f))
	}
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("current_link_width", "8\n")
	if f := ReadPCIe(fs, "0000:00:06.0").Findings(nil, ""); !slices.Equal(signals(f), []string{"pcie:link_downtrained"}) {
		t.Fatalf("downtrained width: %v", signals(f))
	}
	write("current_link_width", "16\n")
	write("current_link_speed", "16.0 GT/s PCIe\n")
	if f := ReadPCIe(fs, "0000:00:06.0").Findings(nil, ""); len(f) != 0 {
		t.Fatalf("an idle GPU on the nvidia driver lowers its link speed on purpose: %v", signals(f))
	}
	_ = os.Remove(filepath.Join(dir, "driver"))
	if err := os.Symlink("../../../bus/pci/drivers/vfio-pci", filepath.Join(dir, "driver")); err != nil {
		t.Fatal(err)
	}
	if f := ReadPCIe(fs, "0000:00:06.0").Findings(nil, "vfio-pci"); !slices.Equal(signals(f), []string{"pcie:link_downtrained"}) {
		t.Fatalf("downtrained speed on vfio-pci: %v", signals(f))
	}
	write("current_link_speed", "32.0 GT/s PCIe\n")
	aer := func(cor, nonfatal, fatal int) {
		write("aer_dev_correctable", "RxErr 0\nBadTLP "+itoa(cor)+"\nBadDLLP 0\nRollover 0\nTimeout 0\nNonFatalErr 0\nCorrIntErr 0\nHeaderOF 0\nTOTAL_ERR_COR "+itoa(cor)+"\n")
		write("aer_dev_nonfatal", "Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO "+itoa(nonfatal)+"\nCmpltAbrt 0\nUnxCmplt 0\nRxOF 0\nMalfTLP 0\nECRC 0\nUnsupReq 0\nACSViol 0\nUncorrIntErr 0\nBlockedTLP 0\nAtomicOpBlocked 0\nTLPBlockedErr 0\nPoisonTLPBlocked 0\nTOTAL_ERR_NONFATAL "+itoa(nonfatal)+"\n")
		write("aer_dev_fatal", "Undefined 0\nDLP "+itoa(fatal)+"\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 0\nCmpltAbrt 0\nUnxCmplt 0\nRxOF 0\nMalfTLP 0\nECRC 0\nUnsupReq 0\nACSViol 0\nUncorrIntErr 0\nBlockedTLP 0\nAtomicOpBlocked 0\nTLPBlockedErr 0\nPoisonTLPBlocked 0\nTOTAL_ERR_FATAL "+itoa(fatal)+"\n")
	}
	aer(2, 0, 0)
	first := ReadPCIe(fs, "0000:00:06.0")
	aer(2, 0, 0)
	if f := ReadPCIe(fs, "0000:00:06.0").Findings(&first, ""); len(f) != 0 {
		t.Fatalf("unchanged counters: %v", signals(f))
	}
	aer(5, 1, 1)
	if f := ReadPCIe(fs, "0000:00:06.0").Findings(&first, ""); !slices.Equal(signals(f), []string{"pcie:aer_fatal_rising", "pcie:aer_nonfatal_rising", "pcie:aer_correctable_rising"}) {
		t.Fatalf("rising: %v", signals(f))
	}
	cfg := read(t, "h200-sysfs-gpu/config")
	for i := range cfg {
		cfg[i] = 0xff
	}
	write("config", string(cfg))
	if f := ReadPCIe(fs, "0000:00:06.0").Findings(&first, ""); !slices.Equal(signals(f), []string{"pcie:config_space_unreadable"}) {
		t.Fatalf("0xffff: %v", signals(f))
	}
	if f := ReadPCIe(fs, "0000:99:00.0").Findings(nil, ""); !slices.Equal(signals(f), []string{"pcie:absent"}) {
		t.Fatalf("absent: %v", signals(f))
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// Every rule has an action and a source; every Xid the issue names is in the table.
func TestPolicyTable(t *testing.T) {
	for _, r := range Table() {
		if r.Name == "" || r.Source == "" || r.Action == "" {
			t.Fatalf("rule %+v", r)
		}
	}
	for _, code := range []int{48, 63, 64, 74, 79, 92, 94, 95, 119, 120} {
		if _, ok := XidRules[code]; !ok {
			t.Fatalf("Xid %d not in the table", code)
		}
	}
	if r, err := Decide("xid:9999"); err != nil || r.Action != Record {
		t.Fatalf("unknown Xid: %+v %v", r, err)
	}
	for _, bad := range []string{"xid:", "xid:79x", "pcie:nope", ""} {
		if _, err := Decide(bad); err == nil {
			t.Fatalf("%q decided", bad)
		}
	}
	if NeedsReset.StoredAction() != "quarantine" || Degrade.StoredAction() != "degrade" {
		t.Fatal("stored actions")
	}
}

// docs/health.md's policy table lists every rule with its action and source.
func TestPolicyTableIsDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "health.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range Table() {
		row := "| `" + r.Signal + "` | " + r.Name + " | " + string(r.Action) + " | " + r.Source + " |"
		if !strings.Contains(string(doc), row) {
			t.Fatalf("docs/health.md lacks the row %s", row)
		}
	}
}

// A guest's report: Xids and ECC counts by GPU position become guest findings for its own
// allocation; the helper's plain snapshot and malformed entries give none; one report gives
// at most 16.
func TestGuestFindings(t *testing.T) {
	if f := GuestFindings("a1", []byte(`{"instance_id":"x","loadavg":"0.1 0.1 0.1","mem_available_kb":1,"gpus":"0, 97, 1, 60;"}`)); len(f) != 0 {
		t.Fatalf("a plain snapshot: %+v", f)
	}
	f := GuestFindings("a1", []byte(`{"xid":[{"gpu_index":1,"code":79},{"gpu_index":-1,"code":79},{"code":48},{"gpu_index":0,"code":0}],"ecc_uncorrectable":[0,2]}`))
	if len(f) != 2 || f[0].Signal != "xid:79" || *f[0].GPUIndex != 1 || f[0].AllocationID != "a1" || f[0].Source != "guest" ||
		f[1].Signal != "gpu:ecc_uncorrectable" || *f[1].GPUIndex != 1 || f[0].PCIAddress != "" {
		t.Fatalf("findings %+v", f)
	}
	var many strings.Builder
	many.WriteString(`{"xid":[`)
	for i := range 40 {
		if i > 0 {
			many.WriteString(",")
		}
		many.WriteString(`{"gpu_index":0,"code":13}`)
	}
	many.WriteString(`]}`)
	if f := GuestFindings("a1", []byte(many.String())); len(f) != 16 {
		t.Fatalf("one report gives %d findings, want at most 16", len(f))
	}
	if f := GuestFindings("a1", []byte(`not json`)); f != nil {
		t.Fatalf("%+v", f)
	}
}
