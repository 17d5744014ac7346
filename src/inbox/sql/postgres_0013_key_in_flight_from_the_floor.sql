-- "Is an entry of this key in flight?" asked from the key's floor up: every entry of a
-- key in flight is at or above its floor (sql/postgres_0012_key_floor.sql), and every
-- entry the index still holds for the key's earlier attempts, dead until a vacuum (a
-- claim adds one per delivery), is below it. Keyed on the route and key alone, the
-- question stepped over all of those (40,000 heap visits per claim, 10 of its 11 ms,
-- on a 200,000-entry backlog of 10 keys with 60,000 delivered since the last vacuum).
--
-- Built again under its own name: between the two statements the claims of every
-- binary answer the question without an index, by reading the rows in flight through
-- the table, until the build ends (seconds on a large table).
DROP INDEX CONCURRENTLY IF EXISTS inbox_entry_key_in_progress;
CREATE INDEX CONCURRENTLY inbox_entry_key_in_progress ON inbox_entry (route, correlation_key, id)
    WHERE status = 'IN_PROGRESS';
