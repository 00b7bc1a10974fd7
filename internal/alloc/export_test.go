package alloc

// HoldForTest marks slots as locked by a reservation in progress on this replica (what a
// concurrent create's lock records) until release is called.
func (s *Service) HoldForTest(ids []string) (release func()) {
	s.inflight.hold(ids)
	return func() { s.inflight.release(ids) }
}
