-- Warm slots: a SKU may ask its hosts to pre-write its default image onto idle slots' disks
-- (sku_catalog.warm_slots, off by default). After a slot's disk is wiped, its verified wipe
-- proof recorded and the slot back on sale (validated, when its SKU asks for that), the
-- controller queues slot.image_stage; the host writes the image onto the disk and the result
-- is recorded here: which image and digest, when, and after which wipe proof. A provision of
-- that image on that disk then skips the disk write (the host decides from its own record
-- of what it wrote; this one is what the operator and the tenant's timings are told).
--
-- The staged columns are in no index, so a slot's status change stays a HOT update
-- (migrations 012, 014); clearing them rides on the status update's own row version.
ALTER TABLE sku_catalog ADD COLUMN warm_slots boolean NOT NULL DEFAULT false;
ALTER TABLE node_resource_slots ADD COLUMN staged_image_id uuid;
ALTER TABLE node_resource_slots ADD COLUMN staged_digest_sha256 text
    CONSTRAINT node_resource_slots_staged_digest CHECK (staged_digest_sha256 ~ '^[0-9a-f]{64}$');
ALTER TABLE node_resource_slots ADD COLUMN staged_at timestamptz;
ALTER TABLE node_resource_slots ADD COLUMN staged_after_proof bigint;
ALTER TABLE node_resource_slots ADD CONSTRAINT node_resource_slots_staged_whole
    CHECK ((staged_digest_sha256 IS NULL) = (staged_image_id IS NULL)
       AND (staged_digest_sha256 IS NULL) = (staged_at IS NULL)
       AND (staged_digest_sha256 IS NULL) = (staged_after_proof IS NULL));

-- A staging is recorded only on an idle slot whose disk was proven clean since its last
-- claim: available, healthy, no wipe owed (migration 015), and naming its latest verified
-- wipe proof; the image must exist with that digest and not be retired.
CREATE FUNCTION slots_staging_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status <> 'available' OR NEW.needs_wipe OR NEW.health <> 'healthy' THEN
        RAISE EXCEPTION 'slot % is % (health %, wipe owed %): an image is staged only on an idle slot proven clean', NEW.id, NEW.status, NEW.health, NEW.needs_wipe
            USING ERRCODE = 'check_violation', CONSTRAINT = 'slot_staging_gate';
    END IF;
    IF NEW.staged_after_proof IS DISTINCT FROM (SELECT max(p.id) FROM slot_wipe_proofs p WHERE p.slot_id = NEW.id AND p.verified) THEN
        RAISE EXCEPTION 'slot %: a staging must follow the slot''s latest verified wipe proof', NEW.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'slot_staging_gate';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM os_images i WHERE i.id = NEW.staged_image_id AND i.digest_sha256 = NEW.staged_digest_sha256
                   AND i.retired_at IS NULL) THEN
        RAISE EXCEPTION 'slot %: the staged image is unknown, retired or has another digest', NEW.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'slot_staging_gate';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER slots_staging_check BEFORE UPDATE OF staged_image_id, staged_digest_sha256, staged_after_proof ON node_resource_slots
    FOR EACH ROW WHEN (NEW.staged_digest_sha256 IS NOT NULL)
    EXECUTE FUNCTION slots_staging_check();

-- Any status change of a staged slot (a reservation, a disable) ends the record: from then
-- on the disk is a tenant's or an operator's, and the next release wipes it. The WHEN clause
-- keeps every slot without a staged image free of the call.
CREATE FUNCTION slots_staging_clear() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.staged_image_id := NULL;
    NEW.staged_digest_sha256 := NULL;
    NEW.staged_at := NULL;
    NEW.staged_after_proof := NULL;
    RETURN NEW;
END $$;
CREATE TRIGGER slots_staging_clear BEFORE UPDATE OF status ON node_resource_slots
    FOR EACH ROW WHEN (OLD.staged_digest_sha256 IS NOT NULL AND NEW.status IS DISTINCT FROM OLD.status)
    EXECUTE FUNCTION slots_staging_clear();

---- create above / drop below ----

DROP TRIGGER IF EXISTS slots_staging_clear ON node_resource_slots;
DROP FUNCTION IF EXISTS slots_staging_clear();
DROP TRIGGER IF EXISTS slots_staging_check ON node_resource_slots;
DROP FUNCTION IF EXISTS slots_staging_check();
ALTER TABLE node_resource_slots DROP CONSTRAINT IF EXISTS node_resource_slots_staged_whole;
