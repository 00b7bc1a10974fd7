-- Quotas and capacity reservations (docs/tenants.md).
--
-- A quota limits one tenant's live GPUs and live allocations of one SKU, in one region or (region
-- '') in every region together. The database enforces it: the insert of an allocation or of a
-- capacity reservation locks the tenant's quota rows for the SKU (FOR UPDATE, so concurrent
-- creates of that tenant and SKU count one after the other), counts the usage in a fresh
-- snapshot after the lock, and refuses what would exceed a limit. A tenant without a quota row
-- for the SKU pays one index probe of this small table and takes no lock.
CREATE TABLE tenant_quotas (
    tenant_id       uuid NOT NULL REFERENCES tenants(id),
    sku             text NOT NULL REFERENCES sku_catalog(sku),
    region          text NOT NULL DEFAULT '',   -- '' = the SKU in every region together
    max_gpus        integer CHECK (max_gpus IS NULL OR max_gpus >= 0),               -- NULL = no limit
    max_allocations integer CHECK (max_allocations IS NULL OR max_allocations >= 0), -- NULL = no limit
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, sku, region)
);

-- A capacity reservation holds slots of one node for one tenant: node_resource_slots.reservation_id
-- names it while it is active, and only an allocation inside it (allocations.reservation_id) can
-- claim such a slot. Released slots of such an allocation keep the mark, so they come back to the
-- reservation, not the fleet; cancellation and expiry clear it. price_snapshot records how the
-- held GPUs are billed (the SKU's catalog GPU-hour price when the reservation was made).
CREATE TABLE capacity_reservations (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id       uuid NOT NULL REFERENCES tenants(id),
    sku             text NOT NULL REFERENCES sku_catalog(sku),
    region          text NOT NULL,
    node_id         uuid NOT NULL REFERENCES nodes(id),
    gpus            integer NOT NULL CHECK (gpus > 0),
    status          text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'cancelled', 'expired')),
    price_snapshot  jsonb NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    ends_at         timestamptz,                -- NULL = until cancelled
    ended_at        timestamptz,
    CHECK ((status = 'active') = (ended_at IS NULL)),
    CHECK (ends_at IS NULL OR ends_at > created_at)
);
CREATE INDEX capacity_reservations_tenant ON capacity_reservations (tenant_id, created_at DESC);
CREATE INDEX capacity_reservations_due ON capacity_reservations (ends_at) WHERE status = 'active' AND ends_at IS NOT NULL;

-- An ended reservation stays ended, and a reservation keeps its tenant, node and size (its
-- held slots and the quotas that counted it were decided for them).
CREATE FUNCTION capacity_reservations_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status <> 'active' THEN
        RAISE EXCEPTION 'capacity reservation % has already ended (%)', OLD.id, OLD.status
            USING ERRCODE = 'check_violation', CONSTRAINT = 'capacity_reservation_ended';
    END IF;
    IF OLD.node_id <> NEW.node_id OR OLD.tenant_id <> NEW.tenant_id OR OLD.gpus <> NEW.gpus THEN
        RAISE EXCEPTION 'capacity reservation % keeps its tenant, node and size', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'capacity_reservation_fixed';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER capacity_reservations_transition BEFORE UPDATE ON capacity_reservations
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.node_id IS DISTINCT FROM NEW.node_id
                       OR OLD.tenant_id IS DISTINCT FROM NEW.tenant_id OR OLD.gpus IS DISTINCT FROM NEW.gpus)
    EXECUTE FUNCTION capacity_reservations_transition();

-- Nullable, no default: adding them rewrites nothing, and a NULL costs a bit in the row's null
-- map (a slot row stays the size migration 014 sized its fillfactor for). The index has
-- neither the status nor any column a reservation or release changes, so a slot's status
-- change stays a HOT update (migration 012).
ALTER TABLE node_resource_slots ADD COLUMN reservation_id uuid REFERENCES capacity_reservations(id);
CREATE INDEX node_resource_slots_reservation ON node_resource_slots (reservation_id) WHERE reservation_id IS NOT NULL;
ALTER TABLE allocations ADD COLUMN reservation_id uuid REFERENCES capacity_reservations(id);

