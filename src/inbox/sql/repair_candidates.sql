SELECT id, correlation_key FROM inbox_entry
WHERE ($1 IS NULL OR route = $1)
  AND status IN ($2, $3)
  AND ($4 IS NULL OR correlation_key = $4)
  AND ($5 IS NULL OR error_fingerprint = $5)
  AND ($6 IS NULL OR last_error LIKE $6 ESCAPE '\')
  AND ($7 IS NULL OR received_at >= $7)
  AND ($8 IS NULL OR received_at < $8)
  AND id > $9
ORDER BY id
LIMIT $10
