-- The claim, one statement. $1 route, $2 my slots (smallint[]), $3 now, $4 how many,
-- $5 parked blocks the key, $6 owner, $7 lease ms. Returns the leased heads with their
-- lease token and the entry's columns (NULL when the entry committed after this
-- statement's snapshot: the caller reads those few by id, see REPORT.md).
WITH cfg AS MATERIALIZED (
    -- as today's claim: its commit need not wait for the disk (a lost claim leaves the
    -- key row under its old token, so the attempt's settle is refused)
    SELECT set_config('synchronous_commit', 'off', true)
), pick AS MATERIALIZED (
    SELECT k.route, k.correlation_key, k.state, k.head_id
    FROM inbox_key k
    WHERE k.route = $1 AND k.slot = ANY($2::smallint[])
      AND ((k.state = 'ready' AND k.due_at <= $3)
           OR k.state = 'moving'
           OR (k.state = 'leased' AND k.lease_expires_at <= $3))
      AND NOT EXISTS (SELECT 1 FROM inbox_route_pause p WHERE p.route = $1)
    ORDER BY k.head_id
    LIMIT $4
    FOR UPDATE SKIP LOCKED
), held AS MATERIALIZED (
    -- the key's lock, exclusively, never waiting: taken only when no insert or requeue
    -- of the key is in flight (they hold it shared from before their id is drawn)
    SELECT p.* FROM pick p
), found AS MATERIALIZED (
    -- a 'moving' key's head, found now that its lock is held, in a fresh snapshot
    SELECT h.route, h.correlation_key, n.id, n.status, n.due
    FROM held h CROSS JOIN LATERAL inbox_key_probe(h.route, h.correlation_key, h.head_id, 0::bigint, $5) n
    WHERE h.state = 'moving'
), leased AS (
    UPDATE inbox_key k SET
        state = 'leased',
        head_id = COALESCE(f.id, k.head_id),
        lease_owner = $6,
        lease_token = k.lease_token + 1,
        lease_expires_at = $3 + $7
    FROM held h LEFT JOIN found f ON f.route = h.route AND f.correlation_key = h.correlation_key
    WHERE k.route = h.route AND k.correlation_key = h.correlation_key
      AND (h.state <> 'moving' OR (f.status = 'OPEN' AND f.due <= $3))
    RETURNING k.correlation_key, k.head_id, k.lease_token
), resolved AS (
    -- 'moving' keys whose head is not to be leased now: parked (blocked) or not due
    UPDATE inbox_key k SET
        state = CASE f.status WHEN 'PARKED' THEN 'blocked' ELSE 'ready' END,
        head_id = f.id,
        due_at = f.due
    FROM found f
    WHERE k.route = f.route AND k.correlation_key = f.correlation_key
      AND f.id IS NOT NULL AND NOT (f.status = 'OPEN' AND f.due <= $3)
), emptied AS (
    DELETE FROM inbox_key k USING found f
    WHERE k.route = f.route AND k.correlation_key = f.correlation_key AND f.id IS NULL
)
SELECT l.head_id AS id, l.lease_token, l.correlation_key AS key, e.id AS entry_id, e.attempts, e.body,
       e.raw_data, e.attributes, e.received_at, e.not_yet_since
FROM leased l CROSS JOIN cfg LEFT JOIN inbox_entry e ON e.id = l.head_id
