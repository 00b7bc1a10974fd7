-- A slot's status change is a HOT update (issue 9). Every reservation and release changes the
-- status of its slots, eight updates a create+release pair. The partial index
-- node_resource_slots_available (WHERE status = 'available') made each one a non-HOT update: a
-- new row version, with a new entry in all four of the table's indexes, and the old version
-- and its entries left for vacuum. On the few nodes best fit keeps busy, the best-fit window
-- read its nodes' slots through a hundred index entries per eight live slots (a bitmap scan,
-- which cannot mark dead entries for later scans to skip). Nothing needs the index: every
-- reader of available slots finds them by node or by id, eight slots to a node. A slot row is
-- about 460 bytes, so a page holds about two nodes' slots; a fillfactor of 50 leaves a new
-- page room for a whole reservation's and release's new versions before the old ones are
-- pruned (the table is small: 8 rows a node). Existing pages gain room as their dead versions
-- are pruned.
DROP INDEX IF EXISTS node_resource_slots_available;
ALTER TABLE node_resource_slots SET (fillfactor = 50);

---- create above / drop below ----

ALTER TABLE node_resource_slots RESET (fillfactor);
CREATE INDEX IF NOT EXISTS node_resource_slots_available ON node_resource_slots (node_id, slot_index)
    WHERE status = 'available';
