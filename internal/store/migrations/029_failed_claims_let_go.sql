-- A failed allocation's claims stay 'failed' and keep naming their slots, so that the
-- allocation's cleanup or release wipes what it may have written. Once the slot is back on
-- sale (available, by whichever path: the failed allocation's cleanup or release with wipe
-- proof, an operator's repair wipe, or enable after a repair of a disabled slot), the failed
-- claim has nothing left to hold: it becomes 'released' in the same transaction. Without this, a
-- later release of the failed allocation planned a wipe of the slot and moved it to
-- releasing while the next tenant's allocation held it.
CREATE INDEX claims_failed_slot ON allocation_resource_claims (slot_id) WHERE status = 'failed';

CREATE FUNCTION slot_back_on_sale_releases_failed_claims() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE allocation_resource_claims SET status = 'released'
     WHERE slot_id = NEW.id AND status = 'failed';
    RETURN NULL;
END $$;
CREATE TRIGGER slots_back_on_sale AFTER UPDATE OF status ON node_resource_slots
    FOR EACH ROW WHEN (NEW.status = 'available' AND OLD.status <> 'available')
    EXECUTE FUNCTION slot_back_on_sale_releases_failed_claims();

-- Claims of slots already back on sale (or held by another allocation) let go now.
UPDATE allocation_resource_claims c SET status = 'released'
  FROM node_resource_slots s
 WHERE c.slot_id = s.id AND c.status = 'failed'
   AND (s.status = 'available'
        OR EXISTS (SELECT 1 FROM allocation_resource_claims l
                    WHERE l.slot_id = c.slot_id AND l.created_at > c.created_at
                      AND l.status IN ('reserved', 'provisioning', 'active', 'releasing')));

---- create above / drop below ----

DROP TRIGGER IF EXISTS slots_back_on_sale ON node_resource_slots;
DROP FUNCTION IF EXISTS slot_back_on_sale_releases_failed_claims();
DROP INDEX IF EXISTS claims_failed_slot;
