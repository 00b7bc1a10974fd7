-- Slot health (docs/health.md). A slot is healthy, degraded (still sold, under watch) or
-- quarantined (never placed until an operator clears it after a passed validation). Health is
-- its own dimension beside the lifecycle status: a quarantined slot still goes through release,
-- wipe and cleanup, and ends idle ('available' status) but out of sale. The GPU, its fabric VF
-- and its NVMe disk are one slot row, so they are fenced together.
--
-- The database holds the guarantees:
--   * health changes only through a row in slot_health_events (the history): a direct UPDATE of
--     the column is refused, so every change has a reason, evidence and an actor;
--   * a quarantined slot cannot be reserved (the move into 'reserved' is refused), whatever
--     placement read: a quarantine that commits first makes a concurrent reservation's UPDATE
--     re-read the row and fail, one that commits second finds a live claim and is shown to its
--     tenant, and the slot stays quarantined after release;
--   * clearing a quarantine needs a passed validation recorded since the quarantine began (a
--     simulated one counts only where simulated hosts are allowed, like a simulated wipe);
--   * a failed validation quarantines the slot;
--   * a node with half or more of its enabled slots quarantined for a fault (a slot held only
--     for its validation after a wipe does not count), or a node-level signal, is drained, with
--     the reason kept on the node.
--
-- None of these triggers fires on the status changes of reservations and releases except the
-- one refusing 'reserved' for a quarantined slot, whose WHEN clause reads only the new row. The
-- new columns are in no index, so a status change stays a HOT update (migrations 012, 014).
ALTER TABLE node_resource_slots ADD COLUMN health text NOT NULL DEFAULT 'healthy'
    CONSTRAINT node_resource_slots_health_valid CHECK (health IN ('healthy', 'degraded', 'quarantined'));
