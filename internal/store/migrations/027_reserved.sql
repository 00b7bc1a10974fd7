-- This number is held for another change's migration, which replaces this file when both
-- land: migrations load only as an unbroken sequence, and the ones after it need it filled.
SELECT 1;

---- create above / drop below ----

SELECT 1;
