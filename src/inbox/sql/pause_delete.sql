DELETE FROM inbox_route_pause WHERE route = $1
