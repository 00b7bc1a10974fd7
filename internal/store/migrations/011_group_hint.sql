-- The best-fit window skips nodes that cannot settle a request (issue 9's busy-fleet row).
-- nodes.available_slots orders the window, but a node's available slots can all be there with
-- no NUMA group holding enough of them: 2 + 2 free cannot take a 4-GPU request, which must sit
-- in one group. On a churned fleet those nodes sort first (few available slots), so a 4-GPU
-- create read one or two windows of them before reaching a node that could take it, and with
-- more than WindowsBeforeFullScan windows of them, every slot of the fleet. group_available is
-- the most available slots in one NUMA group (a slot of unknown NUMA node is a group of its
-- own), a hint kept with available_slots by the same refresh; the window reads only nodes
-- whose group could hold the request.
ALTER TABLE nodes ADD COLUMN group_available integer NOT NULL DEFAULT 0;
UPDATE nodes n SET group_available = (SELECT coalesce(max(k), 0) FROM (SELECT count(*) AS k FROM node_resource_slots s
    WHERE s.node_id = n.id AND s.status = 'available'
    GROUP BY s.numa_node, CASE WHEN s.numa_node IS NULL THEN s.id END) g);

---- create above / drop below ----

ALTER TABLE nodes DROP COLUMN IF EXISTS group_available;
