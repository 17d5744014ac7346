-- Cheaper statistics. The inbox churns: draining a backlog changes a tenth of the table
-- every few seconds, so ANALYZE runs often (PgStore::maintain_tables), and at the
-- default target (100) it samples 30,000 rows and builds statistics for every column,
-- the wide ones included. Measured on 200,000 rows on 2 cores, idle: 290 ms per ANALYZE;
-- with these targets, 28-47 ms, and the planner still sees the shares of each status
-- and the number of correlation keys (999 of 1,000).
--
-- The columns that claims, lists, counts and retention filter or order by: a sample of
-- 6,000 rows (300 times the largest target).
ALTER TABLE inbox_entry
    ALTER COLUMN id SET STATISTICS 20,
    ALTER COLUMN route SET STATISTICS 20,
    ALTER COLUMN correlation_key SET STATISTICS 20,
    ALTER COLUMN status SET STATISTICS 20,
    ALTER COLUMN next_attempt_at SET STATISTICS 20,
    ALTER COLUMN lease_owner SET STATISTICS 20,
    ALTER COLUMN lease_token SET STATISTICS 20,
    ALTER COLUMN lease_expires_at SET STATISTICS 20,
    ALTER COLUMN received_at SET STATISTICS 20,
    ALTER COLUMN updated_at SET STATISTICS 20,
    ALTER COLUMN finished_at SET STATISTICS 20,
    ALTER COLUMN not_yet_since SET STATISTICS 20,
    ALTER COLUMN error_fingerprint SET STATISTICS 20,
    ALTER COLUMN conflict_of SET STATISTICS 20,
    ALTER COLUMN attempts SET STATISTICS 20,
    ALTER COLUMN delivery_attempt SET STATISTICS 20;
-- The payload and what is only shown or looked up by its unique index: no statistics.
ALTER TABLE inbox_entry
    ALTER COLUMN dedup_key SET STATISTICS 0,
    ALTER COLUMN event_type SET STATISTICS 0,
    ALTER COLUMN schema_version SET STATISTICS 0,
    ALTER COLUMN body SET STATISTICS 0,
    ALTER COLUMN raw_data SET STATISTICS 0,
    ALTER COLUMN attributes SET STATISTICS 0,
    ALTER COLUMN message_id SET STATISTICS 0,
    ALTER COLUMN publish_time SET STATISTICS 0,
    ALTER COLUMN payload_digest SET STATISTICS 0,
    ALTER COLUMN last_error SET STATISTICS 0;
