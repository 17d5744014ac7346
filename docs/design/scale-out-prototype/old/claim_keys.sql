WITH candidate AS (
  SELECT c.id, c.correlation_key FROM inbox_entry c WHERE c.id IN (
    SELECT e.id FROM inbox_entry e
    WHERE e.route = $1 AND e.status = 'OPEN' AND e.next_attempt_at <= $2
      AND (e.route, e.id) <= ($1, COALESCE((
        SELECT w.id FROM inbox_entry w WHERE w.route = $1 AND w.status = 'OPEN'
        ORDER BY w.id OFFSET $6 - 1 LIMIT 1), 9223372036854775807))
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
    ORDER BY e.id
    LIMIT $5
)), held AS (
  SELECT k.correlation_key FROM (
    SELECT DISTINCT correlation_key FROM candidate WHERE correlation_key IS NOT NULL) k
  WHERE pg_try_advisory_xact_lock(hashtextextended($1 || ':' || k.correlation_key, 0)))
SELECT id, correlation_key FROM candidate
WHERE correlation_key IS NULL OR correlation_key IN (SELECT correlation_key FROM held)
