-- The status through a sub-select, so the row is reached by its id whatever the
-- statistics say (postgres.rs, BY_ID_STATEMENTS).
UPDATE inbox_entry SET status = 'PARKED', last_error = $2, updated_at = $3, error_fingerprint = $4
WHERE id = $1 AND status = (SELECT 'OPEN')
