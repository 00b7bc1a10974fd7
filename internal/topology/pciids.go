package topology

import (
	"bufio"
	"bytes"
	"strings"

	"github.com/gpuaas/gpuaas/internal/hostfs"
)

// knownModels names accelerators this product sells when the host has no pci.ids database.
var knownModels = map[string]string{
	"10de:2330": "NVIDIA H100 SXM5 80GB",
	"10de:2331": "NVIDIA H100 PCIe",
	"10de:2321": "NVIDIA H100 NVL",
	"10de:2335": "NVIDIA H200 SXM 141GB",
	"10de:233b": "NVIDIA H200 NVL",
	"10de:2901": "NVIDIA B200",
	"10de:20b0": "NVIDIA A100 SXM4 40GB",
	"10de:20b2": "NVIDIA A100 SXM4 80GB",
	"1002:74a1": "AMD Instinct MI300X",
	"1002:74a5": "AMD Instinct MI325X",
}

// loadPCIIDs reads the system pci.ids database (through the host seam) for the GPU vendors.
func loadPCIIDs(fs hostfs.FS) map[string]string {
	out := map[string]string{}
	for _, p := range []string{"/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids"} {
		b, err := fs.ReadFile(p)
		if err != nil {
			continue
		}
		vendor := ""
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if line == "" || line[0] == '#' || line[0] == 'C' {
				continue
			}
			if line[0] != '\t' {
				vendor = ""
				if f := strings.Fields(line); len(f) > 0 && (f[0] == "10de" || f[0] == "1002") {
					vendor = f[0]
				}
				continue
			}
			if vendor == "" || strings.HasPrefix(line, "\t\t") {
				continue
			}
			id, name, ok := strings.Cut(strings.TrimPrefix(line, "\t"), "  ")
			if ok {
				out[vendor+":"+strings.TrimSpace(id)] = strings.TrimSpace(name)
			}
		}
		return out
	}
	return out
}
