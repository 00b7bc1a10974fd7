-- The demand mix placement's look-ahead protects (internal/demand, docs/scheduling.md,
-- "Demand mix"): what the controller has learned tenants ask for, per SKU and region, and
-- what an admin pinned per SKU.
--
-- demand_requests holds exponentially decayed request counts: requests is the count as of
-- as_of, each request weighing 2^(-age / half-life). No create transaction writes here: each
-- replica counts requests in memory and adds them every few seconds with one upsert that
-- decays the stored count to the later of the two times and adds the other side decayed to
-- it (demand_decay), so any number of replicas' flushes, in any order, add up to the same
-- decayed total. Rows are few (SKUs x regions x GPU counts); region '' is requests that
-- named none.
CREATE TABLE demand_requests (
    sku       text NOT NULL CHECK (sku <> ''),
    region    text NOT NULL DEFAULT '',
    gpus      integer NOT NULL CHECK (gpus > 0),
    requests  double precision NOT NULL CHECK (requests >= 0 AND requests < 'Infinity'),
    as_of     timestamptz NOT NULL,
    PRIMARY KEY (sku, region, gpus)
);

-- demand_decay is weight 2^(-elapsed / half_life) of a count elapsed seconds old; past 64
-- half-lives it is 0 (power() would otherwise underflow into an error).
CREATE FUNCTION demand_decay(elapsed double precision, half_life double precision) RETURNS double precision
    LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN elapsed <= 0 THEN 1.0
                WHEN elapsed / half_life > 64 THEN 0.0
                ELSE power(0.5, elapsed / half_life) END
$$;

-- demand_mix_pins is an admin's pinned mix for a SKU: one row per GPU count with its relative
-- share. A pinned SKU's look-ahead uses it, whatever was learned. Each count must be one the
-- SKU sells (checked here, and again when the SKU's counts change).
CREATE TABLE demand_mix_pins (
    sku        text NOT NULL REFERENCES sku_catalog (sku),
    gpus       integer NOT NULL CHECK (gpus > 0),
    weight     integer NOT NULL CHECK (weight BETWEEN 1 AND 1048576),
    pinned_by  text NOT NULL DEFAULT '',
    pinned_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sku, gpus)
);

CREATE FUNCTION demand_mix_pin_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM sku_catalog s WHERE s.sku = NEW.sku AND NEW.gpus = ANY (s.allowed_gpu_counts)
                   AND s.capacity_shape = 'gpu_slice') THEN
        RAISE EXCEPTION 'a pinned demand mix names only GPU counts its slice SKU sells'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'demand_mix_pin_count';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER demand_mix_pins_count BEFORE INSERT OR UPDATE ON demand_mix_pins
    FOR EACH ROW EXECUTE FUNCTION demand_mix_pin_check();

-- A SKU that stops selling a count loses that count's pinned share (the rest of the pin stays).
CREATE FUNCTION demand_mix_pin_counts_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM demand_mix_pins p WHERE p.sku = NEW.sku AND NOT (p.gpus = ANY (NEW.allowed_gpu_counts));
    RETURN NEW;
END $$;
CREATE TRIGGER sku_catalog_demand_mix_pins AFTER UPDATE OF allowed_gpu_counts ON sku_catalog
    FOR EACH ROW WHEN (OLD.allowed_gpu_counts IS DISTINCT FROM NEW.allowed_gpu_counts)
    EXECUTE FUNCTION demand_mix_pin_counts_changed();

---- create above / drop below ----

DROP TRIGGER IF EXISTS sku_catalog_demand_mix_pins ON sku_catalog;
DROP FUNCTION IF EXISTS demand_mix_pin_counts_changed();
DROP TRIGGER IF EXISTS demand_mix_pins_count ON demand_mix_pins;
DROP FUNCTION IF EXISTS demand_mix_pin_check();
DROP TABLE IF EXISTS demand_mix_pins;
DROP FUNCTION IF EXISTS demand_decay(double precision, double precision);
DROP TABLE IF EXISTS demand_requests;
