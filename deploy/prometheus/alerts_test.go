// The alerting rules are checked and unit-tested with Prometheus' own promtool (Debian
// package prometheus, installed by .ci/deps), and every gpuaas_ series they read must be one
// the controller exports.
package prometheus_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool is missing (Debian package prometheus; .ci/deps installs it)")
		}
		t.Skip("promtool not installed (apt-get install prometheus): alerting rules not checked")
	}
	return p
}

func TestAlertRulesPassPromtool(t *testing.T) {
	bin := promtool(t)
	for _, args := range [][]string{{"check", "rules", "gpuaas-alerts.yml"}, {"test", "rules", "gpuaas-alerts.test.yml"}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// externalSeries are read by the rules but exported by a subsystem outside this repository's
// controller metrics code as it stands (slot health checking exports the quarantined count).
var externalSeries = map[string]bool{"gpuaas_slots_quarantined": true}

func TestAlertRulesReadExportedSeries(t *testing.T) {
	rules, err := os.ReadFile("gpuaas-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	lit := regexp.MustCompile(`"(gpuaas_[a-z0-9_]+)"`)
	root := filepath.Join("..", "..", "internal")
	err = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range lit.FindAllSubmatch(b, -1) {
			exported[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile(`\bgpuaas_[a-z0-9_]+`).FindAll(rules, -1) {
		name := string(m)
		if seen[name] || externalSeries[name] {
			continue
		}
		seen[name] = true
		if !exported[name] {
			missing = append(missing, name)
		}
	}
	if len(seen) < 10 {
		t.Fatalf("found only %d gpuaas_ series in the rules: %v", len(seen), seen)
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("the rules read series no controller code exports: %v", missing)
	}
}
