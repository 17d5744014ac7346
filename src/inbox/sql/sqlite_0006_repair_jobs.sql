-- Repair by filter: a job per request, carried out by whichever instance holds its
-- lease, resumed from last_id by another if that one dies.
CREATE TABLE repair_job (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    action           TEXT    NOT NULL,
    filter           TEXT    NOT NULL,
    reason           TEXT,
    rate             INTEGER NOT NULL,
    actor            TEXT    NOT NULL,
    state            TEXT    NOT NULL,
    total            INTEGER  NOT NULL,
    moved            INTEGER  NOT NULL DEFAULT 0,
    last_id          INTEGER  NOT NULL DEFAULT 0,
    owner            TEXT,
    lease_expires_at INTEGER,
    created_at       INTEGER  NOT NULL,
    updated_at       INTEGER  NOT NULL,
    finished_at      INTEGER,
    error            TEXT
);
CREATE INDEX repair_job_running ON repair_job (id) WHERE state = 'running';
