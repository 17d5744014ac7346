    SELECT e.id FROM inbox_entry e
    WHERE e.route = $1 AND e.status = 'OPEN' AND e.next_attempt_at <= $2
      AND NOT EXISTS (SELECT 1 FROM inbox_route_pause p WHERE p.route = $1)
      AND (NOT $3 OR e.correlation_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM inbox_entry o
            WHERE o.route = e.route AND o.correlation_key = e.correlation_key AND o.id <> e.id
              AND o.status IN ('OPEN', 'IN_PROGRESS', 'PARKED')
              AND (o.status = 'IN_PROGRESS'
                   OR (o.id < e.id AND (o.status = 'OPEN' OR ($4 AND o.status = 'PARKED'))))))
    ORDER BY e.id
    LIMIT $5
