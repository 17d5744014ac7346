WITH v AS (
    SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[], $5::bigint[], $6::bigint[],
            $7::text[], $8::bigint[], $9::text[], $10::text[], $11::text[], $12::bytea[], $13::boolean[],
            $14::bigint[], $15::text[], $16::text[])
        AS v(id, owner, token, status, now, next, error, finished, ck, et, sv, body, reset, nys, dedup, fp)
), settled AS (
    UPDATE inbox_entry e SET
        status = v.status,
        lease_owner = NULL,
        lease_expires_at = NULL,
        updated_at = v.now,
        next_attempt_at = COALESCE(v.next, e.next_attempt_at),
        last_error = COALESCE(v.error, e.last_error),
        finished_at = v.finished,
        correlation_key = COALESCE(v.ck, e.correlation_key),
        event_type = COALESCE(v.et, e.event_type),
        schema_version = COALESCE(v.sv, e.schema_version),
        body = COALESCE(v.body, e.body),
        attempts = CASE WHEN v.reset THEN 0 ELSE e.attempts END,
        not_yet_since = COALESCE(e.not_yet_since, v.nys),
        dedup_key = COALESCE(v.dedup, e.dedup_key),
        error_fingerprint = COALESCE(v.fp, e.error_fingerprint)
    FROM v
    WHERE e.id = v.id AND e.status = 'IN_PROGRESS' AND e.lease_owner = v.owner AND e.lease_token = v.token
    RETURNING e.id
), recorded AS (
    INSERT INTO inbox_attempt (entry_id, attempt, owner, started_at, duration_ms, answer, status, reason, requests, plugin)
    SELECT a.* FROM unnest($17::bigint[], $18::integer[], $19::text[], $20::bigint[], $21::bigint[], $22::text[],
            $23::text[], $24::text[], $25::text[], $26::text[])
        AS a(entry_id, attempt, owner, started_at, duration_ms, answer, status, reason, requests, plugin)
    WHERE a.entry_id IN (SELECT id FROM settled)
)
SELECT id FROM settled
