UPDATE inbox_entry SET
    status = 'IGNORED',
    last_error = $2 || COALESCE(' (it was parked: ' || last_error || ')', ''),
    finished_at = $3,
    updated_at = $3
WHERE id = $1 AND status = 'PARKED'
