package soak

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/apiv1"
	"github.com/gpuaas/gpuaas/internal/bench/benchenv"
	"github.com/gpuaas/gpuaas/internal/client"
)

// gpuChoices weights the sizes a client asks for: mostly small slices, some whole hosts.
var gpuChoices = []int{1, 1, 1, 2, 2, 4, 8}

// pollEvery is how often a client re-reads its allocation while waiting.
const pollEvery = 300 * time.Millisecond

// client creates an allocation, waits until it is active (or failed), holds it briefly,
// releases it and waits until it is released, over and over until load ends; a cycle under
// way when load ends is finished under outer. It returns an error only for a harness fault.
func (s *run) client(load, outer context.Context, c *client.Client, id int) error {
	for n := 0; load.Err() == nil; n++ {
		gpus := gpuChoices[s.intn(len(gpuChoices))]
		key := fmt.Sprintf("soak-%d-%d", id, n)
		req := apiv1.AllocationCreate{SKU: benchenv.SliceSKU, GPUs: gpus, Image: s.fleet.Image()}
		a, err := c.CreateAllocation(outer, req, key)
		s.count("create", err)
		var ne *client.NetworkError
		if errors.As(err, &ne) {
			// The request may have committed: the same key must return the same allocation.
			a, err = c.CreateAllocation(outer, req, key)
			s.count("create_retry", err)
		}
		if err != nil {
			if outer.Err() != nil {
				return nil
			}
			pause(load, time.Second) // e.g. sku_unavailable: come back later
			continue
		}
		s.mu.Lock()
		s.rep.Created++
		s.mu.Unlock()
		got, err := s.await(outer, c, a.ID, "active", "failed")
		if err != nil {
			return err
		}
		switch got.Status {
		case "failed":
			s.mu.Lock()
			s.rep.Failed++
			s.mu.Unlock()
			s.fail("allocation_failed:" + reasonClass(got.FailureReason))
			continue // the controller cleans a touched failed allocation up by itself
		case "active":
			s.mu.Lock()
			s.rep.Active++
			if got.ActiveAt != nil {
				s.actives = append(s.actives, got.ActiveAt.Sub(got.CreatedAt))
			}
			s.mu.Unlock()
		}
		pause(load, time.Duration(s.intn(1000))*time.Millisecond)
		_, err = c.ReleaseAllocation(outer, a.ID)
		s.count("release", err)
		if err != nil {
			continue
		}
		got, err = s.await(outer, c, a.ID, "released", "failed")
		if err != nil {
			return err
		}
		if got.Status == "released" {
			s.mu.Lock()
			s.rep.Released++
			s.mu.Unlock()
		} else {
			s.fail("release_failed:" + reasonClass(got.FailureReason))
		}
	}
	return nil
}

// await polls the allocation until its status is one of want, or the settle timeout passes
// (then the allocation as last read is returned: the checker reports what is stuck).
func (s *run) await(ctx context.Context, c *client.Client, id string, want ...string) (*apiv1.Allocation, error) {
	deadline := time.Now().Add(settleTimeout)
	var last *apiv1.Allocation
	for {
		a, err := c.GetAllocation(ctx, id)
		s.count("get", err)
		if err == nil {
			last = a
			for _, w := range want {
				if a.Status == w {
					return a, nil
				}
			}
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if time.Now().After(deadline) {
			if last == nil {
				return nil, fmt.Errorf("allocation %s: never readable: %v", id, err)
			}
			return last, nil
		}
		pause(ctx, pollEvery)
	}
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// errorCode is the API error code, "network" for transport errors, else "other".
func errorCode(err error) string {
	var ae *apiv1.Error
	var ne *client.NetworkError
	switch {
	case errors.As(err, &ae):
		if r, ok := ae.Details["reason"].(string); ok && r != "" {
			return ae.Code + "/" + r
		}
		return ae.Code
	case errors.As(err, &ne):
		return "network"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "cancelled"
	}
	return "other"
}

// reasonClass shortens a failure reason to a countable class (its first clause).
func reasonClass(reason string) string {
	if i := strings.IndexAny(reason, ":;("); i > 0 {
		reason = reason[:i]
	}
	if len(reason) > 60 {
		reason = reason[:60]
	}
	return strings.TrimSpace(reason)
}