-- tenant_quota_usage is what counts against a quota of tenant t, SKU s and region rg ('' = every
-- region): GPUs of live allocations (requested, provisioning, active: a release frees its quota
-- at once) outside an active reservation, plus the GPUs of the tenant's active reservations;
-- and live allocations, inside reservations or not.
CREATE FUNCTION tenant_quota_usage(t uuid, s text, rg text, OUT gpus bigint, OUT allocations bigint)
    LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(a.gpus_total) FILTER (WHERE a.reservation_id IS NULL
               OR NOT EXISTS (SELECT 1 FROM capacity_reservations r WHERE r.id = a.reservation_id AND r.status = 'active')), 0)
           + (SELECT coalesce(sum(r.gpus), 0) FROM capacity_reservations r
              WHERE r.tenant_id = t AND r.sku = s AND (rg = '' OR r.region = rg) AND r.status = 'active'),
           count(*)
    FROM allocations a
    WHERE a.tenant_id = t AND a.sku = s AND (rg = '' OR a.region = rg)
      AND a.status IN ('requested', 'provisioning', 'active')
$$;

-- tenant_quota_enforce refuses adding add_gpus GPUs and add_allocs allocations of SKU s in region
-- rg to tenant t's usage when a quota of theirs would be exceeded. It locks the quota rows first;
-- under READ COMMITTED the usage is then read in a fresh snapshot that holds every concurrent
-- create that held the lock before. The refusal carries the limit and the usage as JSON in its
-- DETAIL and HINT 'gpuaas:quota_exceeded' (store.translate reads them).
CREATE FUNCTION tenant_quota_enforce(t uuid, s text, rg text, add_gpus integer, add_allocs integer)
    RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    q    tenant_quotas%ROWTYPE;
    used record;
BEGIN
    FOR q IN SELECT * FROM tenant_quotas WHERE tenant_id = t AND sku = s AND region IN ('', rg)
             ORDER BY region FOR UPDATE LOOP
        IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
            RAISE EXCEPTION USING ERRCODE = 'feature_not_supported',
                MESSAGE = 'quotas are enforced under READ COMMITTED isolation only';
        END IF;
        SELECT * INTO used FROM tenant_quota_usage(t, s, q.region);
        IF add_gpus > 0 AND q.max_gpus IS NOT NULL AND used.gpus + add_gpus > q.max_gpus THEN
            RAISE EXCEPTION USING ERRCODE = 'check_violation', CONSTRAINT = 'tenant_quota', HINT = 'gpuaas:quota_exceeded',
                MESSAGE = format('quota exceeded: %s more GPUs of %s%s would make %s, over the limit of %s (%s in use)',
                                 add_gpus, s, CASE WHEN q.region = '' THEN '' ELSE ' in region ' || q.region END,
                                 used.gpus + add_gpus, q.max_gpus, used.gpus),
                DETAIL = json_build_object('limit', 'gpus', 'sku', s, 'region', q.region, 'max', q.max_gpus,
                                           'used', used.gpus, 'requested', add_gpus)::text;
        END IF;
        IF add_allocs > 0 AND q.max_allocations IS NOT NULL AND used.allocations + add_allocs > q.max_allocations THEN
            RAISE EXCEPTION USING ERRCODE = 'check_violation', CONSTRAINT = 'tenant_quota', HINT = 'gpuaas:quota_exceeded',
                MESSAGE = format('quota exceeded: %s live allocations of %s%s is the limit (%s in use)',
                                 q.max_allocations, s, CASE WHEN q.region = '' THEN '' ELSE ' in region ' || q.region END,
                                 used.allocations),
                DETAIL = json_build_object('limit', 'allocations', 'sku', s, 'region', q.region, 'max', q.max_allocations,
                                           'used', used.allocations, 'requested', add_allocs)::text;
        END IF;
    END LOOP;
