-- Time-ordered ids (UUIDv7) for the rows every allocation writes (issue 9). These ids were
-- random (gen_random_uuid, uuid.New): every insert, and every non-HOT update (a status change
-- moves a row out of the live-only partial indexes, so it is never HOT), added an entry at a
-- random leaf of the primary key, and of claims_allocation and node_tasks_allocation, which
-- are keyed by the allocation id. As the history grew, more of those leaves were touched
-- once per checkpoint cycle, each time writing a full-page image to the WAL and pulling a cold
-- page into shared_buffers. With a millisecond timestamp in front, new entries land on the
-- few rightmost leaves. The ids stay unguessable in practice (74 random bits) and reveal only
-- the creation time, which their rows show anyway. PostgreSQL 18 has uuidv7(); this works on
-- 13 and later.
CREATE FUNCTION gpuaas_uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$$;

ALTER TABLE allocations ALTER COLUMN id SET DEFAULT gpuaas_uuid_v7();
ALTER TABLE allocation_resource_claims ALTER COLUMN id SET DEFAULT gpuaas_uuid_v7();
ALTER TABLE node_tasks ALTER COLUMN id SET DEFAULT gpuaas_uuid_v7();

---- create above / drop below ----

ALTER TABLE allocations ALTER COLUMN id SET DEFAULT gen_random_uuid();
ALTER TABLE allocation_resource_claims ALTER COLUMN id SET DEFAULT gen_random_uuid();
ALTER TABLE node_tasks ALTER COLUMN id SET DEFAULT gen_random_uuid();
DROP FUNCTION IF EXISTS gpuaas_uuid_v7();
