-- A slot claim records the devices the tenant was given (the claim's device snapshot, about
-- 1 KiB of jsonb). Until now every claim carried its own copy: written by the claim's insert
-- and written again, whole, by each status change of the claim (those updates cannot be HOT:
-- the live-claim unique indexes have the status in their predicate), about 8 KiB of WAL a
-- create+release pair of four slots.
--
-- The snapshot now lives once per distinct content of a slot's devices, in
-- slot_device_snapshots, written when a slot is created and when its devices change (a slot
-- map applied with new values, the node's housekeeping CPUs changed), never by a reservation.
-- A slot points at its current snapshot (device_snapshot_id); a slot claim points at the one
-- its slot had when the claim was made (allocation_resource_claims.device_snapshot_id), and
-- (below) keeps '{}' in resource_snapshot. A later change of the slot's devices writes a new snapshot
-- and moves only the slot's pointer: a claim's record never changes. Claims made before this
-- migration keep their own resource_snapshot (device_snapshot_id NULL); readers take
-- coalesce(snapshot.snapshot, claim.resource_snapshot).
--
-- A controller of the previous release reads a claim's resource_snapshot and nothing else, so
-- while one may run (a rolling upgrade) new claims keep their copy as well as the reference:
-- schema_switches.claims_snapshot_by_reference says when the copy stops. It starts on for a
-- database that has no node yet (nothing any controller could have served) and off for one
-- upgraded in service; an operator turns it on once every controller runs this release
-- (docs/upgrades.md), and the next release's migration will.
--
-- Held in the database:
-- - slot_device_snapshot(slot) is the one definition of a snapshot's content (what placement
--   built per claim before).
-- - A slot's device_snapshot_id always names a snapshot of its current devices: a trigger
--   sets it on insert and on any update that names a device column or the pointer itself (an
--   update setting it to anything else is answered with the right one), and the node's
--   housekeeping CPUs, which the snapshot includes, re-point the node's slots when they change.
-- - Snapshots are append-only: no update or delete.
-- - A slot claim records its slot's current snapshot: the claims' statement check refuses any
--   other (a claim inserted without one gets its slot's, by a row trigger that the
--   controller's insert, which names it, never fires), and a claim's record cannot be changed
--   afterwards.

CREATE TABLE schema_switches (
    name       text PRIMARY KEY,
    enabled    boolean NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO schema_switches (name, enabled)
    SELECT 'claims_snapshot_by_reference', NOT EXISTS (SELECT 1 FROM nodes);

-- Whether new slot claims leave resource_snapshot '{}' (no controller of the previous release
-- reads them).
CREATE FUNCTION claims_snapshot_by_reference() RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT enabled FROM schema_switches WHERE name = 'claims_snapshot_by_reference'), false)
$$;

