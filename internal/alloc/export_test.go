package alloc

import (
	"context"
	"errors"

	"github.com/gpuaas/gpuaas/internal/store"
)

// HoldForTest marks slots as locked by a reservation in progress on this replica (what a
// concurrent create's lock records) until release is called.
func (s *Service) HoldForTest(ids []string) (release func()) {
	s.inflight.hold(ids)
	return func() { s.inflight.release(ids) }
}

// LockChoiceForTest is lockChoice: the ids it locked, and whether it lost the race.
func LockChoiceForTest(ctx context.Context, tx *store.Tx, nodeID string, preferred, alts []string) ([]string, bool, error) {
	_, ids, _, err := lockChoice(ctx, tx, nodeID, preferred, alts, "")
	if errors.Is(err, errLostRace) {
		return ids, true, nil
	}
	return ids, false, err
}
