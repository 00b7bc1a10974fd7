-- Placeholder: migration numbers 018 and 019 belong to another branch; this no-op keeps the
-- sequence whole on this branch until they are merged, and is dropped then.
SELECT 1;

---- create above / drop below ----

SELECT 1;
