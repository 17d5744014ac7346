      AND NOT EXISTS (SELECT 1 FROM inbox_route_pause p WHERE p.route = $1)
      AND (NOT $3 OR e.correlation_key IS NULL OR (
            -- no entry of the key in flight (inbox_entry_key_in_progress, from the
            -- key's floor up: below it are only the key's finished entries) ...
            NOT EXISTS (
              SELECT 1 FROM inbox_entry o
              WHERE o.route = e.route AND o.correlation_key = e.correlation_key AND o.status = 'IN_PROGRESS'
                AND o.id >= COALESCE((
                  SELECT f.floor FROM inbox_key_floor f
                  WHERE f.route = e.route AND f.correlation_key = e.correlation_key), 0))
            -- ... and no older one waiting, or parked where parked blocks the key
            -- (inbox_entry_unresolved_key, which holds only those two states), from the
            -- key's floor up to the entry (below the floor nothing is unresolved:
            -- sql/postgres_0012_key_floor.sql), not over the settled entries under it
            AND NOT EXISTS (
              SELECT 1 FROM inbox_entry o
              WHERE o.route = e.route AND o.correlation_key = e.correlation_key AND o.id < e.id
                AND o.id >= COALESCE((
                  SELECT f.floor FROM inbox_key_floor f
                  WHERE f.route = e.route AND f.correlation_key = e.correlation_key), 0)
                AND o.status IN ('OPEN', 'PARKED')
                AND (o.status = 'OPEN' OR ($4 AND o.status = 'PARKED')))))
