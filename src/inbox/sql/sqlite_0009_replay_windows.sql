-- Replay windows (v9, SQLite): the tables of PostgreSQL's migration 10, which says
-- what they are for. Nothing here is read by claims or settles.
CREATE TABLE inbox_replay_window (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    route          TEXT    NOT NULL,
    published_from INTEGER NOT NULL,
    published_to   INTEGER NOT NULL,
    opened_at      INTEGER NOT NULL,
    closes_at      INTEGER NOT NULL,
    closed_at      INTEGER,
    opened_by      TEXT    NOT NULL,
    reason         TEXT    NOT NULL
);
CREATE INDEX inbox_replay_window_route ON inbox_replay_window (route, id);
CREATE TABLE inbox_replay_entry (
    entry_id    INTEGER PRIMARY KEY REFERENCES inbox_entry (id) ON DELETE CASCADE,
    window_id   INTEGER NOT NULL REFERENCES inbox_replay_window (id),
    original_id INTEGER NOT NULL
);
CREATE INDEX inbox_replay_entry_window ON inbox_replay_entry (window_id, entry_id);
