-- This number belongs to the performance work, which needed only 030; it is held empty so the
-- migrations after it (loaded only as an unbroken sequence) find it filled.
SELECT 1;

---- create above / drop below ----

SELECT 1;