CREATE TABLE slot_device_snapshots (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    slot_id    uuid NOT NULL, -- no foreign key: a slot's insert trigger writes its first snapshot before the slot row exists
    snapshot   jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX slot_device_snapshots_slot ON slot_device_snapshots (slot_id);

-- The device snapshot of a slot as it stands: the claim's record of what the tenant is given.
CREATE FUNCTION slot_device_snapshot(s node_resource_slots) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('slot_id', s.id, 'slot_index', s.slot_index, 'numa_node', s.numa_node,
        'pci_address', s.pci_address, 'gpu_model', s.gpu_model, 'gpu_uuid', s.gpu_uuid,
        'nvme_device', s.nvme_device, 'network_fabric', s.network_fabric,
        'fabric_pci_address', s.fabric_pci_address,
        'fabric_vf_pci_address', s.capacity_metadata->>'fabric_vf_pci_address',
        'mac_address', s.mac_address, 'private_ip', host(s.private_ip),
        'vcpu_count', s.vcpu_count, 'memory_mib', s.memory_mib, 'host_cpus', s.host_cpus,
        'housekeeping_cpus', (SELECT n.housekeeping_cpus FROM nodes n WHERE n.id = s.node_id),
        'destructive_wipe_policy', s.capacity_metadata->>'destructive_wipe_policy',
        'disk_identity', s.capacity_metadata->>'disk_identity')
$$;

ALTER TABLE node_resource_slots ADD COLUMN device_snapshot_id bigint REFERENCES slot_device_snapshots (id);
ALTER TABLE allocation_resource_claims ADD COLUMN device_snapshot_id bigint;

-- Point the slot at a snapshot of its devices: the current one when the content is the same,
-- a new one otherwise.
CREATE FUNCTION slots_snapshot_devices() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    want jsonb := slot_device_snapshot(NEW);
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.device_snapshot_id IS NOT NULL
       AND (SELECT d.snapshot FROM slot_device_snapshots d WHERE d.id = OLD.device_snapshot_id) = want THEN
        NEW.device_snapshot_id := OLD.device_snapshot_id;
        RETURN NEW;
    END IF;
    INSERT INTO slot_device_snapshots (slot_id, snapshot) VALUES (NEW.id, want)
        RETURNING id INTO NEW.device_snapshot_id;
    RETURN NEW;
END $$;
-- No other trigger changes a device column, so the order among BEFORE triggers does not matter.
-- A status change names none of these columns and does not fire it.
CREATE TRIGGER slots_snapshot_devices BEFORE INSERT ON node_resource_slots
    FOR EACH ROW EXECUTE FUNCTION slots_snapshot_devices();
CREATE TRIGGER slots_snapshot_devices_update BEFORE UPDATE OF id, node_id, slot_index, numa_node, pci_address,
        gpu_model, gpu_uuid, nvme_device, network_fabric, fabric_pci_address, capacity_metadata, mac_address,
        private_ip, vcpu_count, memory_mib, host_cpus, device_snapshot_id ON node_resource_slots
    FOR EACH ROW EXECUTE FUNCTION slots_snapshot_devices();

-- The node's housekeeping CPUs are part of each of its slots' snapshots.
CREATE FUNCTION nodes_snapshot_slot_devices() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE node_resource_slots SET device_snapshot_id = device_snapshot_id WHERE node_id = NEW.id;
    RETURN NULL;
END $$;
CREATE TRIGGER nodes_snapshot_slot_devices AFTER UPDATE OF housekeeping_cpus ON nodes
    FOR EACH ROW WHEN (OLD.housekeeping_cpus IS DISTINCT FROM NEW.housekeeping_cpus)
    EXECUTE FUNCTION nodes_snapshot_slot_devices();

CREATE FUNCTION slot_device_snapshots_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'slot device snapshots are a record: they are never changed or removed'
        USING ERRCODE = 'check_violation', CONSTRAINT = 'slot_device_snapshots_append_only';
END $$;
CREATE TRIGGER slot_device_snapshots_append_only BEFORE UPDATE OR DELETE ON slot_device_snapshots
    FOR EACH ROW EXECUTE FUNCTION slot_device_snapshots_append_only();

-- Every slot gets its snapshot (the update trigger writes it; from here on no slot is without
-- one: the insert trigger sets it, and an update naming it is answered with the slot's own).
UPDATE node_resource_slots SET device_snapshot_id = NULL;

-- A claim inserted without a snapshot gets its slot's (the controller's insert names it); the
-- copy it was given stays while the previous release may read it.
CREATE FUNCTION claims_device_snapshot() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    SELECT s.device_snapshot_id INTO NEW.device_snapshot_id FROM node_resource_slots s WHERE s.id = NEW.slot_id;
    IF claims_snapshot_by_reference() THEN
        NEW.resource_snapshot := '{}';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER claims_device_snapshot BEFORE INSERT ON allocation_resource_claims
    FOR EACH ROW WHEN (NEW.slot_id IS NOT NULL AND NEW.device_snapshot_id IS NULL)
    EXECUTE FUNCTION claims_device_snapshot();

-- A claim's record of its devices is written once; the one change allowed writes back the copy
-- of the snapshot it refers to (a rollback to the previous release, docs/upgrades.md). A
-- status change names neither column and does not fire it. An AFTER trigger: any BEFORE
-- UPDATE row trigger on a table makes every update lock the old row first (a WAL record per
-- claim status change), whatever its column list says.
CREATE FUNCTION claims_record_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.device_snapshot_id IS DISTINCT FROM OLD.device_snapshot_id
       OR (NEW.resource_snapshot IS DISTINCT FROM OLD.resource_snapshot
           AND NOT (OLD.resource_snapshot = '{}' AND NEW.resource_snapshot =
                    (SELECT d.snapshot FROM slot_device_snapshots d WHERE d.id = NEW.device_snapshot_id))) THEN
        RAISE EXCEPTION 'claim % records the devices it was given; that record is never changed', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'claims_record_fixed';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER claims_record_fixed AFTER UPDATE OF device_snapshot_id, resource_snapshot ON allocation_resource_claims
    FOR EACH ROW EXECUTE FUNCTION claims_record_fixed();

-- The slot claims' statement check (migration 032), now also refusing a slot claim whose
-- snapshot is not its slot's current one, in the same query as the slot-on-node check.
CREATE OR REPLACE FUNCTION claims_slot_checks() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    sims uuid[];
    bad record;
BEGIN
    SELECT array_agg(n.id) FILTER (WHERE n.simulated) INTO sims
    FROM (SELECT n.id, n.simulated FROM nodes n
          WHERE n.id IN (SELECT c.node_id FROM new_claims c WHERE c.claim_kind = 'slot')
          ORDER BY n.id FOR KEY SHARE) n;
    SELECT c.node_id INTO bad FROM allocation_resource_claims c
    WHERE c.node_id IN (SELECT n.node_id FROM new_claims n WHERE n.claim_kind = 'slot')
      AND c.claim_kind = 'node_exclusive' AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'node % has a live node_exclusive claim', bad.node_id
            USING ERRCODE = 'exclusion_violation';
    END IF;
    SELECT n.slot_id, n.node_id, s.id IS NULL AS off_node INTO bad FROM new_claims n
    LEFT JOIN node_resource_slots s ON s.id = n.slot_id AND s.node_id = n.node_id
    WHERE n.claim_kind = 'slot'
      AND (s.id IS NULL OR s.device_snapshot_id IS DISTINCT FROM n.device_snapshot_id)
    LIMIT 1;
    IF FOUND AND bad.off_node THEN
        RAISE EXCEPTION 'slot % is not on node %', bad.slot_id, bad.node_id
            USING ERRCODE = 'foreign_key_violation';
    ELSIF FOUND THEN
        RAISE EXCEPTION 'a claim on slot % must record the slot''s current device snapshot', bad.slot_id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'claims_record_slot_devices';
    END IF;
    IF sims IS NOT NULL AND current_setting('gpuaas.allow_simulated', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'node % runs the sim runtime: simulated hosts are not sold', sims[1]
            USING ERRCODE = 'check_violation', HINT = 'gpuaas:simulated_node';
    END IF;
    RETURN NULL;
END $$;

-- A slot's move back to available called the simulated-wipe refusal (migration 016) for every
-- slot (four function calls a release of four slots); its condition is now in its WHEN
-- clause, so it is called only for a slot whose last wipe was simulated, with the same
-- refusal. (The release of failed claims naming a slot back on sale, migration 029, stays a
-- row trigger: as one statement trigger over the changed rows it cost every reservation's slot
-- update more than it saved the release's, measured side by side.)
DROP TRIGGER slots_refuse_simulated_wipe ON node_resource_slots;
CREATE TRIGGER slots_refuse_simulated_wipe BEFORE UPDATE OF status ON node_resource_slots
    FOR EACH ROW WHEN (NEW.status = 'available' AND OLD.status IS DISTINCT FROM 'available'
                       AND NEW.health_metadata->'last_wipe'->>'method' = 'simulated')
    EXECUTE FUNCTION slots_refuse_simulated_wipe();

---- create above / drop below ----
DROP TRIGGER IF EXISTS slots_refuse_simulated_wipe ON node_resource_slots;
CREATE TRIGGER slots_refuse_simulated_wipe BEFORE UPDATE OF status ON node_resource_slots
    FOR EACH ROW WHEN (NEW.status = 'available' AND OLD.status IS DISTINCT FROM 'available')
    EXECUTE FUNCTION slots_refuse_simulated_wipe();


CREATE OR REPLACE FUNCTION claims_slot_checks() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    sims uuid[];
    bad record;
BEGIN
    SELECT array_agg(n.id) FILTER (WHERE n.simulated) INTO sims
    FROM (SELECT n.id, n.simulated FROM nodes n
          WHERE n.id IN (SELECT c.node_id FROM new_claims c WHERE c.claim_kind = 'slot')
          ORDER BY n.id FOR KEY SHARE) n;
    SELECT c.node_id INTO bad FROM allocation_resource_claims c
    WHERE c.node_id IN (SELECT n.node_id FROM new_claims n WHERE n.claim_kind = 'slot')
      AND c.claim_kind = 'node_exclusive' AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'node % has a live node_exclusive claim', bad.node_id
            USING ERRCODE = 'exclusion_violation';
    END IF;
    SELECT n.slot_id, n.node_id INTO bad FROM new_claims n
    WHERE n.claim_kind = 'slot'
      AND NOT EXISTS (SELECT 1 FROM node_resource_slots s WHERE s.id = n.slot_id AND s.node_id = n.node_id)
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'slot % is not on node %', bad.slot_id, bad.node_id
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    IF sims IS NOT NULL AND current_setting('gpuaas.allow_simulated', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'node % runs the sim runtime: simulated hosts are not sold', sims[1]
            USING ERRCODE = 'check_violation', HINT = 'gpuaas:simulated_node';
    END IF;
    RETURN NULL;
END $$;
-- Claims made since keep their snapshot in their own row again.
DROP TRIGGER IF EXISTS claims_record_fixed ON allocation_resource_claims;
UPDATE allocation_resource_claims c SET resource_snapshot = d.snapshot
    FROM slot_device_snapshots d WHERE d.id = c.device_snapshot_id;
DROP TRIGGER IF EXISTS claims_device_snapshot ON allocation_resource_claims;
DROP FUNCTION IF EXISTS claims_record_fixed(), claims_device_snapshot();
ALTER TABLE allocation_resource_claims DROP COLUMN IF EXISTS device_snapshot_id;
DROP TRIGGER IF EXISTS nodes_snapshot_slot_devices ON nodes;
DROP TRIGGER IF EXISTS slots_snapshot_devices ON node_resource_slots;
DROP TRIGGER IF EXISTS slots_snapshot_devices_update ON node_resource_slots;
DROP FUNCTION IF EXISTS nodes_snapshot_slot_devices(), slots_snapshot_devices();
ALTER TABLE node_resource_slots DROP COLUMN IF EXISTS device_snapshot_id;
DROP FUNCTION IF EXISTS slot_device_snapshot(node_resource_slots);
DROP TABLE IF EXISTS slot_device_snapshots;
DROP FUNCTION IF EXISTS claims_snapshot_by_reference();
DROP TABLE IF EXISTS schema_switches;
DROP FUNCTION IF EXISTS slot_device_snapshots_append_only();
