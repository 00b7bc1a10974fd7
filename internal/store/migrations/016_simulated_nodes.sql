-- No simulated host is sold as real. A host whose hostd runs the sim runtime has no VMs and
-- writes no disks; nodes.simulated records that it ever said so, and the database refuses to
-- put a claim on it or to return a slot to sale on a simulated wipe, unless the session says
-- simulated hosts are allowed (the runtime parameter gpuaas.allow_simulated = 'on', which the
-- controller sets on its connections only when started with --allow-simulated-hosts).
ALTER TABLE nodes ADD COLUMN simulated boolean NOT NULL DEFAULT false;
UPDATE nodes SET simulated = true WHERE agent_facts->>'runtime' = 'sim';

-- Sticky: any write of agent facts (the heartbeat flush) that reports the sim runtime marks
-- the node. Only a re-enrollment with a new bootstrap token clears it, and only in the
-- transaction that consumed the token, which says so with the transaction-local setting
-- gpuaas.reenroll = the node's id.
CREATE FUNCTION nodes_mark_simulated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.simulated := true;
    RETURN NEW;
END $$;
CREATE TRIGGER nodes_mark_simulated BEFORE UPDATE OF agent_facts ON nodes
    FOR EACH ROW WHEN (NEW.agent_facts->>'runtime' = 'sim' AND NOT NEW.simulated)
    EXECUTE FUNCTION nodes_mark_simulated();

CREATE FUNCTION nodes_keep_simulated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('gpuaas.reenroll', true) IS DISTINCT FROM NEW.id::text THEN
        RAISE EXCEPTION 'node % reported the sim runtime; only re-enrolling it with a new bootstrap token clears that', NEW.name
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER nodes_keep_simulated BEFORE UPDATE OF simulated ON nodes
    FOR EACH ROW WHEN (OLD.simulated AND NOT NEW.simulated)
    EXECUTE FUNCTION nodes_keep_simulated();

-- The claim trigger of migration 001, with one more check on the node row it already reads
-- (no extra lookup on the placement hot path): a claim on a simulated node is refused unless
-- the session allows simulated hosts.
CREATE OR REPLACE FUNCTION claims_mutual_exclusion() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    sim boolean;
BEGIN
    IF NEW.claim_kind = 'slot' THEN
        SELECT n.simulated INTO sim FROM nodes n WHERE n.id = NEW.node_id FOR KEY SHARE;
        IF EXISTS (SELECT 1 FROM allocation_resource_claims c
                   WHERE c.node_id = NEW.node_id AND c.claim_kind = 'node_exclusive'
                     AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')) THEN
            RAISE EXCEPTION 'node % has a live node_exclusive claim', NEW.node_id
                USING ERRCODE = 'exclusion_violation';
        END IF;
        IF NOT EXISTS (SELECT 1 FROM node_resource_slots s
                       WHERE s.id = NEW.slot_id AND s.node_id = NEW.node_id) THEN
            RAISE EXCEPTION 'slot % is not on node %', NEW.slot_id, NEW.node_id
                USING ERRCODE = 'foreign_key_violation';
        END IF;
    ELSE
        SELECT n.simulated INTO sim FROM nodes n WHERE n.id = NEW.node_id FOR UPDATE;
        IF EXISTS (SELECT 1 FROM allocation_resource_claims c
                   WHERE c.node_id = NEW.node_id AND c.claim_kind = 'slot'
                     AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')) THEN
            RAISE EXCEPTION 'node % has live slot claims', NEW.node_id
                USING ERRCODE = 'exclusion_violation';
        END IF;
    END IF;
    IF sim AND current_setting('gpuaas.allow_simulated', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'node % runs the sim runtime: simulated hosts are not sold', NEW.node_id
            USING ERRCODE = 'check_violation', HINT = 'gpuaas:simulated_node';
    END IF;
    RETURN NEW;
END $$;

-- A slot goes back on sale only on a real wipe: a transition into available whose recorded
-- proof says simulated is refused unless the session allows simulated hosts. The WHEN clause
-- keeps every other status change (reservations, releases) free of it.
CREATE FUNCTION slots_refuse_simulated_wipe() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.health_metadata->'last_wipe'->>'method' = 'simulated'
       AND current_setting('gpuaas.allow_simulated', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'slot % cannot return to available on a simulated wipe: no disk was written', NEW.id
            USING ERRCODE = 'check_violation', HINT = 'gpuaas:simulated_wipe';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER slots_refuse_simulated_wipe BEFORE UPDATE OF status ON node_resource_slots
    FOR EACH ROW WHEN (NEW.status = 'available' AND OLD.status IS DISTINCT FROM 'available')
    EXECUTE FUNCTION slots_refuse_simulated_wipe();

---- create above / drop below ----

DROP TRIGGER IF EXISTS slots_refuse_simulated_wipe ON node_resource_slots;
DROP FUNCTION IF EXISTS slots_refuse_simulated_wipe();
CREATE OR REPLACE FUNCTION claims_mutual_exclusion() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.claim_kind = 'slot' THEN
        PERFORM 1 FROM nodes WHERE id = NEW.node_id FOR KEY SHARE;
        IF EXISTS (SELECT 1 FROM allocation_resource_claims c
                   WHERE c.node_id = NEW.node_id AND c.claim_kind = 'node_exclusive'
                     AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')) THEN
            RAISE EXCEPTION 'node % has a live node_exclusive claim', NEW.node_id
                USING ERRCODE = 'exclusion_violation';
        END IF;
        IF NOT EXISTS (SELECT 1 FROM node_resource_slots s
                       WHERE s.id = NEW.slot_id AND s.node_id = NEW.node_id) THEN
            RAISE EXCEPTION 'slot % is not on node %', NEW.slot_id, NEW.node_id
                USING ERRCODE = 'foreign_key_violation';
        END IF;
    ELSE
        PERFORM 1 FROM nodes WHERE id = NEW.node_id FOR UPDATE;
        IF EXISTS (SELECT 1 FROM allocation_resource_claims c
                   WHERE c.node_id = NEW.node_id AND c.claim_kind = 'slot'
                     AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')) THEN
            RAISE EXCEPTION 'node % has live slot claims', NEW.node_id
                USING ERRCODE = 'exclusion_violation';
        END IF;
    END IF;
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS nodes_keep_simulated ON nodes;
DROP FUNCTION IF EXISTS nodes_keep_simulated();
DROP TRIGGER IF EXISTS nodes_mark_simulated ON nodes;
DROP FUNCTION IF EXISTS nodes_mark_simulated();
ALTER TABLE nodes DROP COLUMN IF EXISTS simulated;
