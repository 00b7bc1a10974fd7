-- The wipe gate: a slot that has held a claim since its last verified wipe never returns to
-- sale, whatever the path (release cleanup, an operator's enable after disable, the admin
-- API, plain SQL). The database enforces it, not only the controller's code.
--
-- node_resource_slots.needs_wipe is set by the slot's own BEFORE UPDATE trigger when the slot
-- is reserved (no extra row update: the reservation's own row version carries it, and the
-- column is in no index, so a status change stays a HOT update). It is cleared only by a
-- verified proof row in slot_wipe_proofs recorded while the slot holds no claim, through that
-- table's trigger; a direct UPDATE that clears it is refused. A move into 'available' while
-- it is set is refused, with one exception: reserved -> available, a reservation given back
-- before its host was handed the plan (the dispatcher signs a provisioning task only once its
-- allocation is provisioning), which touched nothing; the slot was available, hence clean,
-- when it was reserved.
ALTER TABLE node_resource_slots ADD COLUMN needs_wipe boolean NOT NULL DEFAULT false;

-- Append-only record of the wipe proofs hosts sent, one row per slot and wipe. A verified row
-- names the node certificate (by serial, an enrolled credential of the slot's node) whose key
-- signed the proof; the controller checked the signature against it before the row was
-- written, and the row keeps the signed document, the signature and the certificate so
-- anyone can check it again.
CREATE TABLE slot_wipe_proofs (
    id              bigserial PRIMARY KEY,
    slot_id         uuid NOT NULL REFERENCES node_resource_slots(id),
    node_id         uuid NOT NULL REFERENCES nodes(id),
    allocation_id   uuid REFERENCES allocations(id),
    task_id         uuid,
    verified        boolean NOT NULL,
    method          text NOT NULL DEFAULT '',
    device_identity text NOT NULL DEFAULT '',
    finished_at     timestamptz,
    document        text NOT NULL DEFAULT '',   -- the signed bytes, exactly (jsonb would reorder them)
    signature       text NOT NULL DEFAULT '',
    signer_serial   text REFERENCES node_credentials(serial),
    signer_cert     text NOT NULL DEFAULT '',
    error           text NOT NULL DEFAULT '',
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT slot_wipe_proofs_signed CHECK (NOT verified OR (signature <> '' AND signer_serial IS NOT NULL AND method <> ''))
);
CREATE INDEX slot_wipe_proofs_slot ON slot_wipe_proofs (slot_id, id);
CREATE INDEX slot_wipe_proofs_allocation ON slot_wipe_proofs (allocation_id) WHERE allocation_id IS NOT NULL;

-- Existing slots: every slot that holds or held a claim and has no verified wipe since waits
-- for one (a disabled slot that was ever claimed counts unless its last wipe was verified).
UPDATE node_resource_slots s SET needs_wipe = true
WHERE s.status IN ('reserved', 'provisioning', 'active', 'releasing', 'cleanup', 'cleanup_blocked', 'failed')
   OR (s.status = 'disabled' AND coalesce(s.health_metadata->'last_wipe'->>'verified', '') <> 'true'
       AND EXISTS (SELECT 1 FROM allocation_resource_claims c WHERE c.slot_id = s.id));

CREATE FUNCTION slot_wipe_gate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.needs_wipe AND NOT NEW.needs_wipe AND pg_trigger_depth() < 2
       AND NOT (OLD.status = 'reserved' AND NEW.status = 'available') THEN
        RAISE EXCEPTION 'slot % needs a verified wipe; only a recorded wipe proof clears it', NEW.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'slot_wipe_gate';
    END IF;
    IF NEW.status IS DISTINCT FROM OLD.status THEN
        IF NEW.status = 'reserved' THEN
            NEW.needs_wipe := true;
        ELSIF NEW.status = 'available' AND OLD.status = 'reserved' THEN
            NEW.needs_wipe := false;
        ELSIF NEW.status = 'available' AND NEW.needs_wipe THEN
            RAISE EXCEPTION 'slot % has held a claim since its last verified wipe and cannot return to available', NEW.id
                USING ERRCODE = 'check_violation', CONSTRAINT = 'slot_wipe_gate';
        END IF;
    END IF;
    RETURN NEW;
END $$;
-- Fires only for the moves that set or check the flag (into reserved, into available) and for
-- a change of the flag itself: the other status updates of a reservation's life skip it.
CREATE TRIGGER slots_wipe_gate BEFORE UPDATE ON node_resource_slots
    FOR EACH ROW WHEN ((OLD.status IS DISTINCT FROM NEW.status AND NEW.status IN ('reserved', 'available'))
                       OR OLD.needs_wipe IS DISTINCT FROM NEW.needs_wipe)
    EXECUTE FUNCTION slot_wipe_gate();

-- A slot inserted as available has never been claimed; one inserted needing a wipe is not
-- for sale.
CREATE FUNCTION slot_wipe_gate_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'available' AND NEW.needs_wipe THEN
        RAISE EXCEPTION 'slot % needs a verified wipe and cannot be available', NEW.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'slot_wipe_gate';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER slots_wipe_gate_insert BEFORE INSERT ON node_resource_slots
    FOR EACH ROW WHEN (NEW.needs_wipe) EXECUTE FUNCTION slot_wipe_gate_insert();

-- A proof row is checked against its slot (same node, signer enrolled for that node) and, if
-- verified and the slot holds no claim, clears the slot's needs_wipe.
CREATE FUNCTION slot_wipe_proof_record() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    slot_node uuid;
    slot_status text;
BEGIN
    SELECT node_id, status INTO slot_node, slot_status FROM node_resource_slots WHERE id = NEW.slot_id FOR UPDATE;
    IF slot_node IS DISTINCT FROM NEW.node_id THEN
        RAISE EXCEPTION 'wipe proof for slot % comes from another node', NEW.slot_id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'slot_wipe_proofs_node';
    END IF;
    IF NEW.signer_serial IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM node_credentials WHERE serial = NEW.signer_serial AND node_id = NEW.node_id) THEN
        RAISE EXCEPTION 'wipe proof for slot % is signed by a certificate of another node', NEW.slot_id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'slot_wipe_proofs_signer';
    END IF;
    NEW.recorded_at := now();
    IF NEW.verified AND slot_status NOT IN ('reserved', 'provisioning', 'active', 'available') THEN
        UPDATE node_resource_slots SET needs_wipe = false WHERE id = NEW.slot_id AND needs_wipe;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER slot_wipe_proofs_record BEFORE INSERT ON slot_wipe_proofs
    FOR EACH ROW EXECUTE FUNCTION slot_wipe_proof_record();

CREATE FUNCTION slot_wipe_proofs_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'wipe proofs are append-only'
        USING ERRCODE = 'check_violation', CONSTRAINT = 'slot_wipe_proofs_append_only';
END $$;
CREATE TRIGGER slot_wipe_proofs_append_only BEFORE UPDATE OR DELETE ON slot_wipe_proofs
    FOR EACH ROW EXECUTE FUNCTION slot_wipe_proofs_append_only();

---- create above / drop below ----

DROP TRIGGER IF EXISTS slot_wipe_proofs_append_only ON slot_wipe_proofs;
DROP TRIGGER IF EXISTS slot_wipe_proofs_record ON slot_wipe_proofs;
DROP TRIGGER IF EXISTS slots_wipe_gate_insert ON node_resource_slots;
DROP TRIGGER IF EXISTS slots_wipe_gate ON node_resource_slots;
DROP FUNCTION IF EXISTS slot_wipe_proofs_append_only(), slot_wipe_proof_record(), slot_wipe_gate_insert(), slot_wipe_gate();
DROP TABLE IF EXISTS slot_wipe_proofs;
ALTER TABLE node_resource_slots DROP COLUMN IF EXISTS needs_wipe;
