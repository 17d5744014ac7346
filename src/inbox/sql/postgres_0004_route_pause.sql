-- Paused routes (v4, PostgreSQL): while a route has a row here, no instance claims its
-- entries (the claim checks it); ingest goes on. Resume deletes the row. Who paused it
-- and why is also in the audit log.
CREATE TABLE inbox_route_pause (
    route     TEXT   PRIMARY KEY,
    paused_at BIGINT NOT NULL,
    paused_by TEXT   NOT NULL,
    reason    TEXT   NOT NULL
);
