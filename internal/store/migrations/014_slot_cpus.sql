-- Each slot owns a host CPU set on its NUMA node, disjoint from every other enabled slot's on
-- the node, and the node keeps a housekeeping set back for the host (emulator and I/O
-- threads, hostd, the kernel). The database is where "disjoint" holds: whatever writes a slot
-- (slots apply, approval, enable, plain SQL), two enabled slots of one node never share a CPU,
-- a slot never takes a housekeeping CPU, and a slot never asks for more vCPUs than it owns.
--
-- host_cpus '{}' is a slot without a CPU set (a slot map that names none on a node whose
-- topology is unknown); the host refuses to boot such a slot on the libvirt and lab runtimes.
-- housekeeping_cpus NULL is a node whose housekeeping set was never decided.
ALTER TABLE node_resource_slots ADD COLUMN host_cpus integer[] NOT NULL DEFAULT '{}'
    CONSTRAINT node_resource_slots_host_cpus_valid
    CHECK (array_position(host_cpus, NULL) IS NULL AND 0 <= ALL (host_cpus) AND 8191 >= ALL (host_cpus));
-- The CPU set makes a slot row about 120 bytes longer (24 CPUs: 580 bytes instead of 460). At
-- a fillfactor of 50 a page then starts with seven rows, and a reservation's and a release's
-- new versions of four of them no longer fit beside the old ones before those are pruned: a
-- status change stops being a HOT update (migration 012). 40 keeps five rows to a fresh page
-- and room for both.
ALTER TABLE node_resource_slots SET (fillfactor = 40);
ALTER TABLE nodes ADD COLUMN housekeeping_cpus integer[]
    CONSTRAINT nodes_housekeeping_cpus_valid
    CHECK (array_position(housekeeping_cpus, NULL) IS NULL AND 0 <= ALL (housekeeping_cpus) AND 8191 >= ALL (housekeeping_cpus));

-- slot_host_cpus_check refuses an enabled slot whose CPU set overlaps another enabled slot's
-- of the same node or the node's housekeeping set, or that asks for more vCPUs than it owns.
-- It locks the node row first (FOR NO KEY UPDATE: foreign-key checks of other writers still
-- pass), so two transactions that each add a slot on one node check one after the other, and
-- the second sees the first's committed slot: under READ COMMITTED every statement below takes
-- a fresh snapshot after the lock is granted. It reads the slot's current row, not the row
-- the event carried: the check is deferred to commit, when a slot map has been written whole
-- (two slots trading CPU sets in one apply pass through an overlap between their updates).
CREATE FUNCTION slot_host_cpus_check() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    cur    node_resource_slots%ROWTYPE;
    hk     integer[];
    holder integer;
    shared integer[];
BEGIN
    PERFORM 1 FROM nodes WHERE id = NEW.node_id FOR NO KEY UPDATE;
    SELECT * INTO cur FROM node_resource_slots WHERE id = NEW.id;
    IF NOT FOUND OR cur.status = 'disabled' THEN
        RETURN NULL;
    END IF;
    IF cardinality(cur.host_cpus) > 0 AND cur.vcpu_count > cardinality(cur.host_cpus) THEN
        RAISE EXCEPTION 'slot % asks for % vCPUs but owns only % host CPUs: lower its vcpu_count or give it more CPUs',
            cur.slot_index, cur.vcpu_count, cardinality(cur.host_cpus)
            USING ERRCODE = 'check_violation', CONSTRAINT = 'node_resource_slots_vcpus_within_host_cpus';
    END IF;
    IF cardinality(cur.host_cpus) = 0 THEN
        RETURN NULL;
    END IF;
    SELECT n.housekeeping_cpus INTO hk FROM nodes n WHERE n.id = cur.node_id;
    IF hk && cur.host_cpus THEN
        SELECT array_agg(c ORDER BY c) INTO shared FROM unnest(cur.host_cpus) c WHERE c = ANY (hk);
        RAISE EXCEPTION 'slot % cannot own host CPUs %: they are the node''s housekeeping CPUs',
            cur.slot_index, array_to_string(shared, ',')
            USING ERRCODE = 'exclusion_violation', CONSTRAINT = 'node_resource_slots_host_cpus_housekeeping';
    END IF;
    SELECT o.slot_index, (SELECT array_agg(c ORDER BY c) FROM unnest(cur.host_cpus) c WHERE c = ANY (o.host_cpus))
        INTO holder, shared
        FROM node_resource_slots o
        WHERE o.node_id = cur.node_id AND o.id <> cur.id AND o.status <> 'disabled' AND o.host_cpus && cur.host_cpus
        ORDER BY o.slot_index LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'slot % cannot own host CPUs %: slot % holds them', cur.slot_index, array_to_string(shared, ','), holder
            USING ERRCODE = 'exclusion_violation', CONSTRAINT = 'node_resource_slots_host_cpus_disjoint';
    END IF;
    RETURN NULL;
