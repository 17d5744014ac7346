-- Migration step 3 (variant b): finished rows to inbox_done, 10,000 per statement,
-- repeated until it moves none.
WITH batch AS (
    SELECT id FROM inbox_entry WHERE status IN ('DONE', 'IGNORED') ORDER BY id LIMIT 10000 FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM inbox_entry e USING batch b WHERE e.id = b.id RETURNING e.*
)
INSERT INTO inbox_done SELECT * FROM gone
