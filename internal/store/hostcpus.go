package store

import (
	"context"

	"github.com/gpuaas/gpuaas/internal/cpuset"
)

// Housekeeping returns a node's housekeeping CPU set (the CPUs kept back from its slots for
// the host); set is false when none was ever decided.
func (t *Tx) Housekeeping(ctx context.Context, nodeID string) (cpus []int, set bool, err error) {
	var v []int
	err = t.tx.QueryRow(ctx, `SELECT housekeeping_cpus FROM nodes WHERE id = $1`, nodeID).Scan(&v)
	if err != nil {
		return nil, false, translate(err)
	}
	return v, v != nil, nil
}

// SetHousekeeping records a node's housekeeping CPU set. The database refuses a set that takes
// a CPU an enabled slot of the node owns (checked at commit, with the slots written in the
// same transaction).
func (t *Tx) SetHousekeeping(ctx context.Context, nodeID string, cpus []int) error {
	v := cpuset.Union(cpus) // sorted, distinct
	if v == nil {
		v = []int{}
	}
	_, err := t.tx.Exec(ctx, `UPDATE nodes SET housekeeping_cpus = $2 WHERE id = $1 AND housekeeping_cpus IS DISTINCT FROM $2`, nodeID, v)
	return translate(err)
}