END $$;

-- A new allocation counts against its tenant's quotas; one inside a reservation must be the
-- reservation's tenant's, of its SKU, while it is active, and adds no GPUs (the reservation's
-- count already).
CREATE FUNCTION allocations_quota_check() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r capacity_reservations%ROWTYPE;
BEGIN
    -- The common case, no quota and no reservation, in one probe and no nested call.
    IF NEW.reservation_id IS NULL
       AND NOT EXISTS (SELECT 1 FROM tenant_quotas q WHERE q.tenant_id = NEW.tenant_id AND q.sku = NEW.sku) THEN
        RETURN NEW;
    END IF;
    IF NEW.reservation_id IS NOT NULL THEN
        SELECT * INTO r FROM capacity_reservations WHERE id = NEW.reservation_id FOR KEY SHARE;
        IF NOT FOUND OR r.tenant_id <> NEW.tenant_id OR r.sku <> NEW.sku THEN
            RAISE EXCEPTION 'capacity reservation % is not this tenant''s reservation of %', NEW.reservation_id, NEW.sku
                USING ERRCODE = 'check_violation', CONSTRAINT = 'allocation_reservation';
        END IF;
        IF r.status <> 'active' OR (r.ends_at IS NOT NULL AND r.ends_at <= now()) THEN
            RAISE EXCEPTION 'capacity reservation % has ended', NEW.reservation_id
                USING ERRCODE = 'check_violation', CONSTRAINT = 'allocation_reservation';
        END IF;
        PERFORM tenant_quota_enforce(NEW.tenant_id, NEW.sku, NEW.region, 0, 1);
    ELSE
        PERFORM tenant_quota_enforce(NEW.tenant_id, NEW.sku, NEW.region, NEW.gpus_total, 1);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER allocations_quota BEFORE INSERT ON allocations
    FOR EACH ROW EXECUTE FUNCTION allocations_quota_check();

CREATE FUNCTION capacity_reservations_quota_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tenant_quota_enforce(NEW.tenant_id, NEW.sku, NEW.region, NEW.gpus, 0);
    RETURN NEW;
END $$;
CREATE TRIGGER capacity_reservations_quota BEFORE INSERT ON capacity_reservations
    FOR EACH ROW EXECUTE FUNCTION capacity_reservations_quota_check();

-- A held slot is claimed only by an allocation inside its reservation. Every claim reserves its
-- slot (available -> reserved) in the claim's own statement (store.claimsInsertSQL), so the check
-- sits on that transition and reads the slot's claim, written just before in the statement. The
-- WHEN clause is false for every slot no reservation holds: the fleet's reservations run nothing.
-- Under READ COMMITTED the new row is the slot's latest version, so a hold committed while the
-- claim waited for the slot's lock is seen.
CREATE FUNCTION slots_reservation_hold() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM allocation_resource_claims c JOIN allocations a ON a.id = c.allocation_id
                   WHERE c.slot_id = NEW.id AND c.claim_kind = 'slot'
                     AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')
                     AND a.reservation_id = NEW.reservation_id) THEN
        RAISE EXCEPTION 'slot % is held by a capacity reservation: only an allocation inside it can take the slot', NEW.slot_index
            USING ERRCODE = 'exclusion_violation', CONSTRAINT = 'slot_reservation_hold';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER slots_reservation_hold BEFORE UPDATE OF status ON node_resource_slots
    FOR EACH ROW WHEN (NEW.reservation_id IS NOT NULL AND OLD.status IS DISTINCT FROM NEW.status AND NEW.status = 'reserved')
    EXECUTE FUNCTION slots_reservation_hold();

