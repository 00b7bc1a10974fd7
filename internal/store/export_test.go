package store

// WindowSQL lets tests EXPLAIN the placement window's statement.
var WindowSQL = windowSQL

// RefreshCapacitySQL lets tests EXPLAIN the capacity refresh.
const RefreshCapacitySQL = refreshCapacitySQL

// FirstWindowArgs is WindowSQL's arguments for the first window of a request for gpus of sku
// (any region and tenant, no heartbeat age), limit nodes, one group of group slots.
func FirstWindowArgs(sku string, gpus, limit, group int) []any {
	return WindowRequest{Query: PlacementQuery{SKU: sku}, GPUs: gpus, Limit: limit, Group: group}.sqlArgs()
}

// Translate is the store's translation of database errors, for tests that write with SQL.
var Translate = translate
