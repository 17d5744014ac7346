-- A part per status, so each reads its status's partial index: cost grows with the
-- unresolved entries, not with the finished ones a table keeps (written as one
-- `status IN (…)`, PostgreSQL read the whole table).
SELECT route, 'OPEN' AS status, COUNT(*) AS n, MIN(received_at) AS oldest
FROM inbox_entry WHERE status = 'OPEN' GROUP BY route
UNION ALL
SELECT route, 'IN_PROGRESS', COUNT(*), MIN(received_at)
FROM inbox_entry WHERE status = 'IN_PROGRESS' GROUP BY route
UNION ALL
SELECT route, 'PARKED', COUNT(*), MIN(received_at)
FROM inbox_entry WHERE status = 'PARKED' GROUP BY route
