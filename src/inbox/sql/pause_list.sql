SELECT route, paused_at, paused_by, reason FROM inbox_route_pause
WHERE ($1 IS NULL OR route = $1)
ORDER BY route
