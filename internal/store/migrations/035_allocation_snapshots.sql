-- An allocation records, at create, what the tenant asked for and was given: the resolved VM
-- profile, the image, the price, the usage basis and the SSH keys (most of the allocation's
-- 1.3-1.7 KiB row). None of it changes with the allocation's status, but every status
-- change rewrote it: the allocation's updates cannot be HOT (the live-by-node index has the
-- status in its predicate), and the status (7th column) and the status times (22nd-24th)
-- span the snapshots, so each update logged the whole row again.
--
-- The record now lives apart from the allocation's row, written by the same statement as the
-- allocation and never changed; a status change rewrites a row of about 0.3 KiB:
-- - allocation_terms holds a resolved profile, image and price once per distinct content (every
--   allocation of one SKU, profile and image has the same: about 1 KiB), found by the digest
--   of the three;
-- - allocation_snapshots holds, one row per allocation, its terms and what is its own: the
--   usage basis (its node and slots) and the SSH keys.
-- Allocations written before keep their own columns (no snapshot row); readers take
-- coalesce(terms or snapshot row, allocation column). The usage basis is the one part a later
-- write changes: a re-placement writes the new node's into allocations.usage_snapshot, and
-- readers take that column whenever it is not '{}'.
--
-- A controller of the previous release reads only the allocation's columns, so while one may
-- run (a rolling upgrade) new allocations keep them filled as well:
-- schema_switches.allocation_snapshots_apart says when they stop. It starts on for a
-- database that has no node yet and off for one upgraded in service; an operator turns it on
-- once every controller runs this release (docs/upgrades.md), and the next release's
-- migration will.
--
-- Held in the database:
-- - One snapshot row per allocation (its primary key), of an allocation that exists (a
--   foreign key, checked at the end of the create statement that writes both), naming terms
--   that exist.
-- - One terms row per content: allocation_terms_id finds or writes it (a unique digest; a
--   create that finds another's row in flight waits for it to commit and then uses it).
-- - Terms and snapshot rows are a record: no update or delete.

CREATE TABLE allocation_terms (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    digest           bytea NOT NULL UNIQUE,
    resolved_profile jsonb NOT NULL,
    image_snapshot   jsonb NOT NULL,
    price_snapshot   jsonb NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE allocation_snapshots (
    allocation_id    uuid PRIMARY KEY REFERENCES allocations (id),
    terms_id         bigint NOT NULL REFERENCES allocation_terms (id),
    usage_snapshot   jsonb NOT NULL DEFAULT '{}',
    ssh_public_keys  text[] NOT NULL DEFAULT '{}'
);

INSERT INTO schema_switches (name, enabled)
    SELECT 'allocation_snapshots_apart', NOT EXISTS (SELECT 1 FROM nodes);

-- Whether new allocations leave their snapshot columns at their defaults (no controller of
-- the previous release reads them). The create's statement reads the row itself: a SQL
-- function whose body holds a subquery is not inlined, and each call plans it again.
CREATE FUNCTION allocation_snapshots_apart() RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT enabled FROM schema_switches WHERE name = 'allocation_snapshots_apart'), false)
$$;

-- The digest that finds a content's terms row (an expression, inlined where it is used).
CREATE FUNCTION allocation_terms_digest(profile jsonb, image jsonb, price jsonb) RETURNS bytea LANGUAGE sql STABLE AS $$
    SELECT sha256(convert_to(profile::text || E'\n' || image::text || E'\n' || price::text, 'UTF8'))
$$;

-- The terms row of this content: the existing one, or a new one. Each statement reads a fresh
-- snapshot (read committed), so a row another create committed while this one waited on its
-- digest is found by the second look. The create's statement looks the digest up itself
-- first and calls this only for terms it does not find.
CREATE FUNCTION allocation_terms_id(profile jsonb, image jsonb, price jsonb) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    d bytea := allocation_terms_digest(profile, image, price);
    found_id bigint;
BEGIN
    SELECT id INTO found_id FROM allocation_terms WHERE digest = d;
    IF found_id IS NULL THEN
        INSERT INTO allocation_terms (digest, resolved_profile, image_snapshot, price_snapshot)
            VALUES (d, profile, image, price) ON CONFLICT (digest) DO NOTHING RETURNING id INTO found_id;
    END IF;
    IF found_id IS NULL THEN
        SELECT id INTO found_id FROM allocation_terms WHERE digest = d;
    END IF;
    RETURN found_id;
END $$;

CREATE FUNCTION allocation_snapshots_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'an allocation''s snapshots are a record: they are never changed or removed'
        USING ERRCODE = 'check_violation', CONSTRAINT = 'allocation_snapshots_append_only';
END $$;
CREATE TRIGGER allocation_snapshots_append_only BEFORE UPDATE OR DELETE ON allocation_snapshots
    FOR EACH ROW EXECUTE FUNCTION allocation_snapshots_append_only();
CREATE TRIGGER allocation_terms_append_only BEFORE UPDATE OR DELETE ON allocation_terms
    FOR EACH ROW EXECUTE FUNCTION allocation_snapshots_append_only();

-- A smoke test names the allocation that boots exactly this image and digest on its node
-- (migration 024), whichever row holds the allocation's image record.
CREATE OR REPLACE FUNCTION image_smoke_test_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM allocations a LEFT JOIN allocation_snapshots x ON x.allocation_id = a.id
                   LEFT JOIN allocation_terms t ON t.id = x.terms_id
                   WHERE a.id = NEW.allocation_id AND a.os_image_id = NEW.image_id AND a.node_id = NEW.node_id
                     AND coalesce(t.image_snapshot, a.image_snapshot)->>'digest_sha256' = NEW.digest_sha256) THEN
        RAISE EXCEPTION 'a smoke test must name the allocation that boots its image'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'image_smoke_test_allocation';
    END IF;
    RETURN NEW;
END $$;

---- create above / drop below ----
CREATE OR REPLACE FUNCTION image_smoke_test_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM allocations a WHERE a.id = NEW.allocation_id AND a.os_image_id = NEW.image_id
                   AND a.node_id = NEW.node_id AND a.image_snapshot->>'digest_sha256' = NEW.digest_sha256) THEN
        RAISE EXCEPTION 'a smoke test must name the allocation that boots its image'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'image_smoke_test_allocation';
    END IF;
    RETURN NEW;
END $$;
-- Allocations written apart get their record back in their own columns.
UPDATE allocations a SET resolved_profile = t.resolved_profile, image_snapshot = t.image_snapshot,
        price_snapshot = t.price_snapshot, ssh_public_keys = x.ssh_public_keys,
        usage_snapshot = CASE WHEN a.usage_snapshot = '{}' THEN x.usage_snapshot ELSE a.usage_snapshot END
    FROM allocation_snapshots x JOIN allocation_terms t ON t.id = x.terms_id
    WHERE x.allocation_id = a.id AND a.price_snapshot = '{}';
DROP TABLE IF EXISTS allocation_snapshots;
DROP TABLE IF EXISTS allocation_terms;
DROP FUNCTION IF EXISTS allocation_snapshots_append_only(), allocation_snapshots_apart(),
    allocation_terms_id(jsonb, jsonb, jsonb), allocation_terms_digest(jsonb, jsonb, jsonb);
DELETE FROM schema_switches WHERE name = 'allocation_snapshots_apart';
