package store

// WindowSQL lets tests EXPLAIN the placement window's statement.
var WindowSQL = windowSQL

// RefreshCapacitySQL lets tests EXPLAIN the capacity refresh.
const RefreshCapacitySQL = refreshCapacitySQL

// FirstWindowKey is where the first window of a request for gpus starts (WindowRequest.key).
func FirstWindowKey(gpus int) WindowKey { return WindowRequest{GPUs: gpus}.key() }
