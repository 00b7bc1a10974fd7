-- A migration number taken by another change built in parallel; this file only keeps the
-- sequence continuous until that change's own file replaces it.
SELECT 1;

---- create above / drop below ----

SELECT 1;
