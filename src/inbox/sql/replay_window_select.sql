SELECT w.id, w.route, w.published_from, w.published_to, w.opened_at, w.closes_at, w.closed_at,
    w.opened_by, w.reason,
    (SELECT count(*) FROM inbox_replay_entry r WHERE r.window_id = w.id) AS taken
FROM inbox_replay_window w
