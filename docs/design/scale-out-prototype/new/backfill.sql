-- Migration step 2: the key rows of route $1 from today's heads ($2: parked blocks the
-- key on this route). Run with no old-layout writer or claimer on the route (see
-- REPORT.md). The head of a key is its oldest OPEN, IN_PROGRESS or (block-key) PARKED
-- entry; an IN_PROGRESS head keeps its lease (owner, token, expiry) on the key row.
-- One pass over the unresolved rows (the status partial indexes), once per route.
INSERT INTO inbox_key (route, correlation_key, slot, head_id, state, due_at, lease_owner, lease_token, lease_expires_at)
SELECT h.route, h.key, inbox_key_slot(h.key), h.id,
       CASE h.status WHEN 'IN_PROGRESS' THEN 'leased' WHEN 'PARKED' THEN 'blocked' ELSE 'ready' END,
       h.next_attempt_at,
       CASE WHEN h.status = 'IN_PROGRESS' THEN h.lease_owner END,
       h.lease_token,
       CASE WHEN h.status = 'IN_PROGRESS' THEN h.lease_expires_at END
FROM (
    SELECT DISTINCT ON (u.key) u.*
    FROM (SELECT e.id, e.route, e.status, e.next_attempt_at, e.lease_owner, e.lease_token, e.lease_expires_at,
                 COALESCE(e.correlation_key, '#' || e.id) AS key
          FROM inbox_entry e
          WHERE e.route = $1 AND e.status IN ('OPEN', 'IN_PROGRESS', 'PARKED') AND (e.status <> 'PARKED' OR $2)) u
    ORDER BY u.key, u.id
) h
ON CONFLICT (route, correlation_key) DO NOTHING;
-- Entries in flight are OPEN in the new layout (the lease lives on the key row); the
-- lease columns stay as they were for the attempt's settle (fenced on the key row).
UPDATE inbox_entry SET status = 'OPEN' WHERE route = $1 AND status = 'IN_PROGRESS';
