-- SSH-relay terminal sessions (issue 7): who opened which allocation's terminal, single-use
-- short-lived tokens (hashed) for both ends, and what happened.
CREATE TABLE terminal_sessions (
    id                 uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    allocation_id      uuid NOT NULL REFERENCES allocations(id),
    tenant_id          uuid NOT NULL REFERENCES tenants(id),
    node_id            uuid NOT NULL REFERENCES nodes(id),
    actor              text NOT NULL,
    actor_role         text NOT NULL CHECK (actor_role IN ('admin', 'tenant')),
    token_id           text NOT NULL DEFAULT '',
    mode               text NOT NULL CHECK (mode IN ('terminal', 'stdio', 'console')),
    command            text NOT NULL DEFAULT '',
    status             text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'open', 'ended')),
    client_token_hash  text NOT NULL CHECK (length(client_token_hash) = 64),
    host_token_hash    text NOT NULL CHECK (length(host_token_hash) = 64),
    expires_at         timestamptz NOT NULL,
    client_used_at     timestamptz,
    host_used_at       timestamptz,
    task_id            uuid,
    created_at         timestamptz NOT NULL DEFAULT now(),
    started_at         timestamptz,
    ended_at           timestamptz,
    bytes_in           bigint NOT NULL DEFAULT 0,
    bytes_out          bigint NOT NULL DEFAULT 0,
    exit_status        int,
    end_reason         text NOT NULL DEFAULT '',
    recording          text NOT NULL DEFAULT ''
);
CREATE INDEX terminal_sessions_tenant ON terminal_sessions (tenant_id, created_at DESC);
CREATE INDEX terminal_sessions_live ON terminal_sessions (tenant_id) WHERE status <> 'ended';
CREATE INDEX terminal_sessions_alloc ON terminal_sessions (allocation_id) WHERE status <> 'ended';

---- create above / drop below ----

DROP TABLE IF EXISTS terminal_sessions;
