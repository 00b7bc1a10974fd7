-- Placeholder: this branch (slot identities, 017) was cut before migrations 014-016 of the
-- parallel isolation work existed; the migrator refuses a gap. Delete this file when the real
-- 015 migration is merged.

SELECT 1;

---- create above / drop below ----
