package cloudinit

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/gpuaas/gpuaas/internal/health"
)

// guestHelper is the telemetry helper exactly as cloud-init writes it into the guest.
func guestHelper(t *testing.T) string {
	t.Helper()
	s := seed()
	s.TelemetryURL = "http://10.100.0.1:9110/internal/v1/guest-telemetry"
	f, err := Render(s)
	if err != nil {
		t.Fatal(err)
	}
	var ud struct {
		WriteFiles []struct {
			Path    string `yaml:"path"`
			Content string `yaml:"content"`
		} `yaml:"write_files"`
	}
	if err := yaml.Unmarshal(f.UserData, &ud); err != nil {
		t.Fatal(err)
	}
	for _, w := range ud.WriteFiles {
		if w.Path == "/usr/local/bin/gpuaas-metrics-helper" {
			return w.Content
		}
	}
	t.Fatal("the seed has no telemetry helper")
	return ""
}

// helperRig runs the helper with the guest's commands it calls replaced at the boundary this
// machine lacks: nvidia-smi prints a given `nvidia-smi -q -x` file, dmesg a given kernel log,
// and curl records the body it would POST (and fails when told to).
type helperRig struct {
	t                  *testing.T
	dir, script, sys   string
	xml, dmesg, posted string
}

func newHelperRig(t *testing.T, sys string) *helperRig {
	r := &helperRig{t: t, dir: t.TempDir(), sys: sys}
	bin := filepath.Join(r.dir, "bin")
	r.script, r.xml, r.dmesg, r.posted = filepath.Join(r.dir, "helper"), filepath.Join(r.dir, "smi.xml"), filepath.Join(r.dir, "dmesg"), filepath.Join(r.dir, "posted")
	write(t, r.script, guestHelper(t), 0o755)
	write(t, filepath.Join(r.dir, "instance.env"), "GPUAAS_INSTANCE_ID=a1\nGPUAAS_TELEMETRY_TOKEN=tok\nGPUAAS_TELEMETRY_URL=http://h/t\n", 0o600)
	write(t, filepath.Join(bin, "dmesg"), "#!/bin/sh\ncat \""+r.dmesg+"\"\n", 0o755)
	write(t, filepath.Join(bin, "curl"), `#!/bin/sh
while [ $# -gt 0 ]; do [ "$1" = --data ] && printf '%s' "$2" > "$POSTED"; shift; done
exit ${CURL_RC:-0}
`, 0o755)
	write(t, r.dmesg, "", 0o644)
	return r
}

// withSMI installs the nvidia-smi stand-in printing xml for -q -x.
func (r *helperRig) withSMI(xml []byte) {
	write(r.t, r.xml, string(xml), 0o644)
	write(r.t, filepath.Join(r.dir, "bin", "nvidia-smi"), `#!/bin/sh
case "$*" in *-x*) cat "`+r.xml+`" ;; *) echo "0, 0, 0, 30" ;; esac
`, 0o755)
}

// run runs the helper once and returns the body it posted (decoded) and the raw text.
func (r *helperRig) run(curlRC string) (map[string]any, string) {
	r.t.Helper()
	_ = os.Remove(r.posted)
	cmd := exec.Command("sh", r.script)
	cmd.Env = []string{"PATH=" + filepath.Join(r.dir, "bin") + ":/usr/bin:/bin", "GPUAAS_INSTANCE_ENV=" + filepath.Join(r.dir, "instance.env"),
		"GPUAAS_SYS=" + r.sys, "GPUAAS_STATE_DIR=" + filepath.Join(r.dir, "state"), "POSTED=" + r.posted, "CURL_RC=" + curlRC}
	out, err := cmd.CombinedOutput()
	if curlRC == "0" && err != nil {
		r.t.Fatalf("helper: %v\n%s", err, out)
	}
	raw, err := os.ReadFile(r.posted)
	if err != nil {
		r.t.Fatalf("the helper posted nothing: %v\n%s", err, out)
	}
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err != nil {
		r.t.Fatalf("the helper's body is not JSON: %v\n%s", err, raw)
	}
	return body, string(raw)
}

func write(t *testing.T, p, s string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), mode); err != nil {
		t.Fatal(err)
	}
}

