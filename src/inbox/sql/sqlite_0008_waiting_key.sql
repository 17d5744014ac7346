-- "No older entry of this key waiting" only asks about OPEN and PARKED entries (the
-- claim asks about one in flight through inbox_entry_key_in_progress), so its index
-- no longer takes in-flight rows: a claim and a settle each write one index entry
-- fewer. (PostgreSQL's migration 9 does the same, with its reasons.)
DROP INDEX inbox_entry_unresolved_key;
CREATE INDEX inbox_entry_unresolved_key ON inbox_entry (route, correlation_key, id)
    WHERE status IN ('OPEN', 'PARKED');
