UPDATE inbox_entry SET status = 'OPEN', next_attempt_at = $2, attempts = 0, not_yet_since = NULL, updated_at = $2
WHERE id = $1 AND status IN ('PARKED', 'OPEN')
