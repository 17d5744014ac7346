-- Paused routes (v4, SQLite): while a route has a row here, its entries are not
-- claimed; ingest goes on. Resume deletes the row.
CREATE TABLE inbox_route_pause (
    route     TEXT    PRIMARY KEY,
    paused_at INTEGER NOT NULL,
    paused_by TEXT    NOT NULL,
    reason    TEXT    NOT NULL
);
