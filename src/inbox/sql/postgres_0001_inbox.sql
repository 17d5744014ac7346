-- Inbox schema v1 (PostgreSQL). Times are milliseconds since the Unix epoch.
CREATE TABLE inbox_entry (
    id               BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    route            TEXT    NOT NULL,
    dedup_key        TEXT    NOT NULL,
    correlation_key  TEXT,
    event_type       TEXT,
    schema_version   TEXT,
    body             BYTEA,
    raw_data         BYTEA   NOT NULL,
    attributes       TEXT    NOT NULL,
    message_id       TEXT    NOT NULL,
    publish_time     TEXT,
    delivery_attempt INTEGER,
    payload_digest   TEXT    NOT NULL,
    conflict_of      BIGINT,
    status           TEXT    NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  BIGINT  NOT NULL,
    lease_owner      TEXT,
    lease_token      BIGINT  NOT NULL DEFAULT 0,
    lease_expires_at BIGINT,
    last_error       TEXT,
    received_at      BIGINT  NOT NULL,
    updated_at       BIGINT  NOT NULL,
    finished_at      BIGINT,
    CONSTRAINT inbox_entry_status CHECK (status IN ('OPEN', 'IN_PROGRESS', 'DONE', 'PARKED', 'IGNORED')),
    CONSTRAINT inbox_entry_leased CHECK (status <> 'IN_PROGRESS' OR (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CONSTRAINT inbox_entry_dedup UNIQUE (route, dedup_key)
);
-- Due entries, oldest first.
CREATE INDEX inbox_entry_open ON inbox_entry (route, id) WHERE status = 'OPEN';
-- Expired leases.
CREATE INDEX inbox_entry_in_progress ON inbox_entry (route, lease_expires_at) WHERE status = 'IN_PROGRESS';
-- "No older unresolved entry with this key": only unresolved rows, so the check stays
-- cheap however many finished rows pile up.
CREATE INDEX inbox_entry_unresolved_key ON inbox_entry (route, correlation_key, id)
    WHERE status IN ('OPEN', 'IN_PROGRESS', 'PARKED');
-- Listing by state (parked entries for people, retention for finished ones).
CREATE INDEX inbox_entry_status_id ON inbox_entry (status, id);
CREATE INDEX inbox_entry_finished ON inbox_entry (finished_at) WHERE status IN ('DONE', 'IGNORED');
