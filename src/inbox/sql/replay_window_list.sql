SELECT w.id, w.route, w.published_from, w.published_to, w.opened_at, w.closes_at, w.closed_at,
    w.opened_by, w.reason,
    (SELECT count(*) FROM inbox_replay_entry r WHERE r.window_id = w.id) AS taken
FROM inbox_replay_window w
WHERE ($1 IS NULL OR w.route = $1)
  AND ($2 IS NULL OR (w.closed_at IS NULL AND w.closes_at > $2))
  AND ($3 IS NULL OR w.id = $3)
ORDER BY w.id
