-- The placement filter's "no live baremetal allocation on this node" check (issue 9). It ran
-- through allocations_node, whose entries for released allocations stay until vacuum: with
-- a node's allocation history it read dozens of dead heap rows per candidate slot (1,700 of
-- the window query's 2,200 buffers in the 500-node bench). Only live baremetal allocations
-- are in this index, so the check is one probe of an (almost always empty) index.
CREATE INDEX allocations_live_baremetal ON allocations (node_id)
    WHERE capacity_shape = 'baremetal' AND status NOT IN ('released', 'failed');

---- create above / drop below ----

DROP INDEX IF EXISTS allocations_live_baremetal;
