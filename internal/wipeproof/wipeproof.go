// Package wipeproof signs and checks hosts' wipe proofs. hostd signs each slot's proof
// document (what was wiped, how, the device identity read from the device, what was read
// back, tool versions, times) with its node key, the private key of its enrolled node
// certificate; the controller checks the signature against that certificate, the
// certificate against the CA and the node's enrolled credentials, and the document against
// the task it answers, before a proof may reopen a slot for sale.
package wipeproof

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/task"
)

// Document is what a host signs for one slot's wipe.
type Document struct {
	SlotID       string `json:"slot_id"`
	NodeID       string `json:"node_id"`
	TaskID       string `json:"task_id"`
	AllocationID string `json:"allocation_id,omitempty"`
	Verified     bool   `json:"verified"`
	Method       string `json:"method"`
	// Details is the host's evidence (internal/disk Evidence: policy, device identity, bytes
	// and regions read back, tool versions, start and end times); absent for a proof that
	// wrote nothing (a simulated runtime, a refusal).
	Details  json.RawMessage `json:"details,omitempty"`
	Error    string          `json:"error,omitempty"`
	SignedAt time.Time       `json:"signed_at"`
}

// Signer is a node's enrolled identity: its certificate and the matching private key (ECDSA
// P-256, as enrolment makes it).
type Signer struct {
	Key     crypto.Signer
	CertDER []byte
}

// Sign fills p's Document, Signature and SignerCert: a document naming slot, node and task
// (and p's own verdict and evidence), signed with the node key (ECDSA over the
// SHA-256 of the document's bytes, ASN.1).
func Sign(s Signer, p *task.WipeProof, slotID, nodeID, taskID, allocationID string, now time.Time) error {
	if s.Key == nil || len(s.CertDER) == 0 {
		return errors.New("wipe proof: no node key to sign with")
	}
	doc := Document{SlotID: slotID, NodeID: nodeID, TaskID: taskID, AllocationID: allocationID, Verified: p.Verified,
		Method: p.Method, Details: p.Details, Error: p.Error, SignedAt: now.UTC()}
	raw, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	sig, err := sign(s.Key, raw)
	if err != nil {
		return fmt.Errorf("wipe proof: sign: %w", err)
	}
	p.Document, p.Signature = string(raw), base64.StdEncoding.EncodeToString(sig)
	p.SignerCert = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.CertDER}))
	return nil
}

func sign(k crypto.Signer, msg []byte) ([]byte, error) {
	if _, ok := k.Public().(*ecdsa.PublicKey); !ok {
		return nil, errors.New("the node key is not an ECDSA key")
	}
	h := sha256.Sum256(msg)
	return k.Sign(rand.Reader, h[:], crypto.SHA256)
}

// Expect is what a proof must answer: the node that reported it, the task it came in and
// the slot it is for.
type Expect struct {
	NodeID string
	TaskID string
	SlotID string
	// Roots are the CA certificates that issue node certificates.
	Roots *x509.CertPool
	// Enrolled returns the node of a currently valid enrolled certificate serial (hex).
	Enrolled func(serial string) (string, error)
	Now      time.Time
}

// Checked is a proof whose signature, signer and document were checked.
type Checked struct {
	Document     Document
	SignerSerial string
}

// Verify checks p: its certificate chains to Roots, is a client certificate named
// "node:<NodeID>" and is enrolled for that node; the signature over the document verifies
// with the certificate's key; the document names the expected slot, node and task and
// agrees with p's verdict. Any failure is an error in our words: the proof does not count.
func Verify(p task.WipeProof, e Expect) (Checked, error) {
	if p.Signature == "" || len(p.Document) == 0 || p.SignerCert == "" {
		return Checked{}, errors.New("wipe proof is not signed by the node's key")
	}
	blk, _ := pem.Decode([]byte(p.SignerCert))
	if blk == nil || blk.Type != "CERTIFICATE" {
		return Checked{}, errors.New("wipe proof's signer certificate is not a PEM certificate")
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return Checked{}, errors.New("wipe proof's signer certificate cannot be parsed")
	}
	if e.Roots == nil {
		return Checked{}, errors.New("wipe proof cannot be checked: the controller has no node CA")
	}
	now := e.Now
	if now.IsZero() {
		now = time.Now()
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: e.Roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return Checked{}, errors.New("wipe proof's signer certificate is not a node certificate of this controller's CA")
	}
	if cert.Subject.CommonName != "node:"+e.NodeID {
		return Checked{}, fmt.Errorf("wipe proof is signed by %s, not by the reporting node", strings.TrimPrefix(cert.Subject.CommonName, "node:"))
	}
	serial := hex.EncodeToString(cert.SerialNumber.Bytes())
	if e.Enrolled == nil {
		return Checked{}, errors.New("wipe proof cannot be checked: no enrolment lookup")
	}
	if node, err := e.Enrolled(serial); err != nil || node != e.NodeID {
		return Checked{}, errors.New("wipe proof's signer certificate is not a valid enrolled credential of the reporting node")
	}
	sig, err := base64.StdEncoding.DecodeString(p.Signature)
	if err != nil {
		return Checked{}, errors.New("wipe proof's signature is not base64")
	}
	if !verifySig(cert.PublicKey, []byte(p.Document), sig) {
		return Checked{}, errors.New("wipe proof's signature does not verify with the node's certificate (altered, or signed with another key)")
	}
	var doc Document
	if err := json.Unmarshal([]byte(p.Document), &doc); err != nil {
		return Checked{}, errors.New("wipe proof's document is not valid JSON")
	}
	switch {
	case doc.NodeID != e.NodeID:
		return Checked{}, errors.New("wipe proof's document names another node")
	case doc.SlotID != e.SlotID:
		return Checked{}, errors.New("wipe proof's document is for another slot")
	case doc.TaskID != e.TaskID:
		return Checked{}, errors.New("wipe proof's document answers another task (replayed)")
	case doc.Verified != p.Verified || doc.Method != p.Method:
		return Checked{}, errors.New("wipe proof's verdict differs from its signed document")
	}
	return Checked{Document: doc, SignerSerial: serial}, nil
}

func verifySig(pub crypto.PublicKey, msg, sig []byte) bool {
	k, ok := pub.(*ecdsa.PublicKey)
	if !ok {
		return false
	}
	h := sha256.Sum256(msg)
	return ecdsa.VerifyASN1(k, h[:], sig)
}
