-- The event log: what a tenant or an operator cares about (allocation state changes,
-- provisioning progress, wipes, maintenance notices), durable and ordered, read by
-- GET /api/v1/events with a resumable cursor and delivered to webhooks.
--
-- Order and the cursor. A bigserial id is taken when a row is inserted, not when its
-- transaction commits: a reader that saw id 12 commit may later see id 10 appear, and a
-- cursor "after 12" would skip it. Each row therefore also records its transaction's id
-- (xid8, never wraps), and readers see only rows whose transaction is older than the oldest
-- transaction still in flight (pg_snapshot_xmin of the statement's own snapshot), in
-- (xid, id) order. Every transaction below that horizon has ended, and any transaction that
-- has not committed yet holds or will get an xid at or above it, so no row can ever appear
-- before a cursor a reader already holds: no gaps, no duplicates on resume, with any number
-- of concurrent writers and no lock shared between them (a counter row updated at commit
-- would serialize every allocation create). The price: an event becomes readable only once
-- every older writing transaction has ended, normally milliseconds; a long-running write
-- transaction anywhere in the cluster holds readers back until it ends.
CREATE TABLE events (
    id              bigserial PRIMARY KEY,
    xid             xid8 NOT NULL DEFAULT pg_current_xact_id(),
    type            text NOT NULL CHECK (type ~ '^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$' AND length(type) <= 64),
    tenant_id       uuid,           -- NULL: operators only
    allocation_id   uuid,
    node_id         uuid,           -- the operator's view; never shown to a tenant
    data            jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(data) = 'object'),
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX events_order ON events (xid, id);
CREATE INDEX events_tenant ON events (tenant_id, xid, id);

-- Append-only: a delivered event is never rewritten.
CREATE FUNCTION events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the event log is append-only' USING ERRCODE = 'check_violation';
END $$;
CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_append_only();

-- Every allocation state change is an event, whatever wrote it (the controller, a plain SQL
-- fix): one row in the writing transaction. The data holds only what the tenant already sees
-- of its allocation.
CREATE FUNCTION allocation_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    d jsonb := jsonb_build_object('allocation_id', NEW.id, 'status', NEW.status, 'sku', NEW.sku,
                                  'gpus', NEW.gpus_total, 'region', NEW.region);
BEGIN
    IF TG_OP = 'UPDATE' THEN
        d := d || jsonb_build_object('previous_status', OLD.status);
    END IF;
    IF NEW.status = 'failed' AND NEW.failure_reason <> '' THEN
        d := d || jsonb_build_object('reason', NEW.failure_reason);
    END IF;
    INSERT INTO events (type, tenant_id, allocation_id, node_id, data)
    VALUES ('allocation.' || NEW.status, NEW.tenant_id, NEW.id, NEW.node_id, d);
    RETURN NULL;
END $$;
CREATE TRIGGER allocations_event_insert AFTER INSERT ON allocations
    FOR EACH ROW EXECUTE FUNCTION allocation_event();
CREATE TRIGGER allocations_event_status AFTER UPDATE OF status ON allocations
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION allocation_event();

-- Provisioning progress: each phase a host reports for an allocation's provisioning task is
-- one event (name, status, duration; not the phase's detail, which may name host devices).
-- A new attempt starts its phase list again (its first phase has another start time).
CREATE FUNCTION task_phase_events() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    first int := 0;
    n int := jsonb_array_length(NEW.phases);
    tenant uuid;
    p jsonb;
BEGIN
    IF jsonb_typeof(OLD.phases) = 'array' AND jsonb_array_length(OLD.phases) <= n
       AND OLD.phases->0->'started_at' IS NOT DISTINCT FROM NEW.phases->0->'started_at' THEN
        first := jsonb_array_length(OLD.phases);
    END IF;
    IF first >= n THEN
        RETURN NULL;
    END IF;
    SELECT tenant_id INTO tenant FROM allocations WHERE id = NEW.allocation_id;
    FOR i IN first .. n - 1 LOOP
        p := NEW.phases->i;
        INSERT INTO events (type, tenant_id, allocation_id, node_id, data)
        VALUES ('allocation.phase', tenant, NEW.allocation_id, NEW.node_id,
                jsonb_build_object('allocation_id', NEW.allocation_id, 'attempt', NEW.attempt, 'index', i,
                                   'phase', p->'name', 'phase_status', p->'status', 'duration_ms', p->'duration_ms'));
    END LOOP;
    RETURN NULL;
END $$;
CREATE TRIGGER node_tasks_phase_events AFTER UPDATE OF phases ON node_tasks
    FOR EACH ROW WHEN (NEW.allocation_id IS NOT NULL AND NEW.type = 'slice.vm_provision'
                       AND jsonb_typeof(NEW.phases) = 'array'
                       AND NEW.phases IS DISTINCT FROM OLD.phases)
    EXECUTE FUNCTION task_phase_events();

-- A wipe recorded for an allocation's disk (release): verified or not, and how.
CREATE FUNCTION wipe_proof_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (type, tenant_id, allocation_id, node_id, data)
    SELECT 'allocation.wipe', a.tenant_id, a.id, NEW.node_id,
           jsonb_build_object('allocation_id', a.id, 'verified', NEW.verified, 'method', NEW.method,
                              'finished_at', NEW.finished_at)
    FROM allocations a WHERE a.id = NEW.allocation_id;
    RETURN NULL;
END $$;
CREATE TRIGGER slot_wipe_proofs_event AFTER INSERT ON slot_wipe_proofs
    FOR EACH ROW WHEN (NEW.allocation_id IS NOT NULL)
    EXECUTE FUNCTION wipe_proof_event();

-- Maintenance notices: an operator drains a node with a deadline and a reason; every tenant
-- with a live allocation on it is told (one maintenance.scheduled event per allocation,
-- recorded in maintenance_notice_allocations in the same transaction).
CREATE TABLE maintenance_notices (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    node_id         uuid NOT NULL REFERENCES nodes(id),
    reason          text NOT NULL CHECK (reason <> '' AND length(reason) <= 1000),
    deadline        timestamptz NOT NULL,
    created_by      text NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT now(),
    CHECK (deadline >= created_at)
);
CREATE INDEX maintenance_notices_node ON maintenance_notices (node_id, created_at DESC);

CREATE TABLE maintenance_notice_allocations (
    notice_id       uuid NOT NULL REFERENCES maintenance_notices(id),
    allocation_id   uuid NOT NULL REFERENCES allocations(id),
    tenant_id       uuid NOT NULL REFERENCES tenants(id),
    PRIMARY KEY (notice_id, allocation_id)
);
CREATE INDEX maintenance_notice_allocations_tenant ON maintenance_notice_allocations (tenant_id, notice_id);

---- create above / drop below ----

DROP TABLE IF EXISTS maintenance_notice_allocations;
DROP TABLE IF EXISTS maintenance_notices;
DROP TRIGGER IF EXISTS slot_wipe_proofs_event ON slot_wipe_proofs;
DROP FUNCTION IF EXISTS wipe_proof_event();
DROP TRIGGER IF EXISTS node_tasks_phase_events ON node_tasks;
DROP FUNCTION IF EXISTS task_phase_events();
DROP TRIGGER IF EXISTS allocations_event_status ON allocations;
DROP TRIGGER IF EXISTS allocations_event_insert ON allocations;
DROP FUNCTION IF EXISTS allocation_event();
DROP TABLE IF EXISTS events;
DROP FUNCTION IF EXISTS events_append_only();
