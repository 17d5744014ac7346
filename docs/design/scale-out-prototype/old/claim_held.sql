WITH picked AS (
    SELECT e.id FROM inbox_entry e
    WHERE e.id = ANY($8) AND e.route = $1 AND e.status = 'OPEN' AND e.next_attempt_at <= $2
      AND NOT EXISTS (SELECT 1 FROM inbox_route_pause p WHERE p.route = $1)
      AND (NOT $3 OR e.correlation_key IS NULL OR (
            -- no entry of the key in flight (inbox_entry_key_in_progress) ...
            NOT EXISTS (
              SELECT 1 FROM inbox_entry o
              WHERE o.route = e.route AND o.correlation_key = e.correlation_key AND o.status = 'IN_PROGRESS')
            -- ... and no older one waiting, or parked where parked blocks the key
            -- (inbox_entry_unresolved_key, which holds only those two states, from the
            -- entry's id down)
            AND NOT EXISTS (
              SELECT 1 FROM inbox_entry o
              WHERE o.route = e.route AND o.correlation_key = e.correlation_key AND o.id < e.id
                AND o.status IN ('OPEN', 'PARKED')
                AND (o.status = 'OPEN' OR ($4 AND o.status = 'PARKED')))))
    LIMIT $5
    FOR UPDATE SKIP LOCKED
)
UPDATE inbox_entry SET
    status = 'IN_PROGRESS',
    lease_owner = $6,
    lease_token = lease_token + 1,
    lease_expires_at = $2 + $7,
    attempts = attempts + 1,
    updated_at = $2
FROM picked WHERE inbox_entry.id = picked.id
  AND (inbox_entry.correlation_key IS NULL OR inbox_entry.correlation_key = ANY($9))
RETURNING inbox_entry.*
