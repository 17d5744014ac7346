SELECT * FROM inbox_entry
WHERE ($1 IS NULL OR route = $1)
  AND ($2 IS NULL OR status = $2)
  AND ($3 IS NULL OR correlation_key = $3)
  AND id > $4
ORDER BY id DESC
LIMIT $5
