-- An allocation records, at create, what the tenant asked for and was given: the resolved VM
-- profile, the image, the price, the usage basis and the SSH keys (about 1.1 KiB of the
-- allocation's 1.3 KiB row). None of it changes with the allocation's status, but every status
-- change rewrote it: the allocation's updates cannot be HOT (the live-by-node index has the
-- status in its predicate), and the status (7th column) and the status times (24th-26th)
-- span the snapshots, so each update logged the whole row again.
--
-- The record now lives in allocation_snapshots, one row per allocation, written by the same
-- statement as the allocation and never changed; a status change rewrites a row of about
-- 0.25 KiB. Allocations written before keep their own columns (no snapshot row); readers
-- take coalesce(snapshot row, allocation column). The usage basis is the one part a later
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
--   foreign key, checked at the end of the create statement that writes both).
-- - Snapshot rows are a record: no update or delete.

CREATE TABLE allocation_snapshots (
    allocation_id    uuid PRIMARY KEY REFERENCES allocations (id),
    resolved_profile jsonb NOT NULL DEFAULT '{}',
    image_snapshot   jsonb NOT NULL DEFAULT '{}',
    price_snapshot   jsonb NOT NULL,
    usage_snapshot   jsonb NOT NULL DEFAULT '{}',
    ssh_public_keys  text[] NOT NULL DEFAULT '{}'
);

INSERT INTO schema_switches (name, enabled)
    SELECT 'allocation_snapshots_apart', NOT EXISTS (SELECT 1 FROM nodes);

-- Whether new allocations leave their snapshot columns at their defaults (no controller of
-- the previous release reads them).
CREATE FUNCTION allocation_snapshots_apart() RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT enabled FROM schema_switches WHERE name = 'allocation_snapshots_apart'), false)
$$;

CREATE FUNCTION allocation_snapshots_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'an allocation''s snapshots are a record: they are never changed or removed'
        USING ERRCODE = 'check_violation', CONSTRAINT = 'allocation_snapshots_append_only';
END $$;
CREATE TRIGGER allocation_snapshots_append_only BEFORE UPDATE OR DELETE ON allocation_snapshots
    FOR EACH ROW EXECUTE FUNCTION allocation_snapshots_append_only();

-- A smoke test names the allocation that boots exactly this image and digest on its node
-- (migration 024), whichever row holds the allocation's image record.
CREATE OR REPLACE FUNCTION image_smoke_test_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM allocations a LEFT JOIN allocation_snapshots x ON x.allocation_id = a.id
                   WHERE a.id = NEW.allocation_id AND a.os_image_id = NEW.image_id AND a.node_id = NEW.node_id
                     AND coalesce(x.image_snapshot, a.image_snapshot)->>'digest_sha256' = NEW.digest_sha256) THEN
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
UPDATE allocations a SET resolved_profile = x.resolved_profile, image_snapshot = x.image_snapshot,
        price_snapshot = x.price_snapshot, ssh_public_keys = x.ssh_public_keys,
        usage_snapshot = CASE WHEN a.usage_snapshot = '{}' THEN x.usage_snapshot ELSE a.usage_snapshot END
    FROM allocation_snapshots x WHERE x.allocation_id = a.id AND a.price_snapshot = '{}';
DROP TABLE IF EXISTS allocation_snapshots;
DROP FUNCTION IF EXISTS allocation_snapshots_append_only(), allocation_snapshots_apart();
DELETE FROM schema_switches WHERE name = 'allocation_snapshots_apart';
