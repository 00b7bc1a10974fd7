-- A burn-in validation boots a VM from the slot's own disk and wipes it again, so whatever
-- image was staged on that disk (migration 028) is gone: recording the run ends the slot's
-- staging record in the same transaction, whatever path records it. A quick validation
-- leaves the disk alone and the record with it.
CREATE FUNCTION slot_validation_ends_staging() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE node_resource_slots
       SET staged_image_id = NULL, staged_digest_sha256 = NULL, staged_at = NULL, staged_after_proof = NULL
     WHERE id = NEW.slot_id AND staged_digest_sha256 IS NOT NULL;
    RETURN NULL;
END $$;
CREATE TRIGGER slot_validations_end_staging AFTER INSERT ON slot_validations
    FOR EACH ROW WHEN (NEW.level = 'burn-in' AND NEW.slot_id IS NOT NULL)
    EXECUTE FUNCTION slot_validation_ends_staging();

---- create above / drop below ----

DROP TRIGGER IF EXISTS slot_validations_end_staging ON slot_validations;
DROP FUNCTION IF EXISTS slot_validation_ends_staging();
