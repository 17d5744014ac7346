-- Set-based head advance (variant "a2"): one call per settle batch instead of one per key.
-- First query: try each key's lock exclusively (never waiting). Second query, in a
-- fresh snapshot taken after those locks: each locked key's next head.
CREATE FUNCTION inbox_key_advance_many(p_route TEXT[], p_key TEXT[], p_from BIGINT[], p_except BIGINT[], parked_blocks BOOLEAN)
RETURNS TABLE (route TEXT, key TEXT, locked BOOLEAN, id BIGINT, status TEXT, due BIGINT)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    got BOOLEAN[];
BEGIN
    got := ARRAY(SELECT pg_try_advisory_xact_lock(hashtextextended(u.r || ':' || u.k, 0))
                 FROM unnest(p_route, p_key) WITH ORDINALITY AS u(r, k, o) ORDER BY u.o);
    RETURN QUERY
    SELECT u.r, u.k, u.l, n.id, n.status, n.next_attempt_at
    FROM unnest(p_route, p_key, p_from, p_except, got) AS u(r, k, f, x, l)
    LEFT JOIN LATERAL (
        SELECT e.id, e.status, e.next_attempt_at FROM inbox_entry e
        WHERE u.l AND u.k NOT LIKE '#%' AND e.route = u.r AND e.correlation_key = u.k AND e.id >= u.f AND e.id <> u.x
          AND e.status IN ('OPEN', 'PARKED') AND (e.status = 'OPEN' OR parked_blocks)
        ORDER BY e.id LIMIT 1) n ON true;
END $$;
