-- The image gates in the database, where no path (a second replica, a script, plain SQL)
-- skips them.
--
-- Activation: an image becomes active only when a smoke test of its current digest passed
-- (migration 024's image_smoke_passed). Registering an image as active (no test can exist
-- yet), activating one, or giving an active image a new digest is refused otherwise, unless
-- the session allows untested images (the runtime parameter gpuaas.allow_untested_images =
-- 'on', which the controller sets on its connections only when started with
-- --allow-untested-images: test fixtures, never production). An image without a digest is
-- left to the table's own check (never active without one).
CREATE FUNCTION os_images_activation_gate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('gpuaas.allow_untested_images', true) IS NOT DISTINCT FROM 'on' THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'INSERT' OR NOT image_smoke_passed(NEW.id, NEW.digest_sha256) THEN
        RAISE EXCEPTION 'image % has no passed smoke test of its digest: register it pending, run gpuaasctl images test % --node NODE, then gpuaasctl images activate %', NEW.slug, NEW.slug, NEW.slug
            USING ERRCODE = 'check_violation', CONSTRAINT = 'image_activation_gate';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER os_images_activation_gate_insert BEFORE INSERT ON os_images
    FOR EACH ROW WHEN (NEW.active AND NEW.digest_sha256 IS NOT NULL)
    EXECUTE FUNCTION os_images_activation_gate();
CREATE TRIGGER os_images_activation_gate_update BEFORE UPDATE OF active, digest_sha256 ON os_images
    FOR EACH ROW WHEN (NEW.active AND NEW.digest_sha256 IS NOT NULL
                       AND (NOT OLD.active OR OLD.digest_sha256 IS DISTINCT FROM NEW.digest_sha256))
    EXECUTE FUNCTION os_images_activation_gate();

-- Retirement: a retired image boots no new allocation. The create transaction already
-- resolves only unretired images; this refuses the insert itself, so a retirement that
-- commits between a create's image lookup and its insert (or an insert from anywhere else)
-- cannot record a retired image. One primary-key probe of os_images per slice allocation
-- insert, the row the insert's foreign key check has just read; baremetal allocations (no
-- image) skip it in the WHEN clause.
CREATE FUNCTION allocations_refuse_retired_image() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    retired text;
BEGIN
    SELECT slug INTO retired FROM os_images WHERE id = NEW.os_image_id AND retired_at IS NOT NULL;
    IF FOUND THEN
        RAISE EXCEPTION 'image % is retired: no new allocation may boot it', retired
            USING ERRCODE = 'check_violation', CONSTRAINT = 'image_retired';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER allocations_refuse_retired_image BEFORE INSERT ON allocations
    FOR EACH ROW WHEN (NEW.os_image_id IS NOT NULL)
    EXECUTE FUNCTION allocations_refuse_retired_image();

-- The GPU check: after the boot, the host's performance probe runs nvidia-smi in the guest
-- and reports "gpu_check ok: ...", "gpu_check failed: ..." or, on a lab host whose GPUs are
-- emulated stand-ins, "gpu_check none: no GPU here ..." in that phase's detail (slicevm
-- gpuCheck). A smoke test whose check failed has not passed, whatever its allocation did.
CREATE FUNCTION image_smoke_gpu_check(alloc uuid) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT coalesce((
        SELECT CASE WHEN ph->>'detail' ~ 'gpu_check (ok|failed|none): '
                    THEN substring(ph->>'detail' from 'gpu_check ((?:ok|failed|none): .*)$')
                    ELSE 'not run (' || (ph->>'status') || coalesce(': ' || (ph->>'detail'), '') || ')' END
        FROM node_tasks k
        CROSS JOIN LATERAL jsonb_array_elements(CASE jsonb_typeof(k.phases) WHEN 'array' THEN k.phases ELSE '[]' END) ph
        WHERE k.allocation_id = alloc AND k.type = 'slice.vm_provision' AND ph->>'name' = 'performance_probe'
        ORDER BY k.created_at DESC LIMIT 1), '')
$$;
CREATE FUNCTION image_smoke_gpu_failed(alloc uuid) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT image_smoke_gpu_check(alloc) LIKE 'failed:%'
$$;
CREATE OR REPLACE FUNCTION image_smoke_passed(image uuid, digest text) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM image_smoke_tests t JOIN allocations a ON a.id = t.allocation_id
                   WHERE t.image_id = image AND t.digest_sha256 = digest AND a.active_at IS NOT NULL
                     AND NOT image_smoke_gpu_failed(t.allocation_id))
$$;

---- create above / drop below ----

CREATE OR REPLACE FUNCTION image_smoke_passed(image uuid, digest text) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM image_smoke_tests t JOIN allocations a ON a.id = t.allocation_id
                   WHERE t.image_id = image AND t.digest_sha256 = digest AND a.active_at IS NOT NULL)
$$;
DROP FUNCTION IF EXISTS image_smoke_gpu_failed(uuid);
DROP FUNCTION IF EXISTS image_smoke_gpu_check(uuid);
DROP TRIGGER IF EXISTS allocations_refuse_retired_image ON allocations;
DROP FUNCTION IF EXISTS allocations_refuse_retired_image();
DROP TRIGGER IF EXISTS os_images_activation_gate_update ON os_images;
DROP TRIGGER IF EXISTS os_images_activation_gate_insert ON os_images;
DROP FUNCTION IF EXISTS os_images_activation_gate();
