-- Default image pointers and canary rollouts. Each SKU may have a pointer naming the image
-- its new slices boot when the request names none. A rollout makes a new image the default
-- on a share of the SKU's nodes (chosen by a hash of rollout and node ids, so the same nodes
-- stay in it for the whole rollout) or on named regions first; promoting it moves the
-- pointer, rolling it back ends it (or, after a promotion, moves the pointer back).
-- Allocations keep the image they recorded at create (os_image_id, image_snapshot): nothing
-- here touches them.
CREATE TABLE image_rollouts (
    id                uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    sku               text NOT NULL REFERENCES sku_catalog(sku),
    image_id          uuid NOT NULL REFERENCES os_images(id),
    previous_image_id uuid REFERENCES os_images(id),
    share_percent     integer NOT NULL CHECK (share_percent BETWEEN 0 AND 100),
    regions           text[] NOT NULL DEFAULT '{}',
    status            text NOT NULL DEFAULT 'canary' CHECK (status IN ('canary', 'promoted', 'rolled_back')),
    started_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz,
    CONSTRAINT image_rollouts_finished CHECK ((status = 'canary') = (finished_at IS NULL)),
    CONSTRAINT image_rollouts_new_image CHECK (image_id IS DISTINCT FROM previous_image_id)
);
-- One canary per SKU at a time.
CREATE UNIQUE INDEX image_rollouts_one_canary ON image_rollouts (sku) WHERE status = 'canary';
CREATE INDEX image_rollouts_sku ON image_rollouts (sku, started_at DESC);

CREATE TABLE sku_image_pointers (
    sku        text PRIMARY KEY REFERENCES sku_catalog(sku),
    image_id   uuid NOT NULL REFERENCES os_images(id),
    rollout_id uuid REFERENCES image_rollouts(id), -- the canary in progress
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- A pointer or a canary names only an image that new slices of the SKU may boot: a vm_slice
-- image, active, not retired, with a digest.
CREATE FUNCTION image_pointer_target_check() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    img os_images%ROWTYPE;
BEGIN
    SELECT * INTO img FROM os_images WHERE id = NEW.image_id;
    IF img.target <> 'vm_slice' OR NOT img.active OR img.retired_at IS NOT NULL OR img.digest_sha256 IS NULL THEN
        RAISE EXCEPTION 'image % is not an active, digest-pinned vm_slice image', img.slug
            USING ERRCODE = 'check_violation', CONSTRAINT = 'image_pointer_target';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER sku_image_pointers_target BEFORE INSERT OR UPDATE OF image_id ON sku_image_pointers
    FOR EACH ROW EXECUTE FUNCTION image_pointer_target_check();
CREATE TRIGGER image_rollouts_target BEFORE INSERT ON image_rollouts
    FOR EACH ROW EXECUTE FUNCTION image_pointer_target_check();

-- An image a pointer or a running canary names cannot be retired or deactivated: roll the
-- pointer off it first. (Allocations that recorded it keep it either way.)
CREATE FUNCTION image_retire_pointer_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM sku_image_pointers WHERE image_id = NEW.id)
       OR EXISTS (SELECT 1 FROM image_rollouts WHERE image_id = NEW.id AND status = 'canary') THEN
        RAISE EXCEPTION 'image % is a SKU''s default or canary image; promote or roll back first', NEW.slug
            USING ERRCODE = 'check_violation', CONSTRAINT = 'image_in_rollout';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER os_images_retire_pointer BEFORE UPDATE ON os_images
    FOR EACH ROW WHEN ((OLD.active AND NOT NEW.active) OR (OLD.retired_at IS NULL AND NEW.retired_at IS NOT NULL))
    EXECUTE FUNCTION image_retire_pointer_check();

---- create above / drop below ----

DROP TRIGGER os_images_retire_pointer ON os_images;
DROP FUNCTION image_retire_pointer_check();
DROP TABLE sku_image_pointers;
DROP TABLE image_rollouts;
DROP FUNCTION image_pointer_target_check();
