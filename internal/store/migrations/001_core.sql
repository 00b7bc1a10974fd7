-- Core inventory, allocation and audit schema (seed 001 "Proposed Data Model", seed 002).
-- Concurrency safety lives here: partial unique indexes make double booking impossible
-- even if application code errs, and triggers reject invalid state transitions.

CREATE TABLE tenants (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name        text NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_tokens (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name        text NOT NULL,
    token_hash  text NOT NULL UNIQUE CHECK (length(token_hash) = 64),
    role        text NOT NULL CHECK (role IN ('admin', 'tenant')),
    tenant_id   uuid REFERENCES tenants(id),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz,
    revoked_at  timestamptz,
    last_used_at timestamptz,
    CHECK ((role = 'tenant') = (tenant_id IS NOT NULL))
);

CREATE TABLE sku_catalog (
    sku                     text PRIMARY KEY CHECK (sku ~ '^[a-z0-9][a-z0-9.-]{0,62}$'),
    vendor                  text NOT NULL,
    display_name            text NOT NULL,
    accelerator_model       text NOT NULL DEFAULT '',
    capacity_shape          text NOT NULL CHECK (capacity_shape IN ('gpu_slice', 'baremetal')),
    gpus_total              integer NOT NULL CHECK (gpus_total > 0),
    allowed_gpu_counts      integer[] NOT NULL,
    gpu_hourly_price_minor  bigint NOT NULL CHECK (gpu_hourly_price_minor >= 0),
    currency                text NOT NULL DEFAULT 'USD',
    network_fabric          text NOT NULL DEFAULT 'none'
                            CHECK (network_fabric IN ('infiniband', 'roce', 'ethernet', 'none')),
    exclusive_node          boolean NOT NULL DEFAULT false,
    resource_profile        jsonb NOT NULL DEFAULT '{}',
    active                  boolean NOT NULL DEFAULT true,
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now(),
    CHECK (cardinality(allowed_gpu_counts) > 0),
    CHECK (0 < ALL (allowed_gpu_counts)),
    CHECK ((capacity_shape = 'baremetal') = exclusive_node)
);

CREATE TABLE nodes (
    id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name                text NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9][a-z0-9.-]{0,62}$'),
    status              text NOT NULL DEFAULT 'active'
                        CHECK (status IN ('pending', 'active', 'unavailable', 'retired')),
    draining            boolean NOT NULL DEFAULT false,
    region              text NOT NULL CHECK (region <> ''),
    tenant_id           uuid REFERENCES tenants(id),   -- tenant boundary: NULL = shared pool
    sku                 text REFERENCES sku_catalog(sku), -- baremetal product this node is sold as
    slice_sku           text REFERENCES sku_catalog(sku), -- slice product its approved slots sell
    profile_tags        text[] NOT NULL DEFAULT '{}',   -- MAAS profile intent (gpuaas-profile-*)
    hardware_tags       text[] NOT NULL DEFAULT '{}',
    firmware_profile    jsonb NOT NULL DEFAULT '{}',    -- readiness evidence
    agent_facts         jsonb NOT NULL DEFAULT '{}',
    last_heartbeat_at   timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE node_resource_slots (
    id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    node_id             uuid NOT NULL REFERENCES nodes(id),
    slot_index          integer NOT NULL CHECK (slot_index >= 0),
    capacity_shape      text NOT NULL DEFAULT 'gpu_slice'
                        CHECK (capacity_shape IN ('gpu_slice', 'gpu_partition', 'gpu_shared')),
    status              text NOT NULL DEFAULT 'available'
                        CHECK (status IN ('available', 'reserved', 'provisioning', 'active', 'releasing',
                                          'cleanup', 'cleanup_blocked', 'failed', 'disabled')),
    parent_slot_id      uuid REFERENCES node_resource_slots(id),
    sharing_model       text NOT NULL DEFAULT 'exclusive_device'
                        CHECK (sharing_model IN ('exclusive_device', 'mig_partition', 'mdev_vgpu',
                                                 'time_sliced', 'mps', 'software_shared')),
    profile_name        text NOT NULL DEFAULT '',
    gpu_model           text NOT NULL DEFAULT '',
    gpu_count           integer NOT NULL DEFAULT 1 CHECK (gpu_count >= 0),
    pci_address         text NOT NULL DEFAULT '',
    gpu_uuid            text NOT NULL DEFAULT '',
    mig_profile         text NOT NULL DEFAULT '',
    gpu_memory_mib      integer NOT NULL DEFAULT 0 CHECK (gpu_memory_mib >= 0),
    compute_milli       integer NOT NULL DEFAULT 1000 CHECK (compute_milli >= 0),
    max_claims          integer NOT NULL DEFAULT 1 CHECK (max_claims >= 1),
    nvme_device         text NOT NULL DEFAULT '',
    network_fabric      text NOT NULL DEFAULT 'none'
                        CHECK (network_fabric IN ('infiniband', 'roce', 'ethernet', 'none')),
    network_device      text NOT NULL DEFAULT '',
    fabric_pci_address  text NOT NULL DEFAULT '',
    fabric_device_id    text NOT NULL DEFAULT '',
    fabric_metadata     jsonb NOT NULL DEFAULT '{}',
    numa_node           integer CHECK (numa_node IS NULL OR numa_node >= 0),
    vcpu_count          integer CHECK (vcpu_count IS NULL OR vcpu_count > 0),
    memory_mib          integer CHECK (memory_mib IS NULL OR memory_mib > 0),
    mac_address         text NOT NULL DEFAULT '',
    private_ip          inet,
    capacity_metadata   jsonb NOT NULL DEFAULT '{}',
    health_metadata     jsonb NOT NULL DEFAULT '{}',
    status_reason       text NOT NULL DEFAULT '',
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    UNIQUE (node_id, slot_index)
);
CREATE INDEX node_resource_slots_available ON node_resource_slots (node_id, slot_index)
    WHERE status = 'available';

CREATE TABLE os_images (
    id                      uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    slug                    text NOT NULL UNIQUE CHECK (slug ~ '^[a-z0-9][a-z0-9._-]{0,94}$'),
    display_name            text NOT NULL,
    version                 text NOT NULL,
    target                  text NOT NULL CHECK (target IN ('baremetal', 'vm_slice')),
    family                  text NOT NULL CHECK (family IN ('ubuntu', 'rocky', 'debian', 'custom')),
    architecture            text NOT NULL CHECK (architecture IN ('amd64', 'arm64')),
    accelerator_vendor      text CHECK (accelerator_vendor IN ('nvidia', 'amd', 'any')),
    network_fabric          text CHECK (network_fabric IN ('infiniband', 'roce', 'ethernet', 'none', 'any')),
    image_format            text NOT NULL CHECK (image_format IN ('maas', 'qcow2', 'raw', 'oci')),
    source_type             text NOT NULL CHECK (source_type IN ('maas', 'platform_storage', 'oci_artifact', 'http')),
    source_ref              text NOT NULL CHECK (source_ref <> ''),
    digest_sha256           text CHECK (digest_sha256 ~ '^[0-9a-f]{64}$'),
    size_bytes              bigint CHECK (size_bytes IS NULL OR size_bytes > 0),
    cloud_init_supported    boolean NOT NULL DEFAULT true,
    guest_agent_supported   boolean NOT NULL DEFAULT false,
    default_username        text NOT NULL,
    driver_strategy         text NOT NULL CHECK (driver_strategy IN ('none', 'preinstalled_nvidia',
                                                                     'preinstalled_rocm', 'install_on_boot')),
    compatibility_metadata  jsonb NOT NULL DEFAULT '{}',
    is_default              boolean NOT NULL DEFAULT false,
    active                  boolean NOT NULL DEFAULT true,
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now(),
    retired_at              timestamptz,
    -- An image without a digest is a placeholder: it can never be active (never booted unverified).
    CHECK (NOT active OR digest_sha256 IS NOT NULL),
    CHECK (NOT (active AND retired_at IS NOT NULL))
);

CREATE TABLE allocations (
    id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id           uuid NOT NULL REFERENCES tenants(id),
    sku                 text NOT NULL REFERENCES sku_catalog(sku),
    capacity_shape      text NOT NULL CHECK (capacity_shape IN ('gpu_slice', 'baremetal')),
    gpus_total          integer NOT NULL CHECK (gpus_total > 0),
    region              text NOT NULL,
    status              text NOT NULL DEFAULT 'requested'
                        CHECK (status IN ('requested', 'provisioning', 'active', 'releasing', 'released', 'failed')),
    placement_status    text NOT NULL DEFAULT 'placed'
                        CHECK (placement_status IN ('placed', 'released')),
    node_id             uuid NOT NULL REFERENCES nodes(id),  -- compatibility read model; claims are the truth
    profile_name        text NOT NULL DEFAULT '',
    resolved_profile    jsonb NOT NULL DEFAULT '{}',
    os_image_id         uuid REFERENCES os_images(id),
    image_snapshot      jsonb NOT NULL DEFAULT '{}',
    price_snapshot      jsonb NOT NULL,
    usage_snapshot      jsonb NOT NULL DEFAULT '{}',
    ssh_public_keys     text[] NOT NULL DEFAULT '{}',
    idempotency_key     text,
    request_hash        text NOT NULL DEFAULT '',
    failure_reason      text NOT NULL DEFAULT '',
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    active_at           timestamptz,
    releasing_at        timestamptz,
    released_at         timestamptz,
    UNIQUE (tenant_id, idempotency_key)
);
CREATE INDEX allocations_tenant ON allocations (tenant_id, created_at DESC);
CREATE INDEX allocations_node ON allocations (node_id) WHERE status NOT IN ('released', 'failed');

CREATE TABLE allocation_resource_claims (
    id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    allocation_id       uuid NOT NULL REFERENCES allocations(id),
    node_id             uuid NOT NULL REFERENCES nodes(id),
    slot_id             uuid REFERENCES node_resource_slots(id),
    claim_kind          text NOT NULL CHECK (claim_kind IN ('slot', 'node_exclusive')),
    status              text NOT NULL DEFAULT 'reserved'
                        CHECK (status IN ('reserved', 'provisioning', 'active', 'releasing', 'released', 'failed')),
    fabric_vf_pci_address text NOT NULL DEFAULT '',
    resource_snapshot   jsonb NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    released_at         timestamptz,
    CHECK ((claim_kind = 'slot') = (slot_id IS NOT NULL)),
    CHECK ((status IN ('released', 'failed')) = (released_at IS NOT NULL))
);
CREATE INDEX claims_allocation ON allocation_resource_claims (allocation_id);
-- One live claim per slot, one live node_exclusive claim per node, one live claim per fabric VF on a node.
CREATE UNIQUE INDEX claims_one_live_per_slot ON allocation_resource_claims (slot_id)
    WHERE claim_kind = 'slot' AND status IN ('reserved', 'provisioning', 'active', 'releasing');
CREATE UNIQUE INDEX claims_one_live_exclusive_per_node ON allocation_resource_claims (node_id)
    WHERE claim_kind = 'node_exclusive' AND status IN ('reserved', 'provisioning', 'active', 'releasing');
CREATE UNIQUE INDEX claims_one_live_per_fabric_vf ON allocation_resource_claims (node_id, fabric_vf_pci_address)
    WHERE claim_kind = 'slot' AND fabric_vf_pci_address <> ''
      AND status IN ('reserved', 'provisioning', 'active', 'releasing');
CREATE INDEX claims_live_node ON allocation_resource_claims (node_id)
    WHERE status IN ('reserved', 'provisioning', 'active', 'releasing');

-- Baremetal and slice claims on one node exclude each other. Slot claims take KEY SHARE on the
-- node row (concurrent slice reservations do not block each other, nor heartbeat updates);
-- node_exclusive claims take FOR UPDATE, so the two kinds serialize and then see each other.
CREATE FUNCTION claims_mutual_exclusion() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.claim_kind = 'slot' THEN
        PERFORM 1 FROM nodes WHERE id = NEW.node_id FOR KEY SHARE;
        IF EXISTS (SELECT 1 FROM allocation_resource_claims c
                   WHERE c.node_id = NEW.node_id AND c.claim_kind = 'node_exclusive'
                     AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')) THEN
            RAISE EXCEPTION 'node % has a live node_exclusive claim', NEW.node_id
                USING ERRCODE = 'exclusion_violation';
        END IF;
        IF NOT EXISTS (SELECT 1 FROM node_resource_slots s
                       WHERE s.id = NEW.slot_id AND s.node_id = NEW.node_id) THEN
            RAISE EXCEPTION 'slot % is not on node %', NEW.slot_id, NEW.node_id
                USING ERRCODE = 'foreign_key_violation';
        END IF;
    ELSE
        PERFORM 1 FROM nodes WHERE id = NEW.node_id FOR UPDATE;
        IF EXISTS (SELECT 1 FROM allocation_resource_claims c
                   WHERE c.node_id = NEW.node_id AND c.claim_kind = 'slot'
                     AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')) THEN
            RAISE EXCEPTION 'node % has live slot claims', NEW.node_id
                USING ERRCODE = 'exclusion_violation';
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER claims_mutual_exclusion BEFORE INSERT ON allocation_resource_claims
    FOR EACH ROW EXECUTE FUNCTION claims_mutual_exclusion();

-- State machines enforced by the database as well as by code (internal/alloc).
CREATE TABLE slot_transitions (from_status text, to_status text, PRIMARY KEY (from_status, to_status));
INSERT INTO slot_transitions VALUES
    ('available', 'reserved'), ('available', 'disabled'), ('available', 'cleanup_blocked'),
    ('reserved', 'provisioning'), ('reserved', 'releasing'), ('reserved', 'available'),
    ('provisioning', 'active'), ('provisioning', 'releasing'), ('provisioning', 'failed'),
    ('active', 'releasing'),
    ('releasing', 'cleanup'), ('releasing', 'cleanup_blocked'),
    ('cleanup', 'available'), ('cleanup', 'cleanup_blocked'),
    ('cleanup_blocked', 'cleanup'), ('cleanup_blocked', 'disabled'),
    ('failed', 'cleanup'), ('failed', 'cleanup_blocked'), ('failed', 'disabled'),
    ('disabled', 'available');

CREATE TABLE allocation_transitions (from_status text, to_status text, PRIMARY KEY (from_status, to_status));
INSERT INTO allocation_transitions VALUES
    ('requested', 'provisioning'), ('requested', 'releasing'), ('requested', 'failed'),
    ('provisioning', 'active'), ('provisioning', 'releasing'), ('provisioning', 'failed'),
    ('active', 'releasing'), ('active', 'failed'),
    ('releasing', 'released'), ('releasing', 'failed'),
    ('failed', 'releasing');

CREATE FUNCTION check_status_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status THEN
        IF TG_TABLE_NAME = 'node_resource_slots' THEN
            IF NOT EXISTS (SELECT 1 FROM slot_transitions WHERE from_status = OLD.status AND to_status = NEW.status) THEN
                RAISE EXCEPTION 'invalid slot transition % -> %', OLD.status, NEW.status
                    USING ERRCODE = 'check_violation';
            END IF;
            -- A slot is reusable after cleanup only with wipe proof recorded for it.
            IF OLD.status = 'cleanup' AND NEW.status = 'available'
               AND coalesce(NEW.health_metadata->'last_wipe'->>'verified', '') <> 'true' THEN
                RAISE EXCEPTION 'slot % cannot return to available without verified wipe proof', NEW.id
                    USING ERRCODE = 'check_violation';
            END IF;
        ELSE
            IF NOT EXISTS (SELECT 1 FROM allocation_transitions WHERE from_status = OLD.status AND to_status = NEW.status) THEN
                RAISE EXCEPTION 'invalid allocation transition % -> %', OLD.status, NEW.status
                    USING ERRCODE = 'check_violation';
            END IF;
        END IF;
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END $$;
CREATE TRIGGER slots_transition BEFORE UPDATE ON node_resource_slots
    FOR EACH ROW EXECUTE FUNCTION check_status_transition();
CREATE TRIGGER allocations_transition BEFORE UPDATE ON allocations
    FOR EACH ROW EXECUTE FUNCTION check_status_transition();

CREATE TABLE outbox (
    id              bigserial PRIMARY KEY,
    topic           text NOT NULL,
    aggregate_id    uuid NOT NULL,
    node_id         uuid REFERENCES nodes(id),
    payload         jsonb NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    dispatched_at   timestamptz
);
CREATE INDEX outbox_pending ON outbox (id) WHERE dispatched_at IS NULL;

CREATE TABLE audit_log (
    id          bigserial PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    actor       text NOT NULL,
    actor_role  text NOT NULL,
    tenant_id   uuid,
    action      text NOT NULL,
    target_kind text NOT NULL,
    target_id   text NOT NULL DEFAULT '',
    request_id  text NOT NULL DEFAULT '',
    details     jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_log_at ON audit_log (at DESC);

---- create above / drop below ----

DROP TABLE IF EXISTS audit_log, outbox, allocation_resource_claims, allocations, os_images,
    node_resource_slots, nodes, sku_catalog, api_tokens, tenants, slot_transitions, allocation_transitions;
DROP FUNCTION IF EXISTS claims_mutual_exclusion(), check_status_transition();
