-- Task schema versions: which version of its type's payload a task carries
-- (internal/task/schema.go). A host is leased only the tasks it decodes, as its heartbeat
-- facts report them (agent_facts->'facts'->'task_schemas': {"type": [versions]}); a host
-- that reports none is a gpuaas-hostd 0.1.0, which decodes version 1 of the types it knew.
-- Other tasks stay queued for it (alloc show and nodes show say which release they need).
-- Expand-only: the column has a default, so controllers that predate it keep inserting
-- version 1 tasks and never read it; a constant default and no constraint keep the ALTER
-- instant on a large table (no rewrite, no scan).
ALTER TABLE node_tasks ADD COLUMN schema_version integer NOT NULL DEFAULT 1;

CREATE FUNCTION gpuaas_host_decodes(facts jsonb, task_type text, version integer) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN jsonb_typeof(facts->'facts'->'task_schemas') = 'object'
            THEN coalesce(facts->'facts'->'task_schemas'->task_type, '[]'::jsonb) @> to_jsonb(version)
        ELSE version = 1 AND task_type IN ('slice.topology_discover', 'slice.storage_transition', 'slice.vm_provision',
            'slice.vm_release', 'slice.reconcile', 'terminal.open', 'host.prereq_check', 'slot.wipe_verify')
    END
$$;

---- create above / drop below ----

DROP FUNCTION IF EXISTS gpuaas_host_decodes(jsonb, text, integer);
ALTER TABLE node_tasks DROP COLUMN IF EXISTS schema_version;