END $$;

-- The trigger fires on a new enabled slot, on a change of an enabled slot's CPU set or vCPU
-- count, and on a slot leaving 'disabled'; never on the status changes of reservations and
-- releases (the WHEN clause is false for them, and the function is not called).
CREATE CONSTRAINT TRIGGER node_resource_slots_host_cpus_insert
    AFTER INSERT ON node_resource_slots DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.status <> 'disabled')
    EXECUTE FUNCTION slot_host_cpus_check();
CREATE CONSTRAINT TRIGGER node_resource_slots_host_cpus_update
    AFTER UPDATE OF host_cpus, vcpu_count, status ON node_resource_slots DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.status <> 'disabled' AND (OLD.status = 'disabled'
        OR OLD.host_cpus IS DISTINCT FROM NEW.host_cpus OR OLD.vcpu_count IS DISTINCT FROM NEW.vcpu_count))
    EXECUTE FUNCTION slot_host_cpus_check();

-- nodes_housekeeping_cpus_check refuses a housekeeping set that takes a CPU an enabled slot of
-- the node owns. It runs when the set changes only (never on the heartbeat and capacity-hint
-- updates of the node row).
CREATE FUNCTION nodes_housekeeping_cpus_check() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    holder integer;
    shared integer[];
BEGIN
    SELECT o.slot_index, (SELECT array_agg(c ORDER BY c) FROM unnest(NEW.housekeeping_cpus) c WHERE c = ANY (o.host_cpus))
        INTO holder, shared
        FROM node_resource_slots o
        WHERE o.node_id = NEW.id AND o.status <> 'disabled' AND o.host_cpus && NEW.housekeeping_cpus
        ORDER BY o.slot_index LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'housekeeping CPUs % are slot %''s host CPUs', array_to_string(shared, ','), holder
            USING ERRCODE = 'exclusion_violation', CONSTRAINT = 'nodes_housekeeping_cpus_disjoint';
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER nodes_housekeeping_cpus
    AFTER UPDATE OF housekeeping_cpus ON nodes DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (OLD.housekeeping_cpus IS DISTINCT FROM NEW.housekeeping_cpus)
    EXECUTE FUNCTION nodes_housekeeping_cpus_check();

---- create above / drop below ----

DROP TRIGGER IF EXISTS nodes_housekeeping_cpus ON nodes;
DROP FUNCTION IF EXISTS nodes_housekeeping_cpus_check();
DROP TRIGGER IF EXISTS node_resource_slots_host_cpus_update ON node_resource_slots;
DROP TRIGGER IF EXISTS node_resource_slots_host_cpus_insert ON node_resource_slots;
DROP FUNCTION IF EXISTS slot_host_cpus_check();
ALTER TABLE nodes DROP COLUMN IF EXISTS housekeeping_cpus;
ALTER TABLE node_resource_slots DROP COLUMN IF EXISTS host_cpus;
ALTER TABLE node_resource_slots SET (fillfactor = 50);
