package task

import "encoding/json"

// WipeProof is a host's evidence that one slot's disk was erased and read back clean.
// Details is the runtime's structured evidence (internal/disk Evidence); hostd then signs
// the proof with its node key (internal/wipeproof): Document is the signed document,
// Signature its signature, SignerCert the node certificate whose key signed it.
type WipeProof struct {
	Verified bool            `json:"verified"`
	Method   string          `json:"method"`
	Evidence string          `json:"evidence"`
	Error    string          `json:"error,omitempty"`
	Details  json.RawMessage `json:"details,omitempty"`

	Document   string `json:"document,omitempty"` // JSON text, kept as a string so its bytes survive storage
	Signature  string `json:"signature,omitempty"`
	SignerCert string `json:"signer_cert,omitempty"`
}

// ProvisionOutput is the output of slice.vm_provision.
type ProvisionOutput struct {
	Runtime   string `json:"runtime"`   // libvirt | lab | sim
	Simulated bool   `json:"simulated"` // true for the sim runtime: no VM exists
	VMName    string `json:"vm_name"`
	PrivateIP string `json:"private_ip,omitempty"`
}

// ReleaseOutput is the output of slice.vm_release (seed 000 "Release" output keys).
type ReleaseOutput struct {
	Runtime        string               `json:"runtime"`
	Simulated      bool                 `json:"simulated"`
	VMName         string               `json:"vm_name"`
	Released       bool                 `json:"released"`
	HardStopped    bool                 `json:"hard_stopped"`
	Wiped          map[string]WipeProof `json:"wiped"` // slot id -> proof
	SlotCount      int                  `json:"slot_count"`
	LeasesReleased int                  `json:"leases_released"`
}

// Progress is a live update while a task runs.
type Progress struct {
	Phases []Phase `json:"phases"`
}

// StageOutput is slot.image_stage's report: what was written onto which slot's disk.
type StageOutput struct {
	SlotID       string `json:"slot_id"`
	DigestSHA256 string `json:"digest_sha256"`
	Disk         string `json:"disk,omitempty"`
	Simulated    bool   `json:"simulated,omitempty"`
}
