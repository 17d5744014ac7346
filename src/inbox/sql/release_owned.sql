UPDATE inbox_entry SET
    status = 'OPEN',
    last_error = 'the attempt under the lease of ' || lease_owner || ' was abandoned at shutdown before it was settled',
    lease_owner = NULL,
    lease_expires_at = NULL,
    updated_at = $2
WHERE status = 'IN_PROGRESS' AND lease_owner = $1
RETURNING route
