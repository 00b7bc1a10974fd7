-- A reservation released before anything reached its host (CancelRequested) goes from
-- requested straight to released in one update: releasing would be a state no one observes
-- (the same transaction leaves it), and the second update cost a trigger run on the
-- create+release path (issue 9).
INSERT INTO allocation_transitions VALUES ('requested', 'released');

---- create above / drop below ----

DELETE FROM allocation_transitions WHERE from_status = 'requested' AND to_status = 'released';
