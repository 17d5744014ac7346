-- The status through a sub-select, so the row is reached by its id whatever the
-- statistics say (postgres.rs, BY_ID_STATEMENTS).
UPDATE inbox_entry SET
    status = $4,
    lease_owner = NULL,
    lease_expires_at = NULL,
    updated_at = $5,
    next_attempt_at = COALESCE($6, next_attempt_at),
    last_error = COALESCE($7, last_error),
    finished_at = $8,
    correlation_key = COALESCE($9, correlation_key),
    event_type = COALESCE($10, event_type),
    schema_version = COALESCE($11, schema_version),
    body = COALESCE($12, body),
    attempts = CASE WHEN $13 THEN 0 ELSE attempts END,
    not_yet_since = COALESCE(not_yet_since, $14),
    dedup_key = COALESCE($15, dedup_key),
    error_fingerprint = COALESCE($16, error_fingerprint),
    first_attempt = COALESCE(first_attempt, $17)
WHERE id = $1 AND status = (SELECT 'IN_PROGRESS') AND lease_owner = $2 AND lease_token = $3
RETURNING first_attempt
