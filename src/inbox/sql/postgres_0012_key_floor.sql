-- The floor of each key: a lower bound of the ids of the key's unresolved entries
-- (OPEN, IN_PROGRESS, PARKED). A claim asks two questions of a key: which entry is its
-- head, and whether an older entry of it is waiting. Both were answered by walking
-- inbox_entry_unresolved_key from the key's first index entry, which steps over (and
-- visits the heap for) every entry of the key settled since the last vacuum; from the
-- floor up, the walk starts at the head. (docs/design/scale-out-inbox.md.)
--
-- The rule: floor <= the id of every unresolved entry of the key, in every committed
-- state. A missing row means floor 0. Only a claim raises a floor, to its key's head,
-- holding the key's lock exclusively and reading in a snapshot taken after it (so no
-- insert of the key is in flight and every committed one is seen), and only if the
-- floor is still what it read. Inserts draw ids above any head, so they never need to
-- lower it; a re-decoded entry that takes a key lowers that key's floor to its own id.
-- Inserts create the row (floor 0) so a claim can list a route's keys from here.
--
-- Binaries of schema 11 run on this one: they neither create rows nor read them, and
-- the instance that keeps the inbox (housekeeping) adds the rows they did not create
-- and lowers a floor above an unresolved entry (a key re-decoded by an older binary)
-- every minute, so a rolling upgrade delays those keys at most that long.
CREATE TABLE inbox_key_floor (
    route           TEXT   NOT NULL,
    correlation_key TEXT   NOT NULL,
    floor           BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (route, correlation_key)
) WITH (fillfactor = 70);

INSERT INTO inbox_key_floor (route, correlation_key, floor)
SELECT route, correlation_key, min(id) FROM inbox_entry
WHERE status IN ('OPEN', 'IN_PROGRESS', 'PARKED') AND correlation_key IS NOT NULL
GROUP BY route, correlation_key;