ALTER TABLE node_resource_slots ADD COLUMN health_reason text NOT NULL DEFAULT '';
ALTER TABLE node_resource_slots ADD COLUMN health_since timestamptz;
-- The signal of the event that set the current health ('validation:pending' is a slot held
-- between its wipe and its SKU's validation: not a fault, so it does not count toward a drain).
ALTER TABLE node_resource_slots ADD COLUMN health_signal text NOT NULL DEFAULT '';

ALTER TABLE nodes ADD COLUMN drain_reason text NOT NULL DEFAULT '';

-- What runs on a slot after its wipe and before it is sold again.
ALTER TABLE sku_catalog ADD COLUMN validation_policy text NOT NULL DEFAULT 'none'
    CONSTRAINT sku_catalog_validation_policy_valid CHECK (validation_policy IN ('none', 'quick', 'burn-in'));

-- Validation results, append-only: one row per slot and run, with each check's outcome.
CREATE TABLE slot_validations (
    id              bigserial PRIMARY KEY,
    slot_id         uuid NOT NULL REFERENCES node_resource_slots(id),
    node_id         uuid NOT NULL REFERENCES nodes(id),
    allocation_id   uuid REFERENCES allocations(id),
    task_id         uuid,
    level           text NOT NULL CHECK (level IN ('quick', 'burn-in')),
    passed          boolean NOT NULL,
    simulated       boolean NOT NULL DEFAULT false,
    checks          jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(checks) = 'array'),
    summary         text NOT NULL DEFAULT '',
    recorded_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX slot_validations_slot ON slot_validations (slot_id, id);

-- The health history, append-only. slot_id NULL is a node-level event (action 'drain').
-- allocation_id is the live allocation on the slot when the event was recorded (filled by the
-- trigger, not the writer): its tenant sees the event on the allocation, without evidence.
CREATE TABLE slot_health_events (
    id              bigserial PRIMARY KEY,
    slot_id         uuid REFERENCES node_resource_slots(id),
    node_id         uuid NOT NULL REFERENCES nodes(id),
    allocation_id   uuid REFERENCES allocations(id),
    source          text NOT NULL CHECK (source IN ('pcie', 'nvme', 'nvidia-smi', 'kernel', 'guest',
                                                    'tenant-report', 'operator', 'validation')),
    signal          text NOT NULL CHECK (signal ~ '^[a-z0-9][a-z0-9_.:-]{0,62}$'),
    action          text NOT NULL CHECK (action IN ('record', 'degrade', 'quarantine', 'clear', 'drain')),
    health_before   text NOT NULL DEFAULT '',
    health_after    text NOT NULL DEFAULT '',
    reason          text NOT NULL CHECK (reason <> '' AND length(reason) <= 500),
    evidence        jsonb NOT NULL DEFAULT '{}',
    actor           text NOT NULL DEFAULT '',
    validation_id   bigint REFERENCES slot_validations(id),
    at              timestamptz NOT NULL DEFAULT now(),
    CHECK ((slot_id IS NULL) = (action = 'drain'))
);
CREATE INDEX slot_health_events_slot ON slot_health_events (slot_id, id) WHERE slot_id IS NOT NULL;
CREATE INDEX slot_health_events_allocation ON slot_health_events (allocation_id, id) WHERE allocation_id IS NOT NULL;
CREATE INDEX slot_health_events_node ON slot_health_events (node_id, id);

-- Applies an event to its slot (or node) and fills in what the event changed.
CREATE FUNCTION slot_health_event_apply() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    cur     node_resource_slots%ROWTYPE;
    v       slot_validations%ROWTYPE;
    next    text;
    fault   boolean;
    enabled integer;
    bad     integer;
BEGIN
    NEW.at := clock_timestamp();
    IF NEW.action = 'drain' THEN
        UPDATE nodes SET draining = true, drain_reason = NEW.reason WHERE id = NEW.node_id AND NOT draining;
        RETURN NEW;
    END IF;
    SELECT * INTO cur FROM node_resource_slots WHERE id = NEW.slot_id FOR UPDATE;
    IF NOT FOUND OR cur.node_id <> NEW.node_id THEN
        RAISE EXCEPTION 'health event for slot % names another node', NEW.slot_id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'slot_health_events_node';
    END IF;
    SELECT c.allocation_id INTO NEW.allocation_id FROM allocation_resource_claims c
        WHERE c.slot_id = cur.id AND c.status IN ('reserved', 'provisioning', 'active', 'releasing') LIMIT 1;
    NEW.health_before := cur.health;
    next := CASE NEW.action
        WHEN 'quarantine' THEN 'quarantined'
        WHEN 'degrade' THEN CASE WHEN cur.health = 'quarantined' THEN 'quarantined' ELSE 'degraded' END
        WHEN 'clear' THEN 'healthy'
        ELSE cur.health END;
    IF NEW.action = 'clear' AND cur.health = 'quarantined' THEN
        SELECT * INTO v FROM slot_validations
            WHERE slot_id = cur.id AND passed AND recorded_at >= cur.health_since
              AND (NOT simulated OR current_setting('gpuaas.allow_simulated', true) IS NOT DISTINCT FROM 'on')
            ORDER BY id DESC LIMIT 1;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'slot % is quarantined and has no passed validation since it was quarantined (%): run `gpuaasctl slots validate` first',
                cur.slot_index, cur.health_since
                USING ERRCODE = 'check_violation', CONSTRAINT = 'slot_health_clear_needs_validation';
        END IF;
        NEW.validation_id := v.id;
    END IF;
    NEW.health_after := next;
    -- A fault found while a slot is only held for its validation replaces the hold: the slot
    -- stays quarantined for the fault, and a later passed validation no longer lifts it.
    fault := NEW.action = 'quarantine' AND NEW.signal <> 'validation:pending'
             AND (cur.health <> 'quarantined' OR cur.health_signal = 'validation:pending');
    IF next IS DISTINCT FROM cur.health OR fault THEN
        UPDATE node_resource_slots
            SET health = next,
                health_reason = CASE WHEN next = 'healthy' THEN '' WHEN next = cur.health AND NOT fault AND cur.health_reason <> '' THEN cur.health_reason ELSE NEW.reason END,
                health_since = CASE WHEN next = cur.health AND NOT fault THEN cur.health_since ELSE clock_timestamp() END,
                health_signal = CASE WHEN next = 'healthy' THEN '' WHEN next = cur.health AND NOT fault THEN cur.health_signal ELSE NEW.signal END
            WHERE id = cur.id;
    END IF;
    IF fault THEN
        SELECT count(*) FILTER (WHERE status <> 'disabled'),
               count(*) FILTER (WHERE status <> 'disabled' AND health = 'quarantined' AND health_signal <> 'validation:pending')
            INTO enabled, bad FROM node_resource_slots WHERE node_id = cur.node_id;
        IF enabled > 0 AND bad * 2 >= enabled THEN
            UPDATE nodes SET draining = true,
                drain_reason = format('%s of %s slots quarantined (half or more): drained automatically', bad, enabled)
                WHERE id = cur.node_id AND NOT draining;
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER slot_health_events_apply BEFORE INSERT ON slot_health_events
    FOR EACH ROW EXECUTE FUNCTION slot_health_event_apply();

-- A validation row is checked against its slot's node; a failed one quarantines the slot.
CREATE FUNCTION slot_validation_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- FOR SHARE waits for a health event being applied to the slot, so the time taken after it
    -- orders the validation against the quarantine exactly.
    PERFORM 1 FROM node_resource_slots WHERE id = NEW.slot_id AND node_id = NEW.node_id FOR SHARE;
    NEW.recorded_at := clock_timestamp();
    IF NOT FOUND THEN
        RAISE EXCEPTION 'validation for slot % names another node', NEW.slot_id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'slot_validations_node';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER slot_validations_record BEFORE INSERT ON slot_validations
    FOR EACH ROW EXECUTE FUNCTION slot_validation_record();

CREATE FUNCTION slot_validation_failed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO slot_health_events (slot_id, node_id, source, signal, action, reason, evidence, actor, validation_id)
    VALUES (NEW.slot_id, NEW.node_id, 'validation', 'validation:' || NEW.level, 'quarantine',
            left('validation failed: ' || coalesce(nullif(NEW.summary, ''), 'a check did not pass'), 500),
            jsonb_build_object('checks', NEW.checks), 'validation', NEW.id);
    RETURN NULL;
END $$;
CREATE TRIGGER slot_validations_failed AFTER INSERT ON slot_validations
    FOR EACH ROW WHEN (NOT NEW.passed) EXECUTE FUNCTION slot_validation_failed();

CREATE FUNCTION slot_health_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME
        USING ERRCODE = 'check_violation', CONSTRAINT = 'slot_health_append_only';
END $$;
CREATE TRIGGER slot_health_events_append_only BEFORE UPDATE OR DELETE ON slot_health_events
    FOR EACH ROW EXECUTE FUNCTION slot_health_append_only();
CREATE TRIGGER slot_validations_append_only BEFORE UPDATE OR DELETE ON slot_validations
    FOR EACH ROW EXECUTE FUNCTION slot_health_append_only();

-- Health changes only through an event (the event's trigger runs this one at depth 2).
CREATE FUNCTION slot_health_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() < 2 THEN
        RAISE EXCEPTION 'slot % health changes only through a recorded health event', NEW.slot_index
            USING ERRCODE = 'check_violation', CONSTRAINT = 'slot_health_guard';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER slots_health_guard BEFORE UPDATE OF health, health_reason, health_since, health_signal ON node_resource_slots
    FOR EACH ROW WHEN (OLD.health IS DISTINCT FROM NEW.health OR OLD.health_reason IS DISTINCT FROM NEW.health_reason
                       OR OLD.health_since IS DISTINCT FROM NEW.health_since OR OLD.health_signal IS DISTINCT FROM NEW.health_signal)
    EXECUTE FUNCTION slot_health_guard();

-- A slot is inserted healthy: its health has no history yet.
CREATE TRIGGER slots_health_guard_insert BEFORE INSERT ON node_resource_slots
    FOR EACH ROW WHEN (NEW.health <> 'healthy') EXECUTE FUNCTION slot_health_guard();

-- The placement fence: a quarantined slot is never reserved.
CREATE FUNCTION slot_quarantine_fence() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'slot % is quarantined (%) and cannot be reserved', NEW.slot_index, NEW.health_reason
        USING ERRCODE = 'check_violation', CONSTRAINT = 'slot_quarantine_fence', HINT = 'gpuaas:slot_quarantined';
END $$;
CREATE TRIGGER slots_quarantine_fence BEFORE UPDATE OF status ON node_resource_slots
    FOR EACH ROW WHEN (NEW.status = 'reserved' AND NEW.health = 'quarantined')
    EXECUTE FUNCTION slot_quarantine_fence();

-- A whole node is never sold with a quarantined slot in it: a node_exclusive claim (baremetal)
-- is refused while any of its slots is quarantined. Slot claims are fenced by the slot's own
-- move into 'reserved' above; this fires for baremetal claims only.
CREATE FUNCTION claims_refuse_quarantined_node() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    idx integer;
BEGIN
    SELECT slot_index INTO idx FROM node_resource_slots
        WHERE node_id = NEW.node_id AND health = 'quarantined' ORDER BY slot_index LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'node % has quarantined slot % and cannot be sold whole', NEW.node_id, idx
            USING ERRCODE = 'check_violation', CONSTRAINT = 'slot_quarantine_fence', HINT = 'gpuaas:slot_quarantined';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER claims_refuse_quarantined_node BEFORE INSERT ON allocation_resource_claims
    FOR EACH ROW WHEN (NEW.claim_kind = 'node_exclusive')
    EXECUTE FUNCTION claims_refuse_quarantined_node();

-- The capacity hints (migration 006) count sellable slots: a health change marks the node dirty
-- as a status change does.
CREATE FUNCTION slots_health_capacity_dirty() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO node_capacity_dirty (node_id) VALUES (NEW.node_id);
    RETURN NULL;
END $$;
CREATE TRIGGER slots_health_capacity_dirty AFTER UPDATE OF health ON node_resource_slots
    FOR EACH ROW WHEN ((OLD.health = 'quarantined') IS DISTINCT FROM (NEW.health = 'quarantined'))
    EXECUTE FUNCTION slots_health_capacity_dirty();

---- create above / drop below ----

DROP TRIGGER IF EXISTS slots_health_capacity_dirty ON node_resource_slots;
DROP TRIGGER IF EXISTS claims_refuse_quarantined_node ON allocation_resource_claims;
DROP FUNCTION IF EXISTS claims_refuse_quarantined_node();
DROP TRIGGER IF EXISTS slots_quarantine_fence ON node_resource_slots;
DROP TRIGGER IF EXISTS slots_health_guard_insert ON node_resource_slots;
DROP TRIGGER IF EXISTS slots_health_guard ON node_resource_slots;
DROP TRIGGER IF EXISTS slot_validations_append_only ON slot_validations;
DROP TRIGGER IF EXISTS slot_health_events_append_only ON slot_health_events;
DROP TRIGGER IF EXISTS slot_validations_failed ON slot_validations;
DROP TRIGGER IF EXISTS slot_validations_record ON slot_validations;
DROP TRIGGER IF EXISTS slot_health_events_apply ON slot_health_events;
DROP FUNCTION IF EXISTS slots_health_capacity_dirty(), slot_quarantine_fence(), slot_health_guard(),
    slot_health_append_only(), slot_validation_failed(), slot_validation_record(), slot_health_event_apply();
DROP TABLE IF EXISTS slot_health_events;
DROP TABLE IF EXISTS slot_validations;
ALTER TABLE sku_catalog DROP COLUMN IF EXISTS validation_policy;
ALTER TABLE nodes DROP COLUMN IF EXISTS drain_reason;
ALTER TABLE node_resource_slots DROP COLUMN IF EXISTS health_signal;
ALTER TABLE node_resource_slots DROP COLUMN IF EXISTS health_since;
ALTER TABLE node_resource_slots DROP COLUMN IF EXISTS health_reason;
ALTER TABLE node_resource_slots DROP COLUMN IF EXISTS health;
