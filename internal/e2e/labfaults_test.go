package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/gpuaas/gpuaas/internal/agent"
	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/pgserver"
	"github.com/gpuaas/gpuaas/internal/store"
	"github.com/gpuaas/gpuaas/internal/task"
)

// The phase trap: kill -9 of hostd INSIDE a named phase of a slice VM task. hostd (this test
// binary, re-executed) calls agent.Knobs.PhaseDone in every phase after the phase's work and
// before the phase is recorded; when the script armed that (allocation, task type, attempt,
// phase), hostd writes a "parked" file and blocks there until it is killed. Polling the
// controller could not do this: hostd reports progress coalesced every 250 ms, and most lab
// phases take milliseconds, so a kill timed from the controller's view lands phases late.

// phaseTrapEnv names the trap directory (set by the lab fault script; unset elsewhere: no trap).
const phaseTrapEnv = "GPUAAS_E2E_PHASE_TRAP"

// labFaultsReportEnv names the JSON-lines file waitparked and recordoutcome append to.
const labFaultsReportEnv = "LABFAULTS_REPORT"

// phaseTrapKnobs are hostd's knobs in this test binary: the trap when phaseTrapEnv is set.
func phaseTrapKnobs() agent.Knobs {
	dir := os.Getenv(phaseTrapEnv)
	if dir == "" {
		return agent.Knobs{}
	}
	return agent.Knobs{PhaseDone: func(ctx context.Context, p agent.PhasePoint) {
		plan, err := waitPlan(ctx, dir, p.AllocationID)
		if err != nil {
			fmt.Fprintf(os.Stderr, "phase trap: %v (not parking)\n", err)
			return
		}
		if !slices.Contains(plan, trapPoint(p.Type, p.Attempt, p.Phase)) {
			return
		}
		if err := writeAtomic(parkedFile(dir, p.AllocationID, p.Type, p.Attempt), p.Phase+"\n"); err != nil {
			fmt.Fprintf(os.Stderr, "phase trap: %v (not parking)\n", err)
			return
		}
		fmt.Fprintf(os.Stderr, "phase trap: %s %s attempt %d parked in %s until killed\n", p.AllocationID, p.Type, p.Attempt, p.Phase)
		// hostd drains running tasks on SIGINT/SIGTERM, and this one never finishes: a script
		// that fails while hostd is parked (testscript interrupts its background commands)
		// would wait for it until the package's timeout. The trap stands in for a kill, so an
		// interrupt ends the process as one would.
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		defer signal.Stop(sig)
		select {
		case <-ctx.Done():
		case s := <-sig:
			fmt.Fprintf(os.Stderr, "phase trap: %v while parked: exiting as if killed\n", s)
			os.Exit(137)
		}
	}}
}

func trapPoint(typ string, attempt int, phase string) string {
	return fmt.Sprintf("%s:%d:%s", typ, attempt, phase)
}

func planFile(dir, alloc string) string { return filepath.Join(dir, alloc+".plan") }

func parkedFile(dir, alloc, typ string, attempt int) string {
	return filepath.Join(dir, fmt.Sprintf("%s.%s.%d.parked", alloc, typ, attempt))
}

// waitPlan reads an allocation's plan; the script arms it right after creating the
// allocation, so hostd may get there first: it waits for it (bounded).
func waitPlan(ctx context.Context, dir, alloc string) ([]string, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		b, err := os.ReadFile(planFile(dir, alloc))
		if err == nil {
			return strings.Fields(string(b)), nil
		}
		if !errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("no plan for allocation %s: %v", alloc, err)
		}
		time.Sleep(50 * time.Millisecond) // plan poll; the deadline bounds it
	}
}

