INSERT INTO inbox_route_pause (route, paused_at, paused_by, reason)
VALUES ($1, $2, $3, $4)
ON CONFLICT (route) DO NOTHING
