SELECT route, CAST((finished_at - $1) / $2 AS BIGINT) AS bucket, CAST(COUNT(*) AS BIGINT) AS n
FROM inbox_entry
WHERE status = 'DONE' AND finished_at >= $1
GROUP BY route, bucket
ORDER BY route, bucket
