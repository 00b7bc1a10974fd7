package agent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"runtime"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/internal/imagecache"
	"github.com/gpuaas/gpuaas/internal/prereq"
	"github.com/gpuaas/gpuaas/internal/task"
)

// Facts is the host summary sent with heartbeats.
type Facts struct {
	Hostname      string `json:"hostname"`
	Kernel        string `json:"kernel"`
	CPUs          int    `json:"cpus"`
	MemoryMiB     int64  `json:"memory_mib"`
	KVM           bool   `json:"kvm"`
	VFIO          bool   `json:"vfio"`
	IOMMUGroups   int    `json:"iommu_groups"`
	HostRoot      string `json:"host_root"`
	SpooledResult int    `json:"spooled_results"`
	// ImageCache is what the slice image cache holds (VM runtimes only).
	ImageCache *ImageCacheFacts `json:"image_cache,omitempty"`
	// Version and TaskSchemas say what this hostd is and which task schema versions it
	// decodes: the controller sends it nothing else (internal/task/schema.go). In the facts
	// object, which every controller stores as it is, so an older controller is not upset
	// by them.
	Version     string              `json:"version"`
	TaskSchemas map[task.Type][]int `json:"task_schemas"`
}

// ImageCacheFacts is the slice image cache as a heartbeat reports it: every image held
// (least recently used first, pinned when a slice here uses it), the budget and the
// running totals.
type ImageCacheFacts struct {
	BudgetBytes int64              `json:"budget_bytes"`
	UsedBytes   int64              `json:"used_bytes"`
	Images      []imagecache.Entry `json:"images"`
	imagecache.Stats
}

func imageCacheFacts(c *imagecache.Cache) *ImageCacheFacts {
	f := &ImageCacheFacts{BudgetBytes: c.BudgetBytes, Stats: c.Stats(), Images: []imagecache.Entry{}}
	if ents, err := c.Entries(); err == nil {
		f.Images = ents
	}
	for _, e := range f.Images {
		f.UsedBytes += e.SizeBytes
	}
	return f
}

func (a *Agent) facts() Facts {
	f := Facts{CPUs: runtime.NumCPU(), HostRoot: a.cfg.HostRoot, Version: a.version, TaskSchemas: task.Schemas()}
	if b, err := a.host.ReadFile("/proc/sys/kernel/hostname"); err == nil {
		f.Hostname = strings.TrimSpace(string(b))
	}
	if b, err := a.host.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		f.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := a.host.ReadFile("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if fields := strings.Fields(sc.Text()); len(fields) >= 2 && fields[0] == "MemTotal:" {
				kb, _ := strconv.ParseInt(fields[1], 10, 64)
				f.MemoryMiB = kb / 1024
			}
		}
	}
	f.KVM = a.host.Exists("/dev/kvm")
	f.VFIO = a.host.Exists("/dev/vfio")
	if groups, err := a.host.ReadDir("/sys/kernel/iommu_groups"); err == nil {
		f.IOMMUGroups = len(groups)
	}
	if p, err := a.spool.Pending(); err == nil {
		f.SpooledResult = len(p)
	}
	if a.vm != nil {
		f.ImageCache = imageCacheFacts(a.vm.images)
	}
	return f
}

// firmwareEvidence collects the firmware-profile helper's evidence files
// (/var/lib/gpuaas/firmware-profile/*.json) as {file name: content}; invalid JSON is
// reported as such rather than dropped.
func (a *Agent) firmwareEvidence() json.RawMessage {
	const dir = "/var/lib/gpuaas/firmware-profile"
	entries, err := a.host.ReadDir(dir)
	if err != nil {
		return nil
	}
	out := map[string]any{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := a.host.ReadFile(dir + "/" + e.Name())
		if err != nil || len(b) > 64<<10 {
			continue
		}
		var v any
		if json.Unmarshal(b, &v) != nil {
			out[e.Name()] = map[string]string{"error": "not valid JSON"}
			continue
		}
		out[e.Name()] = v
	}
	if len(out) == 0 {
		return nil
	}
	b, _ := json.Marshal(out)
	return b
}

// prereqSummary is the heartbeat's prerequisite summary. The sim runtime needs none of the
// host prerequisites, so they are reported but not required there.
func (a *Agent) prereqSummary() json.RawMessage {
	r := prereq.Run(a.host, prereq.Options{Bridge: a.cfg.Bridge, Lab: a.cfg.Runtime == "lab", LabHost: a.cfg.LabHost})
	sum := map[string]any{"ready": r.Ready || a.runtime.Name() == "sim", "required": a.runtime.Name() != "sim", "failed": r.Failed}
	b, _ := json.Marshal(sum)
	return b
}
