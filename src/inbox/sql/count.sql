SELECT CAST(COUNT(*) AS BIGINT) FROM inbox_entry
WHERE ($1 IS NULL OR route = $1)
  AND ($2 IS NULL OR status = $2)
  AND ($3 IS NULL OR correlation_key = $3)
  AND id > $4
