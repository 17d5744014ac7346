UPDATE repair_job SET owner = $1, lease_expires_at = $2 + $3, updated_at = $2
WHERE id = (
        SELECT id FROM repair_job
        WHERE state = 'running' AND (owner IS NULL OR lease_expires_at < $2)
        ORDER BY id LIMIT 1)
  AND state = 'running' AND (owner IS NULL OR lease_expires_at < $2)
RETURNING *
