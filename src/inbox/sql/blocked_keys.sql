-- The keys of route $1 that are held up, and the oldest of their heads (the head: a
-- key's oldest unresolved entry): a key whose head is PARKED while the route blocks on
-- parked entries ($2), or with an entry waiting behind an older unresolved one of its
-- key. PARKED entries hold nothing back unless $2, so they count only then.
SELECT CAST(COUNT(*) AS BIGINT) AS n, MIN(k.head) AS oldest FROM (
    SELECT MIN(e.received_at) AS head
    FROM inbox_entry e
    WHERE e.route = $1 AND e.correlation_key IS NOT NULL
      AND (e.status IN ('OPEN', 'IN_PROGRESS') OR ($2 AND e.status = 'PARKED'))
    GROUP BY e.correlation_key
    HAVING COUNT(*) > 1 OR MIN(CASE WHEN e.status = 'PARKED' THEN e.id END) = MIN(e.id)
) k
