-- Replay windows (v10, PostgreSQL). A team that seeks a subscription back on purpose
-- (to redo what a bug spoiled) wants the messages of a time window delivered again,
-- not absorbed as the duplicates they are. While a window is open, a redelivery of a
-- message published inside it, whose entry arrived before the window opened, is
-- stored once more as a new entry under the dedup key `<key>#replay-<window>`; every
-- other redelivery stays a duplicate. Nothing here is read by claims or settles.
CREATE TABLE inbox_replay_window (
    id             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    route          TEXT   NOT NULL,
    -- Publish times taken, from (inclusive) to (exclusive), in milliseconds.
    published_from BIGINT NOT NULL,
    published_to   BIGINT NOT NULL,
    opened_at      BIGINT NOT NULL,
    -- Redeliveries after this are duplicates again; closed_at ends it earlier.
    closes_at      BIGINT NOT NULL,
    closed_at      BIGINT,
    opened_by      TEXT   NOT NULL,
    reason         TEXT   NOT NULL
);
CREATE INDEX inbox_replay_window_route ON inbox_replay_window (route, id);
-- Which entries a window made, and from which entry: deleted with the entry it made
-- (retention, purge); the original may go first.
CREATE TABLE inbox_replay_entry (
    entry_id    BIGINT PRIMARY KEY REFERENCES inbox_entry (id) ON DELETE CASCADE,
    window_id   BIGINT NOT NULL REFERENCES inbox_replay_window (id),
    original_id BIGINT NOT NULL
);
CREATE INDEX inbox_replay_entry_window ON inbox_replay_entry (window_id, entry_id);
