#!/usr/bin/env bash
# The ordered claim's walk of the heads (src/inbox/postgres.rs, CLAIM_HEADS_SQL: a route
# of few keys is claimed key by key), today and with status in no index (layout key-row
# of layouts.sh): EXPLAIN (ANALYZE, BUFFERS) under the hot path's plan settings. Database
# $1, layout $2; $3 entries waiting over 10 keys behind 100,000 finished ones; the heads
# of half the keys in flight; the claim asks for 16.
set -euo pipefail
db=$1 layout=$2 backlog=$3
psql=(psql -qAtX -h 127.0.0.1 -U postgres -d "$db" -v ON_ERROR_STOP=1)
done_col="" done_val=""
if [ "$layout" != today ]; then done_col=", settled" done_val=", 'DONE'"; fi
"${psql[@]}" <<SQL
INSERT INTO inbox_entry (route, dedup_key, correlation_key, body, raw_data, attributes, message_id,
    payload_digest, status, attempts, next_attempt_at, received_at, updated_at, finished_at $done_col)
SELECT 'r', 'done-' || g, 'key-' || (g % 10), convert_to(repeat('x', 90), 'UTF8'), convert_to(repeat('y', 90), 'UTF8'),
    '{}', 'm', md5(g::text), 'DONE', 1, 0, 1, 1, 1 $done_val
FROM generate_series(1, 100000) g;
INSERT INTO inbox_entry (route, dedup_key, correlation_key, body, raw_data, attributes, message_id,
    payload_digest, status, attempts, next_attempt_at, received_at, updated_at)
SELECT 'r', 'open-' || g, 'key-' || (g % 10), convert_to(repeat('x', 90), 'UTF8'), convert_to(repeat('y', 90), 'UTF8'),
    '{}', 'm', md5(g::text), 'OPEN', 0, 0, 1, 1
FROM generate_series(1, $backlog) g;
WITH heads AS (SELECT DISTINCT ON (correlation_key) id, correlation_key FROM inbox_entry
               WHERE status = 'OPEN' AND correlation_key IN ('key-0', 'key-1', 'key-2', 'key-3', 'key-4')
               ORDER BY correlation_key, id)
UPDATE inbox_entry e SET status = 'IN_PROGRESS', lease_owner = 'me', lease_expires_at = 9e15, lease_token = 1
FROM heads h WHERE e.id = h.id;
INSERT INTO inbox_key_floor (route, correlation_key, floor)
SELECT 'r', correlation_key, min(id) FROM inbox_entry WHERE status IN ('OPEN', 'IN_PROGRESS') GROUP BY correlation_key;
SQL
if [ "$layout" = key-row ]; then
    "${psql[@]}" -c "UPDATE inbox_key_floor f SET in_flight = e.id FROM inbox_entry e
        WHERE e.id = f.floor AND e.status = 'IN_PROGRESS'"
    # The head: the key's first unsettled or parked entry from its floor; in flight is
    # the key row's own column, read in the same walk.
    head_states="(e.settled IS NULL OR (e.settled = 'PARKED' AND \$3))"
    open_head="c.settled IS NULL AND c.status = 'OPEN'"
    in_flight="c.in_flight IS NULL"
    floor_cols="f.floor, f.in_flight"
    head_cols="e.settled,"
else
    head_states="e.status IN ('OPEN', 'PARKED') AND (e.status = 'OPEN' OR \$3)"
    open_head="c.status = 'OPEN'"
    in_flight="NOT EXISTS (SELECT 1 FROM inbox_entry o WHERE o.route = \$1 AND o.correlation_key = c.correlation_key
                   AND o.status = 'IN_PROGRESS' AND o.id >= c.floor)"
    floor_cols="f.floor"
    head_cols=""
fi
"${psql[@]}" -c "VACUUM ANALYZE inbox_entry" -c "VACUUM ANALYZE inbox_key_floor"
"${psql[@]}" <<SQL
SET plan_cache_mode TO force_generic_plan; SET enable_seqscan TO off;
PREPARE heads_claim(text, bigint, boolean, bigint, text[], bigint, bigint) AS
WITH head AS (
    SELECT h.*, $floor_cols FROM inbox_key_floor f CROSS JOIN LATERAL (
        SELECT e.id, e.correlation_key, $head_cols e.status, e.next_attempt_at FROM inbox_entry e
        WHERE e.route = \$1 AND e.correlation_key = f.correlation_key AND e.id >= f.floor AND $head_states
        ORDER BY e.id LIMIT 1) h
    WHERE f.route = \$1 AND (\$7::bigint IS NULL
        OR (hashtextextended(f.correlation_key, 0) & 9223372036854775807) % \$7::bigint = \$6::bigint)
), candidate AS (
    SELECT c.id, c.correlation_key FROM head c
    WHERE $open_head AND c.next_attempt_at <= \$2 AND NOT (c.correlation_key = ANY(\$5))
      AND NOT EXISTS (SELECT 1 FROM inbox_route_pause p WHERE p.route = \$1)
      AND $in_flight
    ORDER BY c.id LIMIT \$4
), held AS (
    SELECT c.correlation_key FROM candidate c
    WHERE pg_try_advisory_xact_lock(hashtextextended(\$1 || ':' || c.correlation_key, 0))
), walked AS (
    SELECT count(*) AS keys FROM inbox_key_floor f WHERE f.route = \$1
)
SELECT c.id, c.correlation_key, walked.keys FROM walked
LEFT JOIN candidate c ON c.correlation_key IN (SELECT correlation_key FROM held);
EXECUTE heads_claim('r', 10, false, 16, '{}', NULL, NULL);
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY ON) EXECUTE heads_claim('r', 10, false, 16, '{}', NULL, NULL);
SQL
