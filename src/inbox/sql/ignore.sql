-- The status through a sub-select, so the row is reached by its id whatever the
-- statistics say (postgres.rs, BY_ID_STATEMENTS).
UPDATE inbox_entry SET
    status = 'IGNORED',
    last_error = $2 || COALESCE(' (it was parked: ' || last_error || ')', ''),
    finished_at = $3,
    updated_at = $3
WHERE id = $1 AND status = (SELECT 'PARKED')
