-- Host agents: bootstrap tokens, enrolled identities, and leased node tasks (issue 3).

CREATE TABLE node_bootstrap_tokens (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    node_id     uuid NOT NULL REFERENCES nodes(id),
    token_hash  text NOT NULL UNIQUE CHECK (length(token_hash) = 64),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    used_at     timestamptz
);
CREATE INDEX node_bootstrap_tokens_node ON node_bootstrap_tokens (node_id);

CREATE TABLE node_credentials (
    serial      text PRIMARY KEY,
    node_id     uuid NOT NULL REFERENCES nodes(id),
    not_after   timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
CREATE INDEX node_credentials_node ON node_credentials (node_id);

CREATE TABLE node_tasks (
    id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    node_id             uuid NOT NULL REFERENCES nodes(id),
    allocation_id       uuid REFERENCES allocations(id),
    type                text NOT NULL,
    payload             jsonb NOT NULL,
    status              text NOT NULL DEFAULT 'queued'
                        CHECK (status IN ('queued', 'leased', 'succeeded', 'failed', 'refused', 'expired')),
    attempt             integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts        integer NOT NULL DEFAULT 3 CHECK (max_attempts >= 1),
    not_after           timestamptz NOT NULL,
    lease_expires_at    timestamptz,
    output              jsonb,
    phases              jsonb NOT NULL DEFAULT '[]',
    error               text NOT NULL DEFAULT '',
    outbox_id           bigint UNIQUE REFERENCES outbox(id),
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    completed_at        timestamptz,
    CHECK ((status = 'leased') = (lease_expires_at IS NOT NULL))
);
CREATE INDEX node_tasks_runnable ON node_tasks (node_id, created_at) WHERE status IN ('queued', 'leased');
CREATE INDEX node_tasks_allocation ON node_tasks (allocation_id);

---- create above / drop below ----

DROP TABLE IF EXISTS node_tasks, node_credentials, node_bootstrap_tokens;
