-- "Is an entry of this key in flight?" answered from the few rows in flight, not by
-- walking every unresolved entry of the key: the claim's check no longer grows with
-- the backlog per key.
CREATE INDEX inbox_entry_key_in_progress ON inbox_entry (route, correlation_key) WHERE status = 'IN_PROGRESS';