func readTestdata(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// signals is what hostd makes of a body: the health findings, as "signal@gpu".
func signals(raw string) []string {
	var out []string
	for _, f := range health.GuestFindings("a1", []byte(raw)) {
		out = append(out, f.Signal+"@"+strconv.Itoa(*f.GPUIndex))
	}
	return out
}

// The helper on the real H200 guest (its PCI functions, its `nvidia-smi -q -x`, its kernel
// log, all captured on the device machine) reports one GPU with no uncorrectable ECC errors
// and no Xid: nothing hostd would turn into a finding.
func TestHelperOnARealHealthyGuestReportsNothingWrong(t *testing.T) {
	r := newHelperRig(t, "testdata/guest-sys-h200")
	r.withSMI(readTestdata(t, "../health/testdata/nvidia-smi-q-x-h200.xml"))
	write(t, r.dmesg, string(readTestdata(t, "../health/testdata/dmesg-h200.txt")), 0o644)
	body, raw := r.run("0")
	if got, _ := json.Marshal(body["ecc_uncorrectable"]); string(got) != "[0]" {
		t.Fatalf("ecc_uncorrectable = %s, want [0]: %s", got, raw)
	}
	if x, ok := body["xid"].([]any); !ok || len(x) != 0 {
		t.Fatalf("xid = %v, want []: %s", body["xid"], raw)
	}
	if s := signals(raw); len(s) != 0 {
		t.Fatalf("a healthy guest produced findings %v", s)
	}
	if body["gpus"] != "0, 0, 0, 30;" || body["instance_id"] != "a1" {
		t.Fatalf("the snapshot part changed: %s", raw)
	}
}

// A two-GPU guest (the real H200 guest with a second GPU function added, and its XML with the
// second GPU's volatile DRAM uncorrectable count raised to 2): the Xids in the kernel log are
// named by the GPU's position, an Xid of an address this guest does not have is dropped, each
// Xid is sent until a report carrying it reaches the host and not again, and the ECC counts
// are sent when they differ from the last ones delivered.
func TestHelperSendsXidAndECCByPosition(t *testing.T) {
	sys := t.TempDir()
	if err := os.CopyFS(sys, os.DirFS("testdata/guest-sys-h200")); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(sys, "bus/pci/devices/0000:00:07.0/vendor"), "0x10de\n", 0o644)
	write(t, filepath.Join(sys, "bus/pci/devices/0000:00:07.0/class"), "0x030200\n", 0o644)
	xml := string(readTestdata(t, "../health/testdata/nvidia-smi-q-x-h200.xml"))
	gpu := regexp.MustCompile(`(?s)\t<gpu id=.*?\n\t</gpu>\n`).FindString(xml)
	if gpu == "" {
		t.Fatal("no <gpu> element in the capture")
	}
	second := strings.Replace(gpu, "00000000:00:06.0", "00000000:00:07.0", 1)
	vol := strings.Index(second, "<volatile>")
	second = second[:vol] + strings.Replace(second[vol:], "<dram_uncorrectable>0<", "<dram_uncorrectable>2<", 1)
	r := newHelperRig(t, sys)
	r.withSMI([]byte(strings.Replace(xml, gpu, gpu+second, 1)))
	log := string(readTestdata(t, "../health/testdata/dmesg-h200.txt")) +
		"[ 8120.100000] NVRM: Xid (PCI:0000:00:06): 13, pid=2291, name=python3, Graphics Exception: ESR 0x405840=0x0\n" +
		"[ 8123.551904] NVRM: Xid (PCI:0000:00:07): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n" +
		"[ 8124.000000] NVRM: Xid (PCI:0000:1b:00): 48, pid=1, name=x, DBE (double bit error) ECC error.\n"
	write(t, r.dmesg, log, 0o644)

	want := "xid:13@0 xid:79@1 gpu:ecc_uncorrectable@1"
	_, raw := r.run("7") // the host was not reached: nothing is marked sent
	if got := strings.Join(signals(raw), " "); got != want {
		t.Fatalf("findings %q, want %q\n%s", got, want, raw)
	}
	if _, raw = r.run("0"); strings.Join(signals(raw), " ") != want {
		t.Fatalf("after a failed post the Xids were not sent again: %v\n%s", signals(raw), raw)
	}
	if _, raw = r.run("0"); len(signals(raw)) != 0 {
		t.Fatalf("a delivered Xid or an unchanged ECC count was sent again: %v\n%s", signals(raw), raw)
	}
	write(t, r.dmesg, log+"[ 9000.000000] NVRM: Xid (PCI:0000:00:06): 94, pid=2291, name=python3, Contained: SM (0x1).\n", 0o644)
	if _, raw = r.run("0"); strings.Join(signals(raw), " ") != "xid:94@0" {
		t.Fatalf("a new Xid: %v\n%s", signals(raw), raw)
	}
	r.withSMI([]byte(strings.Replace(xml, gpu, gpu+strings.Replace(second, "<dram_uncorrectable>2<", "<dram_uncorrectable>3<", 1), 1)))
	if body, raw := r.run("0"); strings.Join(signals(raw), " ") != "gpu:ecc_uncorrectable@1" || body["ecc_uncorrectable"] == nil {
		t.Fatalf("a rising ECC count: %v\n%s", signals(raw), raw)
	}
}

// Older drivers' XML (DTD v11 and before) counts uncorrectable errors in <double_bit><total>.
func TestHelperReadsTheOlderDoubleBitCount(t *testing.T) {
	xml := string(readTestdata(t, "../health/testdata/nvidia-smi-q-x-h100.xml"))
	old := regexp.MustCompile(`(?s)<ecc_errors>\s*<volatile>.*?</volatile>`).ReplaceAllString(xml,
		"<ecc_errors>\n\t\t\t<volatile>\n\t\t\t\t<single_bit>\n\t\t\t\t\t<total>9</total>\n\t\t\t\t</single_bit>\n\t\t\t\t<double_bit>\n\t\t\t\t\t<device_memory>3</device_memory>\n\t\t\t\t\t<total>3</total>\n\t\t\t\t</double_bit>\n\t\t\t</volatile>")
	if old == xml {
		t.Fatal("the H100 capture has no volatile ECC block to rewrite")
	}
	r := newHelperRig(t, "testdata/guest-sys-h200") // the same guest address, 00:06.0
	r.withSMI([]byte(old))
	body, raw := r.run("0")
	if got, _ := json.Marshal(body["ecc_uncorrectable"]); string(got) != "[3]" {
		t.Fatalf("ecc_uncorrectable = %s, want [3]: %s", got, raw)
	}
}

// A guest without a GPU sends no health readings, and says so.
func TestHelperWithoutAGPUSaysSo(t *testing.T) {
	r := newHelperRig(t, t.TempDir())
	write(t, r.dmesg, "[ 1.0] NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus.\n", 0o644)
	body, raw := r.run("0")
	if body["gpu_health"] != "no GPU in this guest" {
		t.Fatalf("gpu_health = %v: %s", body["gpu_health"], raw)
	}
	if _, ok := body["xid"]; ok {
		t.Fatalf("a guest without a GPU sent Xids: %s", raw)
	}
	if _, ok := body["ecc_uncorrectable"]; ok {
		t.Fatalf("a guest without a GPU sent ECC counts: %s", raw)
	}
}
