-- Webhooks: a tenant's HTTPS endpoint receives its events, signed (HMAC-SHA256 with the
-- webhook's secret). Everything the delivery needs is here, so deliveries survive controller
-- restarts and any replica may make an attempt: each webhook's fan-out cursor (the last event
-- turned into a delivery, in the event log's order), one delivery per event (unique), each
-- attempt recorded, and a delivery either delivered or, after its bounded retry time, dead.
CREATE TABLE webhooks (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id       uuid NOT NULL REFERENCES tenants(id),
    url             text NOT NULL CHECK (url ~ '^https://[^[:space:]]+$' AND length(url) <= 2048),
    -- The HMAC key. It has to be usable by every replica, so unlike tokens it cannot be
    -- stored as a hash; the API shows it once, at creation.
    secret          text NOT NULL CHECK (length(secret) >= 32),
    cursor_xid      xid8 NOT NULL DEFAULT '0',
    cursor_id       bigint NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    deleted_at      timestamptz
);
CREATE INDEX webhooks_tenant ON webhooks (tenant_id, created_at) WHERE deleted_at IS NULL;

CREATE TABLE webhook_deliveries (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    webhook_id      uuid NOT NULL REFERENCES webhooks(id),
    event_id        bigint NOT NULL REFERENCES events(id),
    status          text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'dead')),
    attempts        integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    UNIQUE (webhook_id, event_id),
    CHECK ((status = 'pending') = (finished_at IS NULL))
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_webhook ON webhook_deliveries (webhook_id, created_at DESC);

CREATE TABLE webhook_attempts (
    delivery_id     uuid NOT NULL REFERENCES webhook_deliveries(id),
    attempt         integer NOT NULL CHECK (attempt >= 1),
    at              timestamptz NOT NULL DEFAULT now(),
    status_code     integer,
    error           text NOT NULL DEFAULT '',
    duration_ms     bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (delivery_id, attempt)
);

---- create above / drop below ----

DROP TABLE IF EXISTS webhook_attempts;
DROP TABLE IF EXISTS webhook_deliveries;
DROP TABLE IF EXISTS webhooks;
