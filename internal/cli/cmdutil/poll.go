package cmdutil

import (
	"context"
	"time"
)

// Poll calls check at once and then every interval until it reports done or an error, or
// ctx ends (its error is returned). Bound the wait with context.WithTimeout.
func Poll(ctx context.Context, interval time.Duration, check func(context.Context) (done bool, err error)) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		done, err := check(ctx)
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
