package task

import (
	"fmt"
	"sort"
	"strings"
)

// Wipe policies (a slot's capacity_metadata.destructive_wipe_policy): how its disk is erased
// on every release. Every policy ends with the same read-back verification (no signature
// left, sampled regions all zero); the controller refuses a slot map naming any other
// policy and hostd refuses one before touching a disk.
const (
	// WipeBlkdiscardZero: wipefs -a, then blkdiscard -z (write zeroes; a zero fill where
	// the device cannot), then verify.
	WipeBlkdiscardZero = "blkdiscard_zero_verify"
	// WipeNVMeSanitize: on an NVMe controller whose only namespace is the slot's, NVMe
	// sanitize (crypto erase, else block erase) where Identify Controller SANICAP offers it;
	// else NVMe format with secure erase (crypto erase where FNA offers it, else user data
	// erase) where the format touches only this namespace; else blkdiscard -z. Then verify.
	WipeNVMeSanitize = "nvme_sanitize_verify"
	// WipeSecureErase: NVMe format with secure erase (as above), else blkdiscard -z; never
	// sanitize (for sites that keep sanitize for decommissioning). Then verify.
	WipeSecureErase = "secure_erase_verify"
)

// WipePolicies names every policy hostd implements.
var WipePolicies = map[string]bool{WipeBlkdiscardZero: true, WipeNVMeSanitize: true, WipeSecureErase: true}

// CheckWipePolicy refuses an unknown wipe policy (an empty one means the default,
// blkdiscard_zero_verify, only where the caller allows it).
func CheckWipePolicy(p string) error {
	if WipePolicies[p] {
		return nil
	}
	names := make([]string, 0, len(WipePolicies))
	for n := range WipePolicies {
		names = append(names, n)
	}
	sort.Strings(names)
	return fmt.Errorf("unknown destructive_wipe_policy %q (known: %s)", p, strings.Join(names, ", "))
}
