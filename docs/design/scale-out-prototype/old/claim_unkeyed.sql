SELECT e.id, NULL::text AS correlation_key FROM inbox_entry e
WHERE e.route = $1 AND e.correlation_key IS NULL AND e.status = 'OPEN' AND e.next_attempt_at <= $2
  AND NOT EXISTS (SELECT 1 FROM inbox_route_pause p WHERE p.route = $1)
ORDER BY e.id LIMIT $3
