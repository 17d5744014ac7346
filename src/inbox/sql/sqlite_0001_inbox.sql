-- Inbox schema v1 (SQLite). Times are milliseconds since the Unix epoch.
CREATE TABLE inbox_entry (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    route            TEXT    NOT NULL,
    dedup_key        TEXT    NOT NULL,
    correlation_key  TEXT,
    event_type       TEXT,
    schema_version   TEXT,
    body             BLOB,
    raw_data         BLOB    NOT NULL,
    attributes       TEXT    NOT NULL,
    message_id       TEXT    NOT NULL,
    publish_time     TEXT,
    delivery_attempt INTEGER,
    payload_digest   TEXT    NOT NULL,
    conflict_of      INTEGER,
    status           TEXT    NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  INTEGER NOT NULL,
    lease_owner      TEXT,
    lease_token      INTEGER NOT NULL DEFAULT 0,
    lease_expires_at INTEGER,
    last_error       TEXT,
    received_at      INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    finished_at      INTEGER,
    CONSTRAINT inbox_entry_status CHECK (status IN ('OPEN', 'IN_PROGRESS', 'DONE', 'PARKED', 'IGNORED')),
    CONSTRAINT inbox_entry_leased CHECK (status <> 'IN_PROGRESS' OR (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CONSTRAINT inbox_entry_dedup UNIQUE (route, dedup_key)
);
CREATE INDEX inbox_entry_open ON inbox_entry (route, id) WHERE status = 'OPEN';
CREATE INDEX inbox_entry_in_progress ON inbox_entry (route, lease_expires_at) WHERE status = 'IN_PROGRESS';
CREATE INDEX inbox_entry_unresolved_key ON inbox_entry (route, correlation_key, id)
    WHERE status IN ('OPEN', 'IN_PROGRESS', 'PARKED');
CREATE INDEX inbox_entry_status_id ON inbox_entry (status, id);
CREATE INDEX inbox_entry_finished ON inbox_entry (finished_at) WHERE status IN ('DONE', 'IGNORED');
