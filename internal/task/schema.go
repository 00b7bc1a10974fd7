package task

import (
	"encoding/json"
	"fmt"
	"sort"
)

// Task payloads are versioned per type. A release that changes what a payload carries (a new
// field hostd must act on) adds a schema version for that type instead of changing the old
// one, so a host that has not been upgraded yet keeps decoding, strictly, exactly what it
// was built for. Hosts report the versions they decode (Schemas, in their heartbeat facts);
// the controller leases a task only to a host that decodes its type and version and
// otherwise leaves it queued with the reason MinHostd gives. An envelope carries its
// payload's version (schema_version, omitted for version 1, so version 1 tasks are signed
// exactly as releases before versioning signed them).

// TypeVersion names one schema version of one task type.
type TypeVersion struct {
	Type    Type
	Version int
}

func (tv TypeVersion) String() string { return fmt.Sprintf("%s schema %d", tv.Type, tv.Version) }

// schemas are the payload structs this build decodes, by type and version.
var schemas = map[TypeVersion]func() any{}

func init() {
	for t, mk := range payloadTypes {
		schemas[TypeVersion{t, 1}] = mk
	}
}

// introduced is the first gpuaas-hostd release that decodes each schema version; versions
// not listed are as old as versioning itself (v0.1.0, the first release).
var introduced = map[TypeVersion]string{
	{TypeSlotValidate, 1}: NextRelease, // slot validation between tenants (docs/health.md)
	{TypeImageStage, 1}:   NextRelease, // warm slots: an image staged on an idle, wiped disk (docs/images.md)
}

// NextRelease is the release this tree becomes: what a host needs for a schema added since
// FirstRelease.
const NextRelease = "0.2.0"

// FirstRelease is the first tagged release; every schema version 1 dates from it.
const FirstRelease = "0.1.0"

// MinHostd is the oldest gpuaas-hostd release that decodes tv ("" when no release this
// build knows of does).
func MinHostd(tv TypeVersion) string {
	if v, ok := introduced[tv]; ok {
		return v
	}
	if Supports(nil, tv) {
		return FirstRelease
	}
	return ""
}

// LegacySchemas is what a host that reports no schemas decodes: gpuaas-hostd 0.1.0, which
// predates the report, knew version 1 of these types and nothing else.
var LegacySchemas = map[Type][]int{
	TypeTopologyDiscover: {1}, TypeStorageTransit: {1}, TypeVMProvision: {1}, TypeVMRelease: {1},
	TypeReconcile: {1}, TypeTerminalOpen: {1}, TypePrereqCheck: {1}, TypeWipeVerify: {1},
}

// Schemas is every type and schema version this build decodes (reported by hostd).
func Schemas() map[Type][]int {
	out := map[Type][]int{}
	for tv := range schemas {
		out[tv.Type] = append(out[tv.Type], tv.Version)
	}
	for _, vs := range out {
		sort.Ints(vs)
	}
	return out
}

// CurrentSchema is the schema version of t this build's controller writes.
func CurrentSchema(t Type) int {
	v := 0
	for tv := range schemas {
		if tv.Type == t && tv.Version > v {
			v = tv.Version
		}
	}
	return max(v, 1)
}

// DecodePayloadVersion decodes a payload of type t at schema version v (0 means 1) into that
// version's struct, rejecting unknown fields: strict per version.
func DecodePayloadVersion(t Type, v int, raw json.RawMessage) (any, error) {
	if v == 0 {
		v = 1
	}
	mk, ok := schemas[TypeVersion{t, v}]
	if !ok {
		if !Known(t) {
			return nil, fmt.Errorf("unknown task type %q", t)
		}
		return nil, fmt.Errorf("%s: schema version %d is not supported by this build", t, v)
	}
	val := mk()
	if err := strictUnmarshal(raw, val); err != nil {
		return nil, fmt.Errorf("%s payload (schema %d): %w", t, v, err)
	}
	return val, nil
}

// Supports reports whether a host that reports schemas (nil: a host that reports none, see
// LegacySchemas) decodes tv.
func Supports(reported map[Type][]int, tv TypeVersion) bool {
	if reported == nil {
		reported = LegacySchemas
	}
	for _, v := range reported[tv.Type] {
		if v == tv.Version {
			return true
		}
	}
	return false
}

// WaitReason says why a queued task of type t at schema version v is not handed to a host
// whose recorded heartbeat is agentFacts (nodes.agent_facts: the heartbeat, its facts
// object inside), or "" when the host decodes it. The database leases by the same rule
// (gpuaas_host_decodes, migration 025).
func WaitReason(agentFacts json.RawMessage, t string, v int) string {
	var hb struct {
		AgentVersion string `json:"agent_version"`
		Facts        struct {
			TaskSchemas map[Type][]int `json:"task_schemas"`
		} `json:"facts"`
	}
	_ = json.Unmarshal(agentFacts, &hb) // no facts yet: a host that reports nothing
	tv := TypeVersion{Type(t), max(v, 1)}
	if Supports(hb.Facts.TaskSchemas, tv) {
		return ""
	}
	runs := hb.AgentVersion
	if runs == "" {
		runs = "an unknown version"
	}
	if min := MinHostd(tv); min != "" {
		return fmt.Sprintf("host needs gpuaas-hostd >= %s for %s (it runs %s)", min, tv, runs)
	}
	return fmt.Sprintf("host needs a gpuaas-hostd that decodes %s (it runs %s)", tv, runs)
}
