-- The status through a sub-select, so the row is reached by its id whatever the
-- statistics say (postgres.rs, BY_ID_STATEMENTS).
UPDATE inbox_entry SET status = 'OPEN', next_attempt_at = $2, attempts = 0, not_yet_since = NULL, updated_at = $2
WHERE id = $1 AND status IN ((SELECT 'PARKED'), (SELECT 'OPEN'))
