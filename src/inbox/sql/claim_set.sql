    status = 'IN_PROGRESS',
    lease_owner = $6,
    lease_token = lease_token + 1,
    lease_expires_at = $2 + $7,
    attempts = attempts + 1,
    updated_at = $2
