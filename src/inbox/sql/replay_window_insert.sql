INSERT INTO inbox_replay_window (route, published_from, published_to, opened_at, closes_at, opened_by, reason)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING id
