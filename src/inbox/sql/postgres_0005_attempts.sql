-- Every delivery attempt of an entry, deleted with it (retention, purge).
CREATE TABLE inbox_attempt (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    entry_id    BIGINT  NOT NULL REFERENCES inbox_entry (id) ON DELETE CASCADE,
    attempt     INTEGER NOT NULL,
    owner       TEXT    NOT NULL,
    started_at  BIGINT  NOT NULL,
    duration_ms BIGINT  NOT NULL,
    answer      TEXT    NOT NULL,
    status      TEXT    NOT NULL,
    reason      TEXT,
    requests    TEXT    NOT NULL,
    plugin      TEXT
);
CREATE INDEX inbox_attempt_entry ON inbox_attempt (entry_id, id);
-- The last error with what varies between entries masked: failure groups group by it.
ALTER TABLE inbox_entry ADD COLUMN error_fingerprint TEXT;
CREATE INDEX inbox_entry_failing ON inbox_entry (route, error_fingerprint)
    WHERE status IN ('PARKED', 'OPEN') AND error_fingerprint IS NOT NULL;
