-- The settle of a batch of attempts, one statement. Per item: $1 entry id, $2 route,
-- $3 key (the key row's: '#<id>' for an entry without one), $4 lease owner, $5 lease
-- token, $6 outcome (DONE, IGNORED, RETRY, PARKED), $7 now, $8 next attempt at (RETRY),
-- $9 error, $10 error fingerprint, $11 not-yet since, $12 attempt started at, $13 its
-- duration, $14 plugin digest; $15 parked blocks the key; $16..$25 the inbox_attempt
-- rows to write (none for a first attempt that ends the entry). Returns each settled id
-- and, for those whose head moved, whether the key's lock was had (false: left 'moving').
WITH v AS (
    SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::bigint[],
            $8::bigint[], $9::text[], $10::text[], $11::bigint[], $12::bigint[], $13::bigint[], $14::text[])
        AS v(id, route, key, owner, token, outcome, now, next, error, fp, nys, started, duration, plugin)
), k AS MATERIALIZED (
    -- the fence: key rows still leased under the attempt's lease, locked in key order
    SELECT v.*, t.head_id
    FROM v JOIN inbox_key t ON t.route = v.route AND t.correlation_key = v.key
    WHERE t.state = 'leased' AND t.lease_owner = v.owner AND t.lease_token = v.token
    ORDER BY v.route, v.key
    FOR UPDATE OF t
), entry AS (
    -- (a) the entry stays, finished in place
    UPDATE inbox_entry e SET
        status = CASE k.outcome WHEN 'RETRY' THEN 'OPEN' ELSE k.outcome END,
        attempts = e.attempts + 1,
        updated_at = k.now,
        next_attempt_at = COALESCE(k.next, e.next_attempt_at),
        last_error = COALESCE(k.error, e.last_error),
        error_fingerprint = COALESCE(k.fp, e.error_fingerprint),
        not_yet_since = COALESCE(e.not_yet_since, k.nys),
        finished_at = CASE WHEN k.outcome IN ('DONE', 'IGNORED') THEN k.now END,
        attempt_owner = k.owner, attempt_started_at = k.started, attempt_duration_ms = k.duration,
        attempt_plugin = k.plugin
    FROM k WHERE e.id = k.id AND e.status = 'OPEN'
), adv AS MATERIALIZED (
    -- the head moves on (done, ignored, parked where parked does not block the key):
    -- the key's lock exclusively, never waiting, and then its next entry in a fresh
    -- snapshot (inbox_key_advance); no lock: left 'moving' for a claim to finish
    SELECT k.route, k.key, k.id AS finished, LEAST(k.head_id, k.id) AS floor, a.locked, a.id, a.status, a.due
    FROM k CROSS JOIN LATERAL inbox_key_advance(k.route, k.key, LEAST(k.head_id, k.id), k.id, $15) a
    WHERE k.outcome IN ('DONE', 'IGNORED') OR (k.outcome = 'PARKED' AND NOT $15)
), moved AS (
    UPDATE inbox_key t SET
        head_id = CASE WHEN a.locked THEN a.id ELSE a.floor END,
        state = CASE WHEN NOT a.locked THEN 'moving' WHEN a.status = 'PARKED' THEN 'blocked' ELSE 'ready' END,
        due_at = COALESCE(a.due, t.due_at),
        lease_owner = NULL, lease_expires_at = NULL
    FROM adv a
    WHERE t.route = a.route AND t.correlation_key = a.key AND NOT (a.locked AND a.id IS NULL)
), emptied AS (
    DELETE FROM inbox_key t USING adv a
    WHERE t.route = a.route AND t.correlation_key = a.key AND a.locked AND a.id IS NULL
), stays AS (
    -- retry / not yet: the same head, due later; parked where parked blocks: blocked
    UPDATE inbox_key t SET
        state = CASE k.outcome WHEN 'PARKED' THEN 'blocked' ELSE 'ready' END,
        due_at = COALESCE(k.next, t.due_at),
        lease_owner = NULL, lease_expires_at = NULL
    FROM k
    WHERE t.route = k.route AND t.correlation_key = k.key AND (k.outcome = 'RETRY' OR (k.outcome = 'PARKED' AND $15))
), recorded AS (
    INSERT INTO inbox_attempt (entry_id, attempt, owner, started_at, duration_ms, answer, status, reason, requests, plugin)
    SELECT a.* FROM unnest($16::bigint[], $17::integer[], $18::text[], $19::bigint[], $20::bigint[], $21::text[],
            $22::text[], $23::text[], $24::text[], $25::text[])
        AS a(entry_id, attempt, owner, started_at, duration_ms, answer, status, reason, requests, plugin)
    WHERE a.entry_id IN (SELECT id FROM k)
)
SELECT k.id, a.locked FROM k LEFT JOIN adv a ON a.finished = k.id
