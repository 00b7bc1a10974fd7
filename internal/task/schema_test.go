package task

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// A version 1 envelope signs exactly the bytes releases before schema versioning signed (no
// schema_version anywhere), so hosts that predate it verify it; a later version is signed,
// so it cannot be changed in transit.
func TestSchemaVersionOneSignsAsBeforeAndLaterVersionsAreSigned(t *testing.T) {
	_, priv := keys(t)
	e, err := New(priv, "t1", "n1", TypeVMProvision, provision(), t0, time.Hour, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := e.CanonicalBytes()
	wire, _ := json.Marshal(e)
	if bytes.Contains(b, []byte("schema_version")) || bytes.Contains(wire, []byte("schema_version")) {
		t.Fatalf("a version 1 task names its schema version:\n%s\n%s", b, wire)
	}
	e1 := *e
	e1.SchemaVersion = 1
	if b1, _ := e1.CanonicalBytes(); !bytes.Equal(b, b1) {
		t.Fatal("schema_version 1 and 0 sign different bytes")
	}
	e2 := *e
	e2.SchemaVersion = 2
	if b2, _ := e2.CanonicalBytes(); !bytes.Contains(b2, []byte(`"schema_version":2`)) {
		t.Fatalf("schema version 2 is not signed: %s", b2)
	}
}

// A host refuses a schema version it does not decode, saying which, and
// checks the signature over the version first (a version changed in transit is a bad
// signature, not a decoding question).
func TestVerifyRefusesUnsupportedSchemaVersion(t *testing.T) {
	pub, priv := keys(t)
	v := &Verifier{Key: pub, NodeID: "n1", Now: func() time.Time { return t0 }, Skew: time.Minute}
	e, _ := New(priv, "t1", "n1", TypeVMProvision, provision(), t0, time.Hour, 1)
	e.SchemaVersion = 7
	if err := e.Sign(priv); err != nil {
		t.Fatal(err)
	}
	_, err := v.Verify(e)
	if r := reason(t, err); r != RefuseUnsupportedSchema || !strings.Contains(err.Error(), "slice.vm_provision schema 7 is not supported") {
		t.Fatalf("schema 7: %v", err)
	}
	e.SchemaVersion = 1 // changed after signing
	if _, err := v.Verify(e); reason(t, err) != RefuseBadSignature {
		t.Fatalf("a schema version changed after signing: %v", err)
	}
	e.SchemaVersion = -1
	if err := e.Sign(priv); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(e); reason(t, err) != RefuseMalformed {
		t.Fatalf("negative schema version: %v", err)
	}
}

// Decoding stays strict per version: an unknown field in a version 1 payload is refused.
func TestDecodeIsStrictPerVersion(t *testing.T) {
	raw, _ := json.Marshal(provision())
	if _, err := DecodePayloadVersion(TypeVMProvision, 1, raw); err != nil {
		t.Fatal(err)
	}
	withNew := append(bytes.TrimSuffix(raw, []byte("}")), []byte(`,"added_later":true}`)...)
	if _, err := DecodePayloadVersion(TypeVMProvision, 1, withNew); err == nil || !strings.Contains(err.Error(), "added_later") {
		t.Fatalf("unknown field in schema 1: %v", err)
	}
	if _, err := DecodePayloadVersion(TypeVMProvision, 9, raw); err == nil || !strings.Contains(err.Error(), "schema version 9") {
		t.Fatalf("unknown version: %v", err)
	}
}

// What a host reports decides what it is sent; a host that reports nothing is a 0.1.0 host.
func TestSupports(t *testing.T) {
	if !Supports(nil, TypeVersion{TypeVMProvision, 1}) || Supports(nil, TypeVersion{TypeVMProvision, 2}) ||
		Supports(nil, TypeVersion{"slot.future_task", 1}) {
		t.Fatal("legacy hosts: version 1 of the 0.1.0 types only")
	}
	rep := map[Type][]int{TypeVMProvision: {1, 2}}
	if !Supports(rep, TypeVersion{TypeVMProvision, 2}) || Supports(rep, TypeVersion{TypeVMRelease, 1}) {
		t.Fatal("a reporting host: exactly what it reports")
	}
	for tv := range schemas {
		if !Supports(Schemas(), tv) {
			t.Fatalf("this build does not report %s", tv)
		}
	}
}

// Every schema this build decodes that a 0.1.0 host did not has the release that introduced
// it recorded, so a waiting task names the right gpuaas-hostd.
func TestEveryNewSchemaNamesItsRelease(t *testing.T) {
	for tv := range schemas {
		if Supports(nil, tv) {
			continue
		}
		if _, ok := introduced[tv]; !ok {
			t.Errorf("%s is new since %s: add the release that introduces it to introduced", tv, FirstRelease)
		}
	}
}
