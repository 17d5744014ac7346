-- An operator parks a waiting (OPEN, not leased) entry. $1 id, $2 error, $3 now,
-- $4 error fingerprint, $5 parked blocks the key. When the entry is its key's head:
-- under block-key the key row turns 'blocked'; under skip-key the head moves on as a
-- settle moves it (exclusive try-lock, fresh-snapshot probe, else 'moving').
-- (The relay's own "park" outcome is part of settle_[ab].sql.)
WITH e AS MATERIALIZED (
    SELECT x.id, x.route, COALESCE(x.correlation_key, '#' || x.id) AS key
    FROM inbox_entry x WHERE x.id = $1 AND x.status = 'OPEN'
), k AS MATERIALIZED (
    SELECT e.*, t.head_id, t.state
    FROM e JOIN inbox_key t ON t.route = e.route AND t.correlation_key = e.key
    FOR UPDATE OF t
), ok AS MATERIALIZED (
    -- not while an attempt of it is in flight (the entry of a leased key row is its head)
    SELECT * FROM k WHERE NOT (k.state = 'leased' AND k.head_id = k.id)
), parked AS (
    UPDATE inbox_entry x SET status = 'PARKED', last_error = $2, updated_at = $3, error_fingerprint = $4
    FROM ok WHERE x.id = ok.id
), blocked AS (
    UPDATE inbox_key t SET state = 'blocked'
    FROM ok WHERE $5 AND ok.state = 'ready' AND ok.head_id = ok.id
      AND t.route = ok.route AND t.correlation_key = ok.key
), adv AS MATERIALIZED (
    SELECT ok.route, ok.key, ok.id AS finished, a.locked, a.id, a.status, a.due
    FROM ok CROSS JOIN LATERAL inbox_key_advance(ok.route, ok.key, ok.id, ok.id, $5) a
    WHERE NOT $5 AND ok.state = 'ready' AND ok.head_id = ok.id
), moved AS (
    UPDATE inbox_key t SET
        head_id = CASE WHEN a.locked THEN a.id ELSE t.head_id END,
        state = CASE WHEN NOT a.locked THEN 'moving' WHEN a.status = 'PARKED' THEN 'blocked' ELSE 'ready' END,
        due_at = COALESCE(a.due, t.due_at)
    FROM adv a WHERE t.route = a.route AND t.correlation_key = a.key AND NOT (a.locked AND a.id IS NULL)
), emptied AS (
    DELETE FROM inbox_key t USING adv a
    WHERE t.route = a.route AND t.correlation_key = a.key AND a.locked AND a.id IS NULL
)
SELECT id FROM ok
