SELECT route, error_fingerprint,
       SUM(CASE WHEN status = 'PARKED' THEN 1 ELSE 0 END) AS parked,
       SUM(CASE WHEN status = 'OPEN' THEN 1 ELSE 0 END) AS retrying,
       COUNT(DISTINCT correlation_key) AS keys,
       MIN(updated_at) AS first_seen,
       MAX(updated_at) AS last_seen,
       MIN(id) AS example_id
FROM inbox_entry
WHERE error_fingerprint IS NOT NULL
  AND (status = 'PARKED' OR (status = 'OPEN' AND attempts > 0))
  AND ($1 IS NULL OR route = $1)
GROUP BY route, error_fingerprint
ORDER BY COUNT(*) DESC, route, error_fingerprint
LIMIT $2
