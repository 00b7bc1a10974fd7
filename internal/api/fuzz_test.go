package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/fixtures"
	"github.com/gpuaas/gpuaas/internal/task"
)

// bodyTypes are the request bodies the handlers decode, by route.
var bodyTypes = []func() any{
	func() any { return &apiv1.AllocationCreate{} }, func() any { return &apiv1.PlacementRequest{} },
	func() any { return &apiv1.NodeCreate{} }, func() any { return &apiv1.SlotApply{} }, func() any { return &apiv1.SKU{} },
	func() any { return &apiv1.SKUPatch{} }, func() any { return &apiv1.OSImage{} }, func() any { return &apiv1.OSImagePatch{} },
	func() any { return &apiv1.TokenCreate{} }, func() any { return &apiv1.EnrollRequest{} }, func() any { return &apiv1.TerminalRequest{} },
	func() any { return &apiv1.StorageTransitionRequest{} }, func() any { return &apiv1.SlotApprove{} }, func() any { return &task.Result{} },
	func() any { return &task.Progress{} }, func() any { return &apiv1.Heartbeat{} },
	func() any { return &apiv1.ImageSmokeTestCreate{} }, func() any { return &apiv1.ImageRolloutCreate{} },
	func() any { return &apiv1.DefaultImageSet{} },
}

func isBadRequest(err error) bool {
	var ae *apiv1.Error
	return errors.As(err, &ae) && statusFor(ae.Code) == http.StatusBadRequest && ae.Message != ""
}

// FuzzDecodeBody drives the JSON body decoder and the validation behind it with arbitrary
// bodies for every request type. It never panics; a refusal is a 400 with a message; an
// accepted body has a stable canonical form the server can read back; and whatever
// ValidateSlotMap / validateImage accept holds only well-formed identities.
func FuzzDecodeBody(f *testing.F) {
	slots, _ := json.Marshal(apiv1.SlotApply{Slots: fixtures.H200SlotMap(1)})
	for i, b := range [][]byte{
		[]byte(`{"sku":"h200-sxm-slice","gpus":1,"ssh_public_keys":["ssh-ed25519 AAAA x"]}`), []byte(`{"sku":"x","gpus":-1}`),
		[]byte(`{"name":"n1","region":"lab"}`), slots, []byte(`{"sku":"a","gpus_total":8}`), []byte(`{"allowed_gpu_counts":[1,2]}`),
		[]byte(`{"slug":"img","source_ref":"https://h/../../etc/shadow","digest_sha256":"` + string(bytes.Repeat([]byte("0f"), 32)) + `"}`),
		[]byte(`{"source_ref":"file:///srv/img.qcow2"}`), []byte(`{"name":"t","role":"tenant","bogus":1}`), []byte(`{"token":"gpb_x"}`),
		[]byte(`{"mode":"terminal","cols":99999999999}`), []byte(`{"devices":["/dev/disk/by-id/../../sda"]}`), []byte(`{"slot_indexes":[1]}`),
		[]byte(`{"task_id":"t","status":"succeeded","phases":[]}`), []byte(`{"phases":null}`), []byte("{\"facts\":{\"x\":\"\xff\"}}"),
	} {
		f.Add(uint8(i), b)
	}
	f.Add(uint8(3), []byte(`{"slots":[{"slot_index":0,"pci_address":"0000:1b:00.0","nvme_device":"/dev/disk/by-id/a/../../../sda","mac_address":"52:54:00:00:00:01","private_ip":"10.0.0.1"}]}`))
	f.Add(uint8(0), []byte(`{"sku":"h200\u0000","gpus":1}`))
	f.Add(uint8(3), []byte(`{"slots":[{"slot_index":0,"capacity_metadata":{"a":[[[[{"b":"\\u0000"}]]]]}}]}`))
	f.Add(uint8(0), []byte(`{} {}`))
	f.Add(uint8(0), []byte(`[]`))
	f.Fuzz(func(t *testing.T, kind uint8, body []byte) {
		mk := bodyTypes[int(kind)%len(bodyTypes)]
		v := mk()
		if err := decodeBody(body, v); err != nil {
			if !isBadRequest(err) {
				t.Fatalf("refusal is not a 400: %v", err)
			}
			return
		}
		first, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("an accepted body cannot be encoded: %v", err)
		}
		// Nothing accepted carries a NUL (PostgreSQL text refuses it: a 500 later).
		if checkJSONText(first) != nil {
			t.Fatalf("accepted a body the text check refuses: %s", first)
		}
		again := mk()
		if err := decodeBody(first, again); err != nil {
			t.Fatalf("the server cannot read back what it accepted: %v\n%s", err, first)
		}
		second, _ := json.Marshal(again)
		if !bytes.Equal(first, second) {
			t.Fatalf("unstable canonical form:\n%s\n%s", first, second)
		}
		switch req := v.(type) {
		case *apiv1.SlotApply:
			checkSlotMap(t, req.Slots)
		case *apiv1.OSImage:
			if validateImage(*req) == nil && validateSourceRef(req.SourceRef) != nil {
				t.Fatalf("image accepted with source_ref %q", req.SourceRef)
			}
		case *apiv1.OSImagePatch:
			if validateImagePatch(*req) == nil && req.SourceRef != nil && (!plainText(*req.SourceRef) || bytes.Contains([]byte(*req.SourceRef), []byte("/../"))) {
				t.Fatalf("patch accepted with source_ref %q", *req.SourceRef)
			}
		}
	})
}

