INSERT INTO repair_job (action, filter, reason, rate, actor, state, total, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, 'running', $6, $7, $7)
RETURNING id
