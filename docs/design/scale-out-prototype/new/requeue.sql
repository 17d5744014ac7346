-- Requeue a PARKED (or waiting OPEN) entry: due now ($2), fresh attempt count. $1 id.
-- It makes an entry unresolved again, as an insert does, so it takes the key's lock
-- SHARED (held to commit: claims skip the key, a settle of it leaves it 'moving') and
-- lowers the key row's head to it if it is older (LEAST), creating the row if none.
WITH guard AS MATERIALIZED (
    SELECT e.id, e.route, COALESCE(e.correlation_key, '#' || e.id) AS key,
           pg_advisory_xact_lock_shared(hashtextextended(e.route || ':' || COALESCE(e.correlation_key, '#' || e.id), 0))
    FROM inbox_entry e WHERE e.id = $1
), entry AS (
    UPDATE inbox_entry e SET status = 'OPEN', next_attempt_at = $2, attempts = 0, not_yet_since = NULL, updated_at = $2
    FROM guard g WHERE e.id = g.id AND e.status IN ('PARKED', 'OPEN')
    RETURNING e.id, e.route, g.key
), keyed AS (
    INSERT INTO inbox_key AS k (route, correlation_key, slot, head_id, state, due_at)
    SELECT route, key, inbox_key_slot(key), id, 'ready', $2 FROM entry
    ON CONFLICT (route, correlation_key) DO UPDATE SET
        head_id = LEAST(k.head_id, EXCLUDED.head_id),
        -- leased: the attempt in flight settles and its probe starts from the lowered
        -- head; moving: head_id is a lower bound, lowered; blocked by an older parked
        -- entry: stays blocked; otherwise the older of the two is the ready head
        state = CASE WHEN k.state IN ('leased', 'moving') THEN k.state
                     WHEN k.head_id < EXCLUDED.head_id THEN k.state
                     ELSE 'ready' END,
        due_at = CASE WHEN k.state IN ('leased', 'moving') OR k.head_id < EXCLUDED.head_id THEN k.due_at
                      ELSE EXCLUDED.due_at END
)
SELECT id FROM entry
