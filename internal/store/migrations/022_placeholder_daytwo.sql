-- Placeholder: this number belongs to a migration on another branch (tern needs the numbers
-- contiguous); the merge replaces this file with that migration.
SELECT 1;
---- create above / drop below ----
SELECT 1;
