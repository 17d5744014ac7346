WITH RECURSIVE k(key) AS (
    (SELECT o.correlation_key FROM inbox_entry o
     WHERE o.route = $1 AND o.status IN ('OPEN', 'PARKED') AND o.correlation_key IS NOT NULL
     ORDER BY o.correlation_key LIMIT 1)
  UNION ALL
    SELECT (SELECT o.correlation_key FROM inbox_entry o
            WHERE o.route = $1 AND o.status IN ('OPEN', 'PARKED') AND o.correlation_key > k.key
            ORDER BY o.correlation_key LIMIT 1)
    FROM k WHERE k.key IS NOT NULL
), head AS (
    SELECT h.* FROM k CROSS JOIN LATERAL (
        SELECT e.id, e.correlation_key, e.status, e.next_attempt_at FROM inbox_entry e
        WHERE e.route = $1 AND e.correlation_key = k.key AND e.status IN ('OPEN', 'PARKED')
          AND (e.status = 'OPEN' OR $3)
        ORDER BY e.id LIMIT 1) h
    WHERE k.key IS NOT NULL
), candidate AS (
    SELECT c.id, c.correlation_key FROM head c
    WHERE c.status = 'OPEN' AND c.next_attempt_at <= $2 AND NOT (c.correlation_key = ANY($5))
      AND NOT EXISTS (SELECT 1 FROM inbox_route_pause p WHERE p.route = $1)
      AND NOT EXISTS (
        SELECT 1 FROM inbox_entry o
        WHERE o.route = $1 AND o.correlation_key = c.correlation_key AND o.status = 'IN_PROGRESS')
    ORDER BY c.id LIMIT $4
), held AS (
    SELECT c.correlation_key FROM candidate c WHERE pg_try_advisory_xact_lock(hashtextextended($1 || ':' || c.correlation_key, 0))), walked AS (
    SELECT count(*) AS keys FROM k WHERE k.key IS NOT NULL
)
SELECT c.id, c.correlation_key, walked.keys FROM walked
LEFT JOIN candidate c ON c.correlation_key IN (SELECT correlation_key FROM held)
