PREPARE claim_next_no_row_lock(text, bigint, boolean, boolean, bigint, text, bigint, bigint[], text[]) AS
WITH candidates AS (
    SELECT h.id FROM unnest($8::bigint[], $9::text[]) AS v(after, key)
    CROSS JOIN LATERAL (
        SELECT o.id FROM inbox_entry o
        WHERE o.route = $1 AND o.correlation_key = v.key AND o.id > v.after AND o.status IN ('OPEN', 'PARKED')
        ORDER BY o.id LIMIT 1) h
), picked AS (
    SELECT e.id FROM inbox_entry e
    WHERE e.id = ANY(ARRAY(SELECT id FROM candidates)) AND e.route = $1 AND e.status = 'OPEN' AND e.next_attempt_at <= $2
      AND NOT EXISTS (SELECT 1 FROM inbox_route_pause p WHERE p.route = $1)
      AND (NOT $3 OR e.correlation_key IS NULL OR (
            NOT EXISTS (
              SELECT 1 FROM inbox_entry o
              WHERE o.route = e.route AND o.correlation_key = e.correlation_key AND o.status = 'IN_PROGRESS'
                AND o.id >= COALESCE((
                  SELECT f.floor FROM inbox_key_floor f
                  WHERE f.route = e.route AND f.correlation_key = e.correlation_key), 0))
            AND NOT EXISTS (
              SELECT 1 FROM inbox_entry o
              WHERE o.route = e.route AND o.correlation_key = e.correlation_key AND o.id < e.id
                AND o.id >= COALESCE((
                  SELECT f.floor FROM inbox_key_floor f
                  WHERE f.route = e.route AND f.correlation_key = e.correlation_key), 0)
                AND o.status IN ('OPEN', 'PARKED')
                AND (o.status = 'OPEN' OR ($4 AND o.status = 'PARKED')))))
    LIMIT $5
), claimed AS (
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
), heads AS (
    SELECT c.route, c.correlation_key, f.floor AS old, LEAST(c.id, (
        SELECT min(o.id) FROM inbox_entry o
        WHERE o.route = c.route AND o.correlation_key = c.correlation_key
          AND o.id >= COALESCE(f.floor, 0) AND o.id < c.id AND o.status = 'PARKED')) AS floor
    FROM claimed c
    LEFT JOIN inbox_key_floor f ON f.route = c.route AND f.correlation_key = c.correlation_key
    WHERE c.correlation_key IS NOT NULL
), raised AS (
    UPDATE inbox_key_floor f SET floor = h.floor FROM heads h
    WHERE f.route = h.route AND f.correlation_key = h.correlation_key AND f.floor = h.old AND h.floor > h.old
), created AS (
    INSERT INTO inbox_key_floor (route, correlation_key, floor)
    SELECT h.route, h.correlation_key, h.floor FROM heads h WHERE h.old IS NULL
    ON CONFLICT (route, correlation_key) DO NOTHING
)
SELECT claimed.id FROM claimed;
