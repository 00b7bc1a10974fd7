-- Retention of the event log. The log gains a row per allocation state change and one per
-- provisioning phase, so it cannot grow forever: prune_events removes the oldest events past
-- a retention age, together with their finished webhook deliveries and attempts.
--
-- What it removes is always a prefix of the log in reader order (xid, id): it walks from the
-- oldest readable event and stops at the first one it must keep (younger than the retention,
-- a webhook delivery still pending, or not yet fanned out to a live webhook of its tenant).
-- events_pruned records the last event removed, so a reader whose cursor lies before it is
-- told that events it has not read are gone (410 cursor_expired), never silently skipped.
-- The log stays append-only for everything else: a DELETE is refused unless prune_events
-- makes it, and even then for no event younger than a day.
CREATE TABLE events_pruned (
    one         boolean PRIMARY KEY DEFAULT true CHECK (one),
    xid         xid8 NOT NULL,
    id          bigint NOT NULL,
    pruned_at   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX webhook_deliveries_event ON webhook_deliveries (event_id);

CREATE OR REPLACE FUNCTION events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('gpuaas.pruning_events', true) = 'on'
       AND OLD.created_at < now() - interval '1 day' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'the event log is append-only' USING ERRCODE = 'check_violation';
END $$;

CREATE FUNCTION prune_events(keep interval, max_rows integer) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    cutoff timestamptz := now() - keep;
    r record;
    n bigint := 0;
    last_xid xid8;
    last_id bigint;
BEGIN
    IF keep < interval '1 day' THEN
        RAISE EXCEPTION 'event retention under a day is refused' USING ERRCODE = 'check_violation';
    END IF;
    -- One pruner at a time across replicas; another one's run is as good as this one.
    IF NOT pg_try_advisory_xact_lock(hashtext('gpuaas.prune_events')) THEN
        RETURN 0;
    END IF;
    PERFORM set_config('gpuaas.pruning_events', 'on', true);
    FOR r IN SELECT e.xid, e.id, e.tenant_id, e.created_at FROM events e
             WHERE e.xid < pg_snapshot_xmin(pg_current_snapshot())
             ORDER BY e.xid, e.id LIMIT max_rows
    LOOP
        EXIT WHEN r.created_at >= cutoff;
        EXIT WHEN EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = r.id AND d.status = 'pending');
        EXIT WHEN r.tenant_id IS NOT NULL AND EXISTS (
            SELECT 1 FROM webhooks w WHERE w.tenant_id = r.tenant_id AND w.deleted_at IS NULL
               AND (w.cursor_xid, w.cursor_id) < (r.xid, r.id));
        DELETE FROM webhook_attempts a USING webhook_deliveries d WHERE a.delivery_id = d.id AND d.event_id = r.id;
        DELETE FROM webhook_deliveries WHERE event_id = r.id;
        DELETE FROM events WHERE id = r.id;
        n := n + 1;
        last_xid := r.xid;
        last_id := r.id;
    END LOOP;
    PERFORM set_config('gpuaas.pruning_events', 'off', true);
    IF n > 0 THEN
        INSERT INTO events_pruned (one, xid, id) VALUES (true, last_xid, last_id)
        ON CONFLICT (one) DO UPDATE SET xid = EXCLUDED.xid, id = EXCLUDED.id, pruned_at = now()
            WHERE (events_pruned.xid, events_pruned.id) < (EXCLUDED.xid, EXCLUDED.id);
    END IF;
    RETURN n;
END $$;

---- create above / drop below ----

DROP FUNCTION IF EXISTS prune_events(interval, integer);
CREATE OR REPLACE FUNCTION events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the event log is append-only' USING ERRCODE = 'check_violation';
END $$;
DROP INDEX IF EXISTS webhook_deliveries_event;
DROP TABLE IF EXISTS events_pruned;
