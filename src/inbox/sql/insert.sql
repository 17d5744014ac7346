INSERT INTO inbox_entry (
    route, dedup_key, correlation_key, event_type, schema_version, body, raw_data, attributes,
    message_id, publish_time, delivery_attempt, payload_digest, conflict_of, status, attempts,
    next_attempt_at, last_error, received_at, updated_at, finished_at, error_fingerprint)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, 0, $15, $16, $15, $15, $17, $18)
ON CONFLICT (route, dedup_key) DO NOTHING
RETURNING id, CAST(NULL AS TEXT) AS payload_digest, CAST(NULL AS INTEGER) AS replay_open
