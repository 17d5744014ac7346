SELECT * FROM inbox_audit
WHERE id > $1
ORDER BY id
LIMIT $2