func writeAtomic(path, content string) error {
	if err := os.WriteFile(path+".tmp", []byte(content), 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// armTrap writes an allocation's kill plan (possibly empty: hostd then never parks it).
// Usage: armtrap ALLOC [TYPE:ATTEMPT:PHASE...]
func armTrap(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 1 {
		ts.Fatalf("usage: armtrap ALLOC [TYPE:ATTEMPT:PHASE...]")
	}
	for _, pt := range args[1:] {
		typ, attempt, phase, err := parsePoint(pt)
		ts.Check(err)
		if attempt < 1 || attempt > 2 || !slices.Contains(task.PhasesOf(typ), phase) {
			ts.Fatalf("armtrap %s: attempt must be 1 or 2 (the third must run) and the phase one of %s's", pt, typ)
		}
	}
	ts.Check(writeAtomic(planFile(ts.Getenv(phaseTrapEnv), args[0]), strings.Join(args[1:], "\n")+"\n"))
}

func parsePoint(s string) (typ string, attempt int, phase string, err error) {
	f := strings.Split(s, ":")
	if len(f) != 3 {
		return "", 0, "", fmt.Errorf("trap point %q is not TYPE:ATTEMPT:PHASE", s)
	}
	attempt, err = strconv.Atoi(f[1])
	return f[0], attempt, f[2], err
}

// labFaultRecord is one line of the report: a kill, or how a task ended.
type labFaultRecord struct {
	Kind    string `json:"kind"` // kill | outcome
	Alloc   string `json:"alloc"`
	Type    string `json:"type"`
	Attempt int    `json:"attempt"`
	// kill: the armed phase, the phase hostd says it was parked in, what the controller had
	// been told by then.
	Phase      string `json:"phase,omitempty"`
	Parked     string `json:"parked,omitempty"`
	Controller string `json:"controller,omitempty"`
	// outcome
	TaskStatus  string    `json:"task_status,omitempty"`
	AllocStatus string    `json:"alloc_status,omitempty"`
	Reason      string    `json:"reason,omitempty"`
	Notes       []string  `json:"notes,omitempty"`
	At          time.Time `json:"at"`
}

func appendRecord(ts *testscript.TestScript, r labFaultRecord) {
	path := ts.Getenv(labFaultsReportEnv)
	if path == "" {
		return
	}
	r.At = time.Now().UTC()
	b, err := json.Marshal(r)
	ts.Check(err)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	ts.Check(err)
	defer f.Close()
	_, err = f.Write(append(b, '\n'))
	ts.Check(err)
}

// allocTask is an allocation's task of a type, in full (nil until queued).
func allocTask(ts *testscript.TestScript, alloc, typ string) *apiv1.Task {
	c := scriptClient(ts)
	list, err := c.ListTasks(context.Background(), "", alloc)
	if err != nil {
		return nil
	}
	for _, t := range list {
		if t.Type == typ {
			full, err := c.GetTask(context.Background(), t.ID)
			if err == nil {
				return full
			}
		}
	}
	return nil
}

// waitParked waits until hostd is parked in the armed phase (see the phase trap) and records
// the kill that follows: the phase hostd was in, and what the controller knew.
// Usage: waitparked ALLOC TYPE:ATTEMPT:PHASE [timeout]
func waitParked(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: waitparked ALLOC TYPE:ATTEMPT:PHASE [timeout]")
	}
	alloc := args[0]
	typ, attempt, phase, err := parsePoint(args[1])
	ts.Check(err)
	timeout := 15 * time.Minute
	if len(args) == 3 {
		timeout, err = time.ParseDuration(args[2])
		ts.Check(err)
	}
	file := parkedFile(ts.Getenv(phaseTrapEnv), alloc, typ, attempt)
	deadline := time.Now().Add(timeout)
	for {
		b, err := os.ReadFile(file)
		if err == nil {
			parked := strings.TrimSpace(string(b))
			if parked != phase {
				ts.Fatalf("%s: hostd parked in %s, armed %s", alloc, parked, phase)
			}
			seen := "no task"
			if t := allocTask(ts, alloc, typ); t != nil {
				last, n := "none", 0
				for _, p := range t.Phases {
					if p.Status != "running" {
						last, n = p.Name, n+1
					}
				}
				seen = fmt.Sprintf("attempt %d %s, %d phases reported, last %s", t.Attempt, t.Status, n, last)
			}
			ts.Logf("kill -9 of hostd: %s %s attempt %d parked in %s (controller: %s)", alloc, typ, attempt, parked, seen)
			appendRecord(ts, labFaultRecord{Kind: "kill", Alloc: alloc, Type: typ, Attempt: attempt, Phase: phase, Parked: parked, Controller: seen})
			return
		}
		if t := allocTask(ts, alloc, typ); t != nil && (t.Attempt > attempt || t.Status != "queued" && t.Status != "leased") {
			ts.Fatalf("%s: %s moved on before parking in %s of attempt %d: attempt %d %s %s", alloc, typ, phase, attempt, t.Attempt, t.Status, t.Error)
		}
		if time.Now().After(deadline) {
			ts.Fatalf("%s: hostd not parked in %s of %s attempt %d after %s", alloc, phase, typ, attempt, timeout)
		}
		time.Sleep(200 * time.Millisecond) // file poll; the deadline bounds it
	}
}

// recordOutcome records how an allocation's task ended and what the last attempt did
// differently (adopted a running domain, skipped, failed). The task must have succeeded, on
// attempt ATTEMPT when given; a release must have proved every wipe.
// Usage: recordoutcome ALLOC TYPE [ATTEMPT]
func recordOutcome(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 || len(args) > 3 {
		ts.Fatalf("usage: recordoutcome ALLOC TYPE [ATTEMPT]")
	}
	t := allocTask(ts, args[0], args[1])
	if t == nil {
		ts.Fatalf("%s: no %s task", args[0], args[1])
	}
	if t.Status != "succeeded" {
		ts.Fatalf("%s: %s %s on attempt %d: %s", args[0], args[1], t.Status, t.Attempt, t.Error)
	}
	if len(args) == 3 && strconv.Itoa(t.Attempt) != args[2] {
		ts.Fatalf("%s: %s succeeded on attempt %d, want %s", args[0], args[1], t.Attempt, args[2])
	}
	a, err := scriptClient(ts).GetAllocation(context.Background(), args[0])
	ts.Check(err)
	r := labFaultRecord{Kind: "outcome", Alloc: args[0], Type: args[1], Attempt: t.Attempt, TaskStatus: t.Status,
		AllocStatus: a.Status, Reason: a.FailureReason}
	for _, p := range t.Phases {
		if p.Status != "ok" && !strings.Contains(p.Detail, "no PCI passthrough") {
			r.Notes = append(r.Notes, p.Name+" "+p.Status+": "+p.Note())
		}
	}
	if args[1] == string(task.TypeVMRelease) {
		var out task.ReleaseOutput
		ts.Check(json.Unmarshal(t.Output, &out))
		if len(out.Wiped) == 0 {
			ts.Fatalf("%s: release without wipe proofs", args[0])
		}
		for slot, w := range out.Wiped {
			if !w.Verified {
				ts.Fatalf("%s: slot %s wipe not verified: %s", args[0], slot, w.Error)
			}
		}
		r.Notes = append(r.Notes, fmt.Sprintf("%d wipe(s) verified", len(out.Wiped)))
	}
	ts.Logf("%s %s: task %s on attempt %d, allocation %s %s %v", args[0], args[1], t.Status, t.Attempt, a.Status, a.FailureReason, r.Notes)
	appendRecord(ts, r)
}

// checkInvariants runs the store's SQL invariants (no double booking, claims and slots
// agree, nothing stuck past its deadline) on the script controller's embedded database.
// Usage: invariants
func checkInvariants(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 0 {
		ts.Fatalf("usage: invariants")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The controller's embedded cluster: <state>/postgres, its socket in run/ (pgserver).
	conn := fmt.Sprintf("host=%s port=%d user=%s dbname=gpuaas sslmode=disable", filepath.Join(ts.Getenv("STATE"), "postgres", "run"), pgserver.Port, pgserver.Superuser)
	st, err := store.Open(ctx, conn, store.Options{MaxConns: 2})
	ts.Check(err)
	defer st.Close()
	v, err := st.InvariantsWithin(ctx, store.Deadlines{Provision: 30 * time.Minute, Release: 10 * time.Minute})
	ts.Check(err)
	if len(v) > 0 {
		ts.Fatalf("invariants violated:\n%s", strings.Join(v, "\n"))
	}
}
