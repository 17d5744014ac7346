INSERT INTO inbox_attempt (entry_id, attempt, owner, started_at, duration_ms, answer, status, reason, requests, plugin)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
