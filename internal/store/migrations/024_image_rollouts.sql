-- Default image pointers and canary rollouts. Each SKU may have a pointer naming the image
-- its new slices boot when the request names none. A rollout makes a new image the default
-- on a share of the SKU's nodes (chosen by a hash of rollout and node ids, so the same nodes
-- stay in it for the whole rollout) or on named regions first; promoting it moves the
-- pointer, rolling it back ends it (or, after a promotion, moves the pointer back).
-- Allocations keep the image they recorded at create (os_image_id, image_snapshot): nothing
-- here touches them.
--
-- The gate: an image becomes a SKU's default or canary only after a smoke test of its
-- current digest passed. A smoke test is a validation allocation that booted the image
-- through the normal provisioning path (digest check, disk write, boot, readiness); it
-- passed when that allocation reached active (active_at, which only the host's provisioning
-- result sets). The evidence is that allocation, so an API caller cannot forge it.
CREATE TABLE image_smoke_tests (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    image_id      uuid NOT NULL REFERENCES os_images(id),
    digest_sha256 text NOT NULL CHECK (digest_sha256 ~ '^[0-9a-f]{64}$'),
    allocation_id uuid NOT NULL UNIQUE REFERENCES allocations(id),
    node_id       uuid NOT NULL REFERENCES nodes(id),
    requested_by  text NOT NULL DEFAULT '',
    started_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX image_smoke_tests_image ON image_smoke_tests (image_id, started_at DESC);

-- A smoke test names the allocation that boots exactly this image and digest on its node.
CREATE FUNCTION image_smoke_test_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM allocations a WHERE a.id = NEW.allocation_id AND a.os_image_id = NEW.image_id
                   AND a.node_id = NEW.node_id AND a.image_snapshot->>'digest_sha256' = NEW.digest_sha256) THEN
        RAISE EXCEPTION 'a smoke test must name the allocation that boots its image'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'image_smoke_test_allocation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER image_smoke_tests_allocation BEFORE INSERT OR UPDATE ON image_smoke_tests
    FOR EACH ROW EXECUTE FUNCTION image_smoke_test_check();

-- image_smoke_passed: a smoke test of this image and digest reached active.
CREATE FUNCTION image_smoke_passed(image uuid, digest text) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM image_smoke_tests t JOIN allocations a ON a.id = t.allocation_id
                   WHERE t.image_id = image AND t.digest_sha256 = digest AND a.active_at IS NOT NULL)
$$;
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

-- A pointer or a canary names only an image that new slices of the SKU may boot (a vm_slice
-- image, active, not retired, with a digest) and whose smoke test of that digest passed.
CREATE FUNCTION image_pointer_target_check() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    img os_images%ROWTYPE;
BEGIN
    SELECT * INTO img FROM os_images WHERE id = NEW.image_id;
    IF img.target <> 'vm_slice' OR NOT img.active OR img.retired_at IS NOT NULL OR img.digest_sha256 IS NULL THEN
        RAISE EXCEPTION 'image % is not an active, digest-pinned vm_slice image', img.slug
            USING ERRCODE = 'check_violation', CONSTRAINT = 'image_pointer_target';
    END IF;
    IF NOT image_smoke_passed(img.id, img.digest_sha256) THEN
        RAISE EXCEPTION 'image % has no passed smoke test of its digest: run gpuaasctl images test % --node NODE first', img.slug, img.slug
            USING ERRCODE = 'check_violation', CONSTRAINT = 'image_smoke_gate';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER sku_image_pointers_target BEFORE INSERT OR UPDATE OF image_id ON sku_image_pointers
    FOR EACH ROW EXECUTE FUNCTION image_pointer_target_check();
CREATE TRIGGER image_rollouts_target BEFORE INSERT ON image_rollouts
    FOR EACH ROW EXECUTE FUNCTION image_pointer_target_check();

-- An image a pointer or a running canary names cannot be retired, deactivated or given
-- another digest (which its smoke test did not cover): move the pointer off it first.
-- (Allocations that recorded it keep it either way.)
CREATE FUNCTION image_retire_pointer_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM sku_image_pointers WHERE image_id = NEW.id)
       OR EXISTS (SELECT 1 FROM image_rollouts WHERE image_id = NEW.id AND status = 'canary') THEN
        RAISE EXCEPTION 'image % is a SKU''s default or canary image: promote or roll back first (or point the default elsewhere)', NEW.slug
            USING ERRCODE = 'check_violation', CONSTRAINT = 'image_in_rollout';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER os_images_retire_pointer BEFORE UPDATE ON os_images
    FOR EACH ROW WHEN ((OLD.active AND NOT NEW.active) OR (OLD.retired_at IS NULL AND NEW.retired_at IS NOT NULL)
                       OR OLD.digest_sha256 IS DISTINCT FROM NEW.digest_sha256)
    EXECUTE FUNCTION image_retire_pointer_check();

---- create above / drop below ----

DROP TRIGGER os_images_retire_pointer ON os_images;
DROP FUNCTION image_retire_pointer_check();
DROP TABLE sku_image_pointers;
DROP TABLE image_rollouts;
DROP FUNCTION image_pointer_target_check();
DROP FUNCTION image_smoke_passed(uuid, text);
DROP TABLE image_smoke_tests;
DROP FUNCTION image_smoke_test_check();
