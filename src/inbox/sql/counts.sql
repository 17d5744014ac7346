SELECT route, status, COUNT(*) AS n, MIN(received_at) AS oldest
FROM inbox_entry
WHERE status IN ('OPEN', 'IN_PROGRESS', 'PARKED')
GROUP BY route, status
