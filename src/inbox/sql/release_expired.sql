UPDATE inbox_entry SET
    status = 'OPEN',
    last_error = 'lease of ' || lease_owner || ' expired before the attempt was settled',
    lease_owner = NULL,
    lease_expires_at = NULL,
    updated_at = $2
WHERE route = $1 AND status = 'IN_PROGRESS' AND lease_expires_at <= $2
