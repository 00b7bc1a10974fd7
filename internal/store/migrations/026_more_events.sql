-- The event log (migration 021) also tells what happens to quotas, capacity reservations and
-- slot health, written by triggers so no path (a second replica, plain SQL) skips one.
-- A tenant's events carry only what the tenant already sees: no node, slot or device names.

-- A quota set, changed or removed: the tenant's event.
CREATE FUNCTION quota_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    q tenant_quotas := CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
BEGIN
    INSERT INTO events (type, tenant_id, data)
    VALUES (CASE WHEN TG_OP = 'DELETE' THEN 'quota.deleted' ELSE 'quota.set' END, q.tenant_id,
            jsonb_strip_nulls(jsonb_build_object('sku', q.sku, 'region', q.region,
                'max_gpus', CASE WHEN TG_OP = 'DELETE' THEN NULL ELSE q.max_gpus END,
                'max_allocations', CASE WHEN TG_OP = 'DELETE' THEN NULL ELSE q.max_allocations END)));
    RETURN NULL;
END $$;
CREATE TRIGGER tenant_quotas_event AFTER INSERT OR UPDATE OR DELETE ON tenant_quotas
    FOR EACH ROW EXECUTE FUNCTION quota_event();

-- A reservation made (active), cancelled or expired: the tenant's event (the node is the
-- operator's view only).
CREATE FUNCTION reservation_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (type, tenant_id, node_id, data)
    VALUES ('reservation.' || NEW.status, NEW.tenant_id, NEW.node_id,
            jsonb_strip_nulls(jsonb_build_object('reservation_id', NEW.id, 'status', NEW.status, 'sku', NEW.sku,
                'region', NEW.region, 'gpus', NEW.gpus, 'ends_at', NEW.ends_at)));
    RETURN NULL;
END $$;
CREATE TRIGGER capacity_reservations_event_insert AFTER INSERT ON capacity_reservations
    FOR EACH ROW EXECUTE FUNCTION reservation_event();
CREATE TRIGGER capacity_reservations_event_status AFTER UPDATE OF status ON capacity_reservations
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION reservation_event();

-- A slot's health changed: an operator event (node, slot, reason and evidence), and, when a
-- live allocation holds the slot, the allocation's tenant hears the new health and the
-- signal's name (xid:79, pcie.link_width, ...), never the host's device names.
CREATE FUNCTION slot_health_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    tenant uuid;
BEGIN
    INSERT INTO events (type, node_id, allocation_id, data)
    VALUES ('slot.health', NEW.node_id, NEW.allocation_id,
            jsonb_strip_nulls(jsonb_build_object('slot_id', NEW.slot_id, 'action', NEW.action, 'health', NULLIF(NEW.health_after, ''),
                'source', NEW.source, 'signal', NEW.signal, 'reason', NEW.reason)));
    IF NEW.allocation_id IS NOT NULL AND NEW.health_after <> '' AND NEW.health_after IS DISTINCT FROM NEW.health_before THEN
        SELECT a.tenant_id INTO tenant FROM allocations a
         WHERE a.id = NEW.allocation_id AND a.status NOT IN ('released', 'failed');
        IF tenant IS NOT NULL THEN
            INSERT INTO events (type, tenant_id, allocation_id, data)
            VALUES ('allocation.health', tenant, NEW.allocation_id,
                    jsonb_build_object('allocation_id', NEW.allocation_id, 'health', NEW.health_after, 'signal', NEW.signal));
        END IF;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER slot_health_events_event AFTER INSERT ON slot_health_events
    FOR EACH ROW EXECUTE FUNCTION slot_health_event();

---- create above / drop below ----

DROP TRIGGER IF EXISTS slot_health_events_event ON slot_health_events;
DROP FUNCTION IF EXISTS slot_health_event();
DROP TRIGGER IF EXISTS capacity_reservations_event_status ON capacity_reservations;
DROP TRIGGER IF EXISTS capacity_reservations_event_insert ON capacity_reservations;
DROP FUNCTION IF EXISTS reservation_event();
DROP TRIGGER IF EXISTS tenant_quotas_event ON tenant_quotas;
DROP FUNCTION IF EXISTS quota_event();
