SELECT * FROM inbox_entry
WHERE ($1 IS NULL OR route = $1)
  AND ($2 IS NULL OR status = $2)
  AND ($3 IS NULL OR correlation_key = $3)
  AND id > $4
  AND ($6 IS NULL OR error_fingerprint = $6)
  AND ($7 IS NULL OR last_error LIKE $7 ESCAPE '\')
ORDER BY id DESC
LIMIT $5
