// Package topology discovers a GPU host's slice-relevant hardware from sysfs, /proc and
// /dev through the host seam, and proposes candidate slot bundles (1 GPU + NUMA-local NVMe +
// its own fabric VF) with the reasons any candidate is blocked. Candidates always require
// operator approval; discovery never "fixes" what it finds (seed 001).
package topology

// Report is the discovery output (stable JSON: `gpuaas-hostd discover -o json`).
type Report struct {
	GPUs       []GPU       `json:"gpus"`
	NVMe       []NVMe      `json:"nvme"`
	Fabric     []Fabric    `json:"fabric"`
	NUMA       []NUMANode  `json:"numa"`
	Net        []NetDev    `json:"net"`
	Candidates []Candidate `json:"candidates"`
	Warnings   []string    `json:"warnings,omitempty"`
	// LabStandIns: the report counts the lab host's emulated stand-ins as GPUs and fabric
	// (Options.LabStandIns); the host is simulated.
	LabStandIns bool `json:"lab_standins,omitempty"`
}

// GPU is an NVIDIA or AMD display/3D controller.
type GPU struct {
	PCIAddress string   `json:"pci_address"`
	VendorID   string   `json:"vendor_id"`
	DeviceID   string   `json:"device_id"`
	Model      string   `json:"model"`
	NUMANode   *int     `json:"numa_node"`
	LocalCPUs  string   `json:"local_cpus,omitempty"`
	Driver     string   `json:"driver"`
	IOMMUGroup *int     `json:"iommu_group"`
	IOMMUPeers []string `json:"iommu_peers,omitempty"`
}

// NVMe is one NVMe namespace with its controller.
type NVMe struct {
	Controller string   `json:"controller"`
	Namespace  string   `json:"namespace"`
	PCIAddress string   `json:"pci_address"`
	NUMANode   *int     `json:"numa_node"`
	ByID       string   `json:"by_id"` // stable identity; "" when none exists (then it is never offered)
	SizeBytes  int64    `json:"size_bytes"`
	Partitions []string `json:"partitions,omitempty"`
	Mounts     []string `json:"mounts,omitempty"`
	Signature  string   `json:"signature,omitempty"` // libblkid's names: ext4, gpt, PMBR, LVM2_member, crypto_LUKS, ... ("" none found)
	// SignatureError is why the device could not be probed: what it holds is unknown.
	SignatureError string `json:"signature_error,omitempty"`
	OSDisk         bool   `json:"os_disk"`
}

// Port is one InfiniBand/RDMA port.
type Port struct {
	Port      int    `json:"port"`
	State     string `json:"state"`
	PhysState string `json:"phys_state"`
	LinkLayer string `json:"link_layer"` // InfiniBand | Ethernet (RoCE)
	Rate      string `json:"rate"`
}

// Fabric is an RDMA-capable PCI function: a parent (PF) with its SR-IOV VFs.
type Fabric struct {
	PCIAddress string   `json:"pci_address"`
	VendorID   string   `json:"vendor_id"`
	DeviceID   string   `json:"device_id"`
	RDMADevice string   `json:"rdma_device,omitempty"` // mlx5_0
	NUMANode   *int     `json:"numa_node"`
	Driver     string   `json:"driver"`
	Fabric     string   `json:"fabric"` // infiniband | roce | unknown
	NodeGUID   string   `json:"node_guid,omitempty"`
	Ports      []Port   `json:"ports,omitempty"`
	SRIOVTotal int      `json:"sriov_totalvfs"`
	SRIOVNum   int      `json:"sriov_numvfs"`
	VFs        []string `json:"vfs,omitempty"`
	VFDrivers  []string `json:"vf_drivers,omitempty"`
}

// NUMANode is a NUMA node's CPUs, its cores (SMT sibling groups) and 1 GiB hugepages.
type NUMANode struct {
	Node int    `json:"node"`
	CPUs string `json:"cpus"`
	// Cores are the node's physical cores, each the cpulist of its SMT siblings (sysfs
	// core_cpus_list, or thread_siblings_list on older kernels), ordered by first CPU. Every
	// CPU of the node is in exactly one; a CPU whose siblings cannot be read is a core alone.
	Cores            []string `json:"cores,omitempty"`
	Hugepages1GTotal int      `json:"hugepages_1g_total"`
	Hugepages1GFree  int      `json:"hugepages_1g_free"`
}

// NetDev is a network interface.
type NetDev struct {
	Name       string `json:"name"`
	MAC        string `json:"mac"`
	PCIAddress string `json:"pci_address,omitempty"`
}

// Candidate is a proposed slot bundle. Ready candidates may be approved; blocked ones list why.
type Candidate struct {
	SlotIndex        int      `json:"slot_index"`
	Ready            bool     `json:"ready"`
	ApprovalRequired bool     `json:"approval_required"`
	GPUPCI           string   `json:"gpu_pci"`
	GPUModel         string   `json:"gpu_model"`
	NUMANode         *int     `json:"numa_node"`
	NVMeDevice       string   `json:"nvme_device,omitempty"`
	NVMeNamespace    string   `json:"nvme_namespace,omitempty"`
	FabricParentPCI  string   `json:"fabric_parent_pci,omitempty"`
	FabricVFPCI      string   `json:"fabric_vf_pci,omitempty"`
	Fabric           string   `json:"fabric,omitempty"`
	BlockingReasons  []string `json:"blocking_reasons"`
}
