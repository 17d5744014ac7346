-- Variant (b): finished rows leave inbox_entry for inbox_done, partitioned by day.
-- The foreign keys into inbox_entry must go first: ON DELETE CASCADE would delete the
-- attempt history (and replay links) of every entry moved out.
ALTER TABLE inbox_attempt DROP CONSTRAINT inbox_attempt_entry_id_fkey;
ALTER TABLE inbox_replay_entry DROP CONSTRAINT inbox_replay_entry_entry_id_fkey;
CREATE TABLE inbox_done (LIKE inbox_entry INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (finished_at);
ALTER TABLE inbox_done ALTER COLUMN finished_at SET NOT NULL;
CREATE TABLE inbox_done_default PARTITION OF inbox_done DEFAULT;
CREATE INDEX inbox_done_id ON inbox_done (id);
CREATE INDEX inbox_done_dedup ON inbox_done (route, dedup_key);
-- Today's partition (the driver creates it: inbox_done_<day> FOR VALUES FROM (day) TO (day + 1 day)).
