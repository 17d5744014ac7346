#!/usr/bin/env bash
# The ordered claim's window (src/inbox/postgres.rs, CLAIM_KEYS_SQL, step one) on a deep
# backlog with every key's head in flight, today and with status in no index (layout
# key-row of layouts.sh): EXPLAIN (ANALYZE, BUFFERS) under the hot path's plan settings,
# generic plans and no sequential scans. Database $1, layout $2; $3 entries waiting over
# 1,000 keys behind 100,000 finished ones; the claim asks for 256.
set -euo pipefail
db=$1 layout=$2 backlog=$3
psql=(psql -qAtX -h 127.0.0.1 -U postgres -d "$db" -v ON_ERROR_STOP=1)
unsettled="TRUE"
if [ "$layout" != today ]; then unsettled="settled IS NULL"; fi
"$(dirname "${BASH_SOURCE[0]}")/backlog.sh" "$db" "$layout" 1000 "$backlog" TRUE
if [ "$layout" = key-row ]; then
    # One hashed pass over the route's key rows, as today's over the entries in flight.
    in_flight="e.correlation_key IN (SELECT f.correlation_key FROM inbox_key_floor f
                WHERE f.route = \$1 AND f.in_flight IS NOT NULL)"
    # The window counts the entries in flight too: status is in no index, so counting
    # only OPEN ones would visit the heap for each.
    window_status=""
    older="(o.settled IS NULL OR (\$4 AND o.settled = 'PARKED'))"
else
    in_flight="EXISTS (SELECT 1 FROM inbox_entry o
              WHERE o.route = e.route AND o.correlation_key = e.correlation_key AND o.status = 'IN_PROGRESS')"
    window_status="AND w.status = 'OPEN'"
    older="o.status IN ('OPEN', 'PARKED') AND (o.status = 'OPEN' OR (\$4 AND o.status = 'PARKED'))"
fi
"${psql[@]}" <<SQL
SET plan_cache_mode TO force_generic_plan; SET enable_seqscan TO off;
PREPARE window_claim(text, bigint, boolean, boolean, bigint, bigint, bigint, bigint) AS
WITH candidate AS (
  SELECT c.id, c.correlation_key FROM inbox_entry c WHERE c.id IN (
    SELECT e.id FROM inbox_entry e
    WHERE e.route = \$1 AND $unsettled AND e.status = 'OPEN' AND e.next_attempt_at <= \$2
      AND (e.route, e.id) <= (\$1, COALESCE((
        SELECT w.id FROM inbox_entry w WHERE w.route = \$1 AND ${unsettled/settled/w.settled} $window_status
        ORDER BY w.id OFFSET \$6 - 1 LIMIT 1), 9223372036854775807))
      AND (e.correlation_key IS NULL OR \$8::bigint IS NULL
           OR (hashtextextended(e.correlation_key, 0) & 9223372036854775807) % \$8::bigint = \$7::bigint)
      AND NOT EXISTS (SELECT 1 FROM inbox_route_pause p WHERE p.route = \$1)
      AND (NOT \$3 OR e.correlation_key IS NULL OR (
            NOT $in_flight
            AND NOT EXISTS (
              SELECT 1 FROM inbox_entry o
              WHERE o.route = e.route AND o.correlation_key = e.correlation_key AND o.id < e.id
                AND $older)))
    ORDER BY e.id
    LIMIT \$5
)), held AS (
  SELECT k.correlation_key FROM (
    SELECT DISTINCT correlation_key FROM candidate WHERE correlation_key IS NOT NULL) k
  WHERE pg_try_advisory_xact_lock(hashtextextended(\$1 || ':' || k.correlation_key, 0)))
SELECT id, correlation_key FROM candidate
WHERE correlation_key IS NULL OR correlation_key IN (SELECT correlation_key FROM held);
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY ON) EXECUTE window_claim('r', 10, true, false, 256, 4096, NULL, NULL);
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY ON) EXECUTE window_claim('r', 10, true, false, 256, 4096, NULL, NULL);
SQL
