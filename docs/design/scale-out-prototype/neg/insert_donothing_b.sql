WITH new AS (
INSERT INTO inbox_entry (
    route, dedup_key, correlation_key, event_type, schema_version, body, raw_data, attributes,
    message_id, publish_time, delivery_attempt, payload_digest, status, attempts,
    next_attempt_at, last_error, received_at, updated_at, finished_at, error_fingerprint)
SELECT r.route, r.dedup_key, r.correlation_key, r.event_type, r.schema_version, r.body, r.raw_data,
    r.attributes, r.message_id, r.publish_time, r.delivery_attempt, r.payload_digest, r.status, 0,
    $17::bigint, r.last_error, $17::bigint, $17::bigint, r.finished_at, r.error_fingerprint
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::bytea[],
        $8::text[], $9::text[], $10::text[], $11::integer[], $12::text[], $13::text[], $14::text[],
        $15::bigint[], $16::text[])
    WITH ORDINALITY AS r(route, dedup_key, correlation_key, event_type, schema_version, body, raw_data,
        attributes, message_id, publish_time, delivery_attempt, payload_digest, status, last_error,
        finished_at, error_fingerprint, ord)
CROSS JOIN LATERAL (SELECT pg_advisory_xact_lock_shared(
    hashtextextended(r.route || ':' || COALESCE(r.correlation_key, ''), 0))) AS key_guard
WHERE NOT EXISTS (SELECT 1 FROM inbox_done d WHERE d.route = r.route AND d.dedup_key = r.dedup_key)
ORDER BY r.ord
ON CONFLICT (route, dedup_key) DO NOTHING
RETURNING id, route, dedup_key, correlation_key, status, next_attempt_at
), keyed AS (
-- The key row, in key order (so two batches never wait on each other in a cycle). A row
-- that exists points at an older head, except in one race: another insert of the key,
-- whose id was drawn after ours, created it first. Then ours is the head (LEAST). The
-- conflict locks the existing row until commit (claims skip it, settles wait).
INSERT INTO inbox_key AS k (route, correlation_key, slot, head_id, state, due_at)
SELECT DISTINCT ON (n.route, n.key) n.route, n.key, inbox_key_slot(n.key), n.id,
    CASE n.status WHEN 'OPEN' THEN 'ready' ELSE 'blocked' END, n.next_attempt_at
FROM (SELECT new.*, COALESCE(new.correlation_key, '#' || new.id) AS key FROM new
      WHERE new.status = 'OPEN' OR (new.status = 'PARKED' AND $18::boolean)) n
ORDER BY n.route, n.key, n.id
ON CONFLICT (route, correlation_key) DO NOTHING
)
SELECT new.id, old.id, old.payload_digest
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS k(route, dedup_key, ord)
LEFT JOIN new ON new.route = k.route AND new.dedup_key = k.dedup_key
LEFT JOIN LATERAL (
    SELECT o.id, o.payload_digest FROM inbox_entry o WHERE o.route = k.route AND o.dedup_key = k.dedup_key
    UNION ALL
    SELECT d.id, d.payload_digest FROM inbox_done d WHERE d.route = k.route AND d.dedup_key = k.dedup_key
    LIMIT 1) old ON true
ORDER BY k.ord
