-- A host that refuses the controller's plan (plan_invalid, seed 004) sends the allocation
-- back to placement on another node: provisioning -> requested.
INSERT INTO allocation_transitions VALUES ('provisioning', 'requested');

---- create above / drop below ----

DELETE FROM allocation_transitions WHERE from_status = 'provisioning' AND to_status = 'requested';
