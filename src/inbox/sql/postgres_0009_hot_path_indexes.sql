-- Fewer index entries per delivery. An update that changes the status is never HOT,
-- so it adds an entry to every index whose predicate the new row version meets; a
-- delivery makes two such updates (the claim: OPEN -> IN_PROGRESS, the settle:
-- IN_PROGRESS -> DONE). Two indexes took entries there that no query reads:
--
-- "No older entry of this key waiting" only asks about OPEN and PARKED entries (the
-- claim asks about one in flight through inbox_entry_key_in_progress), so its index
-- no longer takes in-flight row versions: one entry fewer per claim.
DROP INDEX inbox_entry_unresolved_key;
CREATE INDEX inbox_entry_unresolved_key ON inbox_entry (route, correlation_key, id)
    WHERE status IN ('OPEN', 'PARKED');
-- Listing and repairing by state need an index for the states that are few among
-- many: waiting, parked and ignored entries. In-flight entries are found through
-- inbox_entry_in_progress and finished ones through inbox_entry_finished or the
-- primary key (they are most of the table), so the claim and the settle no longer
-- add an entry here: one fewer each.
DROP INDEX inbox_entry_status_id;
CREATE INDEX inbox_entry_status_id ON inbox_entry (status, id) WHERE status IN ('OPEN', 'PARKED', 'IGNORED');
