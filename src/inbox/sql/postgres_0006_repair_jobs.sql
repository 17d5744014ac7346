-- Repair by filter: a job per request, carried out by whichever instance holds its
-- lease, resumed from last_id by another if that one dies.
CREATE TABLE repair_job (
    id               BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action           TEXT    NOT NULL,
    filter           TEXT    NOT NULL,
    reason           TEXT,
    rate             INTEGER NOT NULL,
    actor            TEXT    NOT NULL,
    state            TEXT    NOT NULL,
    total            BIGINT  NOT NULL,
    moved            BIGINT  NOT NULL DEFAULT 0,
    last_id          BIGINT  NOT NULL DEFAULT 0,
    owner            TEXT,
    lease_expires_at BIGINT,
    created_at       BIGINT  NOT NULL,
    updated_at       BIGINT  NOT NULL,
    finished_at      BIGINT,
    error            TEXT
);
CREATE INDEX repair_job_running ON repair_job (id) WHERE state = 'running';
