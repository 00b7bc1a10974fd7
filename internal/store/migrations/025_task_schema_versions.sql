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

-- The database itself refuses to lease a host what it does not decode, whichever controller
-- leases (a replica of the previous release, which knows nothing of schema versions, still
-- serves during a rolling upgrade): the row is left as it was (the trigger skips it), so
-- the task stays queued and the statement leases the others. Only tasks that some host
-- might not decode (a schema above 1, or a type a 0.1.0 host did not know) run the check;
-- every other lease pays for the WHEN test alone.
-- A controller that knows schema versions says so on its connections (the session parameter
-- gpuaas.task_schemas = on, set at connect); one that does not would sign a later schema as
-- version 1, which hosts refuse, so it leases version 1 tasks only.
CREATE FUNCTION node_tasks_lease_decodable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.schema_version > 1 AND current_setting('gpuaas.task_schemas', true) IS DISTINCT FROM 'on' THEN
        RETURN NULL;
    END IF;
    IF NOT gpuaas_host_decodes((SELECT agent_facts FROM nodes WHERE id = NEW.node_id), NEW.type, NEW.schema_version) THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER node_tasks_lease_decodable BEFORE UPDATE OF status ON node_tasks
    FOR EACH ROW WHEN (NEW.status = 'leased' AND (NEW.schema_version > 1 OR NEW.type NOT IN ('slice.topology_discover',
        'slice.storage_transition', 'slice.vm_provision', 'slice.vm_release', 'slice.reconcile', 'terminal.open',
        'host.prereq_check', 'slot.wipe_verify')))
    EXECUTE FUNCTION node_tasks_lease_decodable();

---- create above / drop below ----

DROP TRIGGER IF EXISTS node_tasks_lease_decodable ON node_tasks;
DROP FUNCTION IF EXISTS node_tasks_lease_decodable();
DROP FUNCTION IF EXISTS gpuaas_host_decodes(jsonb, text, integer);
ALTER TABLE node_tasks DROP COLUMN IF EXISTS schema_version;