-- A reservation takes only available slots of its own node, while it is active, and none of a
-- node a baremetal allocation holds; a slot that changes hands between reservations goes
-- through no reservation (NULL) first. The node row is locked FOR KEY SHARE, as a slot claim
-- locks it (migration 001): a baremetal claim (FOR UPDATE) and a hold serialise and then see
-- each other.
CREATE FUNCTION slots_reservation_take() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r capacity_reservations%ROWTYPE;
BEGIN
    PERFORM 1 FROM nodes WHERE id = NEW.node_id FOR KEY SHARE;
    SELECT * INTO r FROM capacity_reservations WHERE id = NEW.reservation_id;
    IF NEW.status <> 'available' OR r.status <> 'active' OR r.node_id <> NEW.node_id
       OR (TG_OP = 'UPDATE' AND OLD.reservation_id IS NOT NULL)
       OR EXISTS (SELECT 1 FROM allocation_resource_claims c
                  WHERE c.node_id = NEW.node_id AND c.claim_kind = 'node_exclusive'
                    AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')) THEN
        RAISE EXCEPTION 'slot % cannot be held by capacity reservation %: a reservation takes available slots of its node only',
            NEW.slot_index, NEW.reservation_id
            USING ERRCODE = 'exclusion_violation', CONSTRAINT = 'slot_reservation_take';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER slots_reservation_take BEFORE UPDATE OF reservation_id ON node_resource_slots
    FOR EACH ROW WHEN (NEW.reservation_id IS NOT NULL AND OLD.reservation_id IS DISTINCT FROM NEW.reservation_id)
    EXECUTE FUNCTION slots_reservation_take();
CREATE TRIGGER slots_reservation_take_insert BEFORE INSERT ON node_resource_slots
    FOR EACH ROW WHEN (NEW.reservation_id IS NOT NULL)
    EXECUTE FUNCTION slots_reservation_take();

-- A baremetal allocation takes the whole node: none of its slots may be held. The trigger
-- fires for node_exclusive claims only, after claims_mutual_exclusion (triggers fire in name
-- order) has locked the node FOR UPDATE, so a concurrent hold has committed or waits.
CREATE FUNCTION claims_node_unheld() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM node_resource_slots s WHERE s.node_id = NEW.node_id AND s.reservation_id IS NOT NULL) THEN
        RAISE EXCEPTION 'node % has slots held by a capacity reservation', NEW.node_id
            USING ERRCODE = 'exclusion_violation', CONSTRAINT = 'claim_node_reservation_hold';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER claims_node_unheld BEFORE INSERT ON allocation_resource_claims
    FOR EACH ROW WHEN (NEW.claim_kind = 'node_exclusive')
    EXECUTE FUNCTION claims_node_unheld();

---- create above / drop below ----

DROP TRIGGER IF EXISTS claims_node_unheld ON allocation_resource_claims;
DROP FUNCTION IF EXISTS claims_node_unheld();

DROP TRIGGER IF EXISTS slots_reservation_take_insert ON node_resource_slots;
DROP TRIGGER IF EXISTS slots_reservation_take ON node_resource_slots;
DROP TRIGGER IF EXISTS slots_reservation_hold ON node_resource_slots;
DROP TRIGGER IF EXISTS capacity_reservations_quota ON capacity_reservations;
DROP TRIGGER IF EXISTS allocations_quota ON allocations;
DROP FUNCTION IF EXISTS slots_reservation_take(), slots_reservation_hold(), capacity_reservations_quota_check(),
    allocations_quota_check(), tenant_quota_enforce(uuid, text, text, integer, integer), tenant_quota_usage(uuid, text, text);
ALTER TABLE allocations DROP COLUMN IF EXISTS reservation_id;
DROP INDEX IF EXISTS node_resource_slots_reservation;
ALTER TABLE node_resource_slots DROP COLUMN IF EXISTS reservation_id;
DROP TABLE IF EXISTS capacity_reservations, tenant_quotas;
DROP FUNCTION IF EXISTS capacity_reservations_transition();
