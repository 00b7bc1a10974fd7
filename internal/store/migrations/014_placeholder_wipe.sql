-- Placeholder so this branch migrates without the parallel 014 (014_slot_cpus.sql). Drop this
-- file when merging: the real 014 takes its number.
SELECT 1;

---- create above / drop below ----

SELECT 1;
