INSERT INTO inbox_audit (at, actor, action, route, subject, outcome, detail)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING id
