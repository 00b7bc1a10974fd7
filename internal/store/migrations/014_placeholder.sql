-- Placeholder so this branch's migrations are contiguous (tern refuses gaps); the migration
-- of this number comes from another branch and replaces this file at merge.
SELECT 1;

---- create above / drop below ----

SELECT 1;
