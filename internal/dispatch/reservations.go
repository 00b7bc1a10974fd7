package dispatch

import "context"

// expireReservations ends the capacity reservations whose end has come, on the reaper's tick:
// their held slots return to the fleet. Every replica runs it; the database ends each
// reservation once (store.ExpireReservations), so two replicas never both end one.
func (d *Dispatcher) expireReservations(ctx context.Context) {
	n, err := d.alloc.ExpireReservations(ctx)
	switch {
	case err != nil && ctx.Err() == nil:
		d.log.Error("reservation expiry", "err", err)
	case n > 0:
		d.log.Info("capacity reservations expired", "count", n)
	}
}
