#!/usr/bin/env bash
# The ordered claim's walk of the heads (src/inbox/postgres.rs, CLAIM_HEADS_SQL: a route
# of few keys is claimed key by key), today and with status in no index (layout key-row
# of layouts.sh): EXPLAIN (ANALYZE, BUFFERS) under the hot path's plan settings. Database
# $1, layout $2; $3 entries waiting over 10 keys behind 100,000 finished ones; the heads
# of half the keys in flight; the claim asks for 16.
set -euo pipefail
db=$1 layout=$2 backlog=$3
psql=(psql -qAtX -h 127.0.0.1 -U postgres -d "$db" -v ON_ERROR_STOP=1)
"$(dirname "${BASH_SOURCE[0]}")/backlog.sh" "$db" "$layout" 10 "$backlog" \
    "correlation_key IN ('key-0', 'key-1', 'key-2', 'key-3', 'key-4')"
if [ "$layout" = key-row ]; then
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
