UPDATE inbox_entry SET status = 'PARKED', last_error = $2, updated_at = $3, error_fingerprint = $4
WHERE id = $1 AND status = 'OPEN'
