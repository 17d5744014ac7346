-- The status through a sub-select, so the row is reached by its id whatever the
-- statistics say (postgres.rs, BY_ID_STATEMENTS). Due $3, a little before now $2
-- (inbox::REQUEUED_DUE_EARLY).
UPDATE inbox_entry SET status = 'OPEN', next_attempt_at = $3, attempts = 0, not_yet_since = NULL, updated_at = $2
WHERE id = $1 AND status IN ((SELECT 'PARKED'), (SELECT 'OPEN'))
