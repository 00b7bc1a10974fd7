-- Every device identity belongs to one slot. Two enabled slots (status <> 'disabled') naming
-- the same device would let two tenants share it, so the database refuses:
--   within a node: a PCI function passed through (a GPU's pci_address or the fabric VF in
--     capacity_metadata.fabric_vf_pci_address: one namespace, a function named as the GPU of
--     one slot and the VF of another is still one device), an NVMe device (nvme_device, the
--     /dev/disk/by-id name, compared as written except that a partition's name, -partN, is its
--     disk's: udev names no other alias the database could see), and a private IP (each host's slices live on
--     that host's own slice bridge, 10.100.0.0/24 by default, so the network is the node);
--   in the whole fleet: a MAC address, compared case-insensitively without separators.
-- The parent fabric device (fabric_pci_address) is shared by the VFs cut from it and is not an
-- identity. Empty values are not identities.
--
-- A constraint trigger, not unique indexes: uniqueness holds among enabled slots only, and an
-- index whose predicate names the status would make every reservation's status change a
-- non-HOT update (migration 012). The trigger fires only on an insert, on a change of an
-- identity column, and on leaving 'disabled'; status changes on the reservation path pass its
-- WHEN clause without running anything. It is DEFERRABLE so a slot map that swaps identities
-- between slots can defer the checks to the end of its writes (SET CONSTRAINTS); everything
-- else is checked at the end of each statement. Checks serialise per node (the node row is
-- locked FOR NO KEY UPDATE, which leaves foreign-key checks of new claims on the node alone)
-- and, for the fleet-wide MAC, on a transaction-scoped advisory lock keyed on the
-- value; under READ COMMITTED each check reads after the lock is held, so it sees whatever a
-- concurrent writer of the same identity committed. REPEATABLE READ and SERIALIZABLE read from
-- a snapshot older than the lock, so a check refuses to run under them (the store's
-- transactions are READ COMMITTED). Rows written before this migration are not re-checked until
-- they change; store.Invariants reports any pair that shares an identity.

CREATE FUNCTION slot_identity_mac_key(mac text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN regexp_replace(lower(mac), '[^0-9a-f]', '', 'g');

-- Finds the MAC's holder without reading the fleet. mac_address never changes with the status,
-- so status updates stay HOT.
CREATE INDEX node_resource_slots_mac_key ON node_resource_slots (slot_identity_mac_key(mac_address))
    WHERE mac_address <> '';

CREATE FUNCTION slot_identity_check() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    me      node_resource_slots%ROWTYPE;
    my_node text;
    my_vf   text;
    key     text;
    holder  text;
    what    text;
BEGIN
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION USING ERRCODE = 'feature_not_supported',
            MESSAGE = 'slot device identities are checked under READ COMMITTED isolation only, not ' || upper(current_setting('transaction_isolation'));
    END IF;
    -- The row as it is now: a deferred check may run after later writes to it.
    SELECT * INTO me FROM node_resource_slots WHERE id = NEW.id;
    IF NOT FOUND OR me.status = 'disabled' THEN
        RETURN NULL;
    END IF;
    SELECT name INTO my_node FROM nodes WHERE id = me.node_id FOR NO KEY UPDATE;
    my_vf := lower(coalesce(me.capacity_metadata->>'fabric_vf_pci_address', ''));

    IF me.mac_address <> '' THEN
        key := slot_identity_mac_key(me.mac_address);
        PERFORM pg_advisory_xact_lock(hashtextextended('gpuaas slot mac ' || key, 0));
        SELECT format('slot %s on node %s', o.slot_index, n.name) INTO holder
        FROM node_resource_slots o JOIN nodes n ON n.id = o.node_id
        WHERE slot_identity_mac_key(o.mac_address) = key AND o.mac_address <> ''
          AND o.status <> 'disabled' AND o.id <> me.id
        ORDER BY n.name, o.slot_index LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'unique_violation', CONSTRAINT = 'slot_identity_mac',
                MESSAGE = format('slot %s on node %s: mac_address %s is already held by %s (a MAC address is unique in the fleet)',
                                 me.slot_index, my_node, me.mac_address, holder);
        END IF;
    END IF;

    SELECT format('slot %s on node %s', o.slot_index, my_node),
           CASE WHEN lower(me.pci_address) <> '' AND lower(me.pci_address) IN (lower(o.pci_address), lower(coalesce(o.capacity_metadata->>'fabric_vf_pci_address', '')))
                THEN 'PCI function ' || me.pci_address
                ELSE 'PCI function ' || my_vf || ' (fabric VF)' END
      INTO holder, what
    FROM node_resource_slots o
    WHERE o.node_id = me.node_id AND o.id <> me.id AND o.status <> 'disabled'
      AND ((me.pci_address <> '' AND lower(me.pci_address) IN (lower(o.pci_address), lower(coalesce(o.capacity_metadata->>'fabric_vf_pci_address', ''))))
        OR (my_vf <> '' AND my_vf IN (lower(o.pci_address), lower(coalesce(o.capacity_metadata->>'fabric_vf_pci_address', '')))))
    ORDER BY o.slot_index LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'unique_violation', CONSTRAINT = 'slot_identity_pci',
            MESSAGE = format('slot %s on node %s: %s is already held by %s', me.slot_index, my_node, what, holder);
    END IF;

    IF me.nvme_device <> '' THEN
        SELECT format('slot %s on node %s', o.slot_index, my_node) INTO holder
        FROM node_resource_slots o
        WHERE o.node_id = me.node_id AND o.id <> me.id AND o.status <> 'disabled' AND o.nvme_device <> ''
          AND regexp_replace(o.nvme_device, '-part[0-9]+$', '') = regexp_replace(me.nvme_device, '-part[0-9]+$', '')
        ORDER BY o.slot_index LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'unique_violation', CONSTRAINT = 'slot_identity_nvme',
                MESSAGE = format('slot %s on node %s: nvme_device %s is already held by %s', me.slot_index, my_node, me.nvme_device, holder);
        END IF;
    END IF;

    IF me.private_ip IS NOT NULL THEN
        SELECT format('slot %s on node %s', o.slot_index, my_node) INTO holder
        FROM node_resource_slots o
        WHERE o.node_id = me.node_id AND o.id <> me.id AND o.status <> 'disabled' AND host(o.private_ip) = host(me.private_ip)
        ORDER BY o.slot_index LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'unique_violation', CONSTRAINT = 'slot_identity_ip',
                MESSAGE = format('slot %s on node %s: private_ip %s is already held by %s (a private IP is unique on its node''s slice network)',
                                 me.slot_index, my_node, host(me.private_ip), holder);
        END IF;
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER slot_identity_insert AFTER INSERT ON node_resource_slots
    DEFERRABLE INITIALLY IMMEDIATE FOR EACH ROW
    WHEN (NEW.status <> 'disabled')
    EXECUTE FUNCTION slot_identity_check();

CREATE CONSTRAINT TRIGGER slot_identity_update AFTER UPDATE ON node_resource_slots
    DEFERRABLE INITIALLY IMMEDIATE FOR EACH ROW
    WHEN (NEW.status <> 'disabled' AND (OLD.status = 'disabled'
          OR NEW.node_id <> OLD.node_id
          OR NEW.pci_address <> OLD.pci_address
          OR NEW.nvme_device <> OLD.nvme_device
          OR NEW.mac_address <> OLD.mac_address
          OR NEW.private_ip IS DISTINCT FROM OLD.private_ip
          OR NEW.capacity_metadata IS DISTINCT FROM OLD.capacity_metadata))
    EXECUTE FUNCTION slot_identity_check();

---- create above / drop below ----

DROP TRIGGER IF EXISTS slot_identity_update ON node_resource_slots;
DROP TRIGGER IF EXISTS slot_identity_insert ON node_resource_slots;
DROP FUNCTION IF EXISTS slot_identity_check();
DROP INDEX IF EXISTS node_resource_slots_mac_key;
DROP FUNCTION IF EXISTS slot_identity_mac_key(text);
