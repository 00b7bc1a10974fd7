-- Placement reads a window of best-fit nodes through an index instead of every slot of the
-- fleet (issue 9). nodes.available_slots is a hint, not the truth: the count of the node's
-- slots in status 'available' as of the last capacity refresh. Slot changes only append the
-- node's id to node_capacity_dirty (an insert-only table, so reservations never queue on a
-- node row); the controller's refresher recounts the dirty nodes a few times a second. The
-- exact slot filter always runs on the window's nodes, and placement falls back to every
-- candidate when the windows yield nothing, so a stale hint costs speed, never capacity.
ALTER TABLE nodes ADD COLUMN available_slots integer NOT NULL DEFAULT 0;
UPDATE nodes n SET available_slots = (SELECT count(*) FROM node_resource_slots s WHERE s.node_id = n.id AND s.status = 'available');

CREATE TABLE node_capacity_dirty (node_id uuid NOT NULL, at timestamptz NOT NULL DEFAULT now());

CREATE FUNCTION slots_mark_capacity_dirty() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO node_capacity_dirty (node_id) SELECT DISTINCT node_id FROM new_rows;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO node_capacity_dirty (node_id) SELECT DISTINCT node_id FROM old_rows;
    ELSE
        INSERT INTO node_capacity_dirty (node_id)
        SELECT DISTINCT o.node_id FROM old_rows o JOIN new_rows n ON n.id = o.id
        WHERE o.status IS DISTINCT FROM n.status OR o.node_id <> n.node_id
        UNION
        SELECT n.node_id FROM old_rows o JOIN new_rows n ON n.id = o.id WHERE o.node_id <> n.node_id;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER slots_capacity_insert AFTER INSERT ON node_resource_slots
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION slots_mark_capacity_dirty();
CREATE TRIGGER slots_capacity_update AFTER UPDATE ON node_resource_slots
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION slots_mark_capacity_dirty();
CREATE TRIGGER slots_capacity_delete AFTER DELETE ON node_resource_slots
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION slots_mark_capacity_dirty();

CREATE INDEX nodes_best_fit ON nodes (slice_sku, available_slots, name) WHERE status = 'active' AND NOT draining;

-- The fabric filter's "VF unique among the node's slots" check, by index.
CREATE INDEX node_resource_slots_vf ON node_resource_slots (node_id, (capacity_metadata->>'fabric_vf_pci_address'));

-- A provision task whose allocation was released before its host took it is cancelled, never
-- delivered (issue 9's create+release churn showed the race).
ALTER TABLE node_tasks DROP CONSTRAINT node_tasks_status_check;
ALTER TABLE node_tasks ADD CONSTRAINT node_tasks_status_check
    CHECK (status IN ('queued', 'leased', 'succeeded', 'failed', 'refused', 'expired', 'cancelled'));
