-- The keys of route $1 that are held up, and the oldest of their heads (the head: a
-- key's oldest unresolved entry): a key whose head is PARKED while the route blocks on
-- parked entries ($2), or with an entry waiting behind an older unresolved one of its
-- key. PARKED entries hold nothing back unless $2, so they count only then. A part
-- per status, so each reads its status's partial index, not the table's history.
SELECT CAST(COUNT(*) AS BIGINT) AS n, MIN(k.head) AS oldest FROM (
    SELECT MIN(e.received_at) AS head
    FROM (
        SELECT correlation_key, id, status, received_at FROM inbox_entry
        WHERE route = $1 AND correlation_key IS NOT NULL AND status = 'OPEN'
        UNION ALL
        SELECT correlation_key, id, status, received_at FROM inbox_entry
        WHERE route = $1 AND correlation_key IS NOT NULL AND status = 'IN_PROGRESS'
        UNION ALL
        SELECT correlation_key, id, status, received_at FROM inbox_entry
        WHERE route = $1 AND correlation_key IS NOT NULL AND status = 'PARKED' AND $2
    ) e
    GROUP BY e.correlation_key
    HAVING COUNT(*) > 1 OR MIN(CASE WHEN e.status = 'PARKED' THEN e.id END) = MIN(e.id)
) k