// checkSlotMap: a slot map ValidateSlotMap accepts names each GPU, disk, MAC, IP and slot
// index once, with well-formed identities only.
func checkSlotMap(t *testing.T, specs []apiv1.SlotSpec) {
	t.Helper()
	if ValidateSlotMap(specs) != nil {
		return
	}
	seen := map[string]bool{}
	for _, s := range specs {
		if task.CheckPCIAddress(s.PCIAddress) != nil || task.CheckByIDPath(s.NVMeDevice) != nil || s.SlotIndex < 0 || s.SlotIndex > maxSlotIndex {
			t.Fatalf("accepted slot %+v", s)
		}
		for _, k := range []string{"i" + string(rune(s.SlotIndex)), "p" + s.PCIAddress, "n" + s.NVMeDevice, "m" + s.MACAddress, "a" + s.PrivateIP} {
			if seen[k] {
				t.Fatalf("accepted a map sharing %s", k[1:])
			}
			seen[k] = true
		}
	}
}

// FuzzQueryParams drives the path and query parameter checks with arbitrary raw queries and
// slot indexes: never a panic; a refusal is a 400; an accepted value is within its range.
func FuzzQueryParams(f *testing.F) {
	f.Add("wait=30s&max=4&hard=true&limit=10", "3")
	f.Add("wait=-1s&max=0", "-1")
	f.Add("wait=9999999999h&max=99999999999999999999&limit=1e3", "01")
	f.Add("max=%00&status=%ff%fe", "+3")
	f.Add("hard=TRUE&limit=1000&wait=1m0.000000001s", "1024")
	f.Add("a=%0d%0aX-Injected:%20yes", "0")
	f.Fuzz(func(t *testing.T, rawQuery, index string) {
		r := &http.Request{URL: &url.URL{Path: "/api/v1/admin/nodes/n1/slots/" + index + "/enable", RawQuery: rawQuery}}
		r.SetPathValue("index", index)
		if err := checkRequestText(r); err != nil {
			if !isBadRequest(err) {
				t.Fatalf("refusal is not a 400: %v", err)
			}
		} else {
			for k, vs := range r.URL.Query() {
				for _, v := range append(vs, k, r.URL.Path) {
					if !plainText(v) {
						t.Fatalf("accepted %q", v)
					}
				}
			}
		}
		if n, ok, err := queryInt(r, "max", 1, maxPollTasks); err != nil && !isBadRequest(err) || err == nil && ok && (n < 1 || n > maxPollTasks) {
			t.Fatalf("max: %d %v", n, err)
		}
		if n, _, err := queryInt(r, "limit", 1, 1000); err != nil && !isBadRequest(err) || err == nil && (n < 0 || n > 1000) {
			t.Fatalf("limit: %d %v", n, err)
		}
		if d, err := queryDuration(r, "wait", 30*time.Second, maxPollWait); err != nil && !isBadRequest(err) || err == nil && (d < 0 || d > maxPollWait) {
			t.Fatalf("wait: %s %v", d, err)
		}
		if _, _, err := queryBool(r, "hard"); err != nil && !isBadRequest(err) {
			t.Fatalf("hard: %v", err)
		}
		if i, err := pathSlotIndex(r); err != nil && !isBadRequest(err) || err == nil && (i < 0 || i > maxSlotIndex) {
			t.Fatalf("index: %d %v", i, err)
		}
	})
}

// TestDecodeBodyNamesUnknownFields: the 400 for an unknown field names it, in the message
// and in details.field.
func TestDecodeBodyNamesUnknownFields(t *testing.T) {
	var req apiv1.AllocationCreate
	err := decodeBody([]byte(`{"sku":"x","gpus":1,"gpu_count":8}`), &req)
	var ae *apiv1.Error
	if !errors.As(err, &ae) || ae.Details["field"] != "gpu_count" || !bytes.Contains([]byte(ae.Message), []byte(`"gpu_count"`)) {
		t.Fatalf("unknown field refusal = %#v", err)
	}
}
