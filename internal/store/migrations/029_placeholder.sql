-- Placeholder: migration numbers 027-031 belong to other branches; this no-op keeps the
-- sequence whole on this branch until they are merged, and is dropped then.
SELECT 1;

---- create above / drop below ----

SELECT 1;
