#!/usr/bin/env bash
# $3 rounds on database $1 (made by setup.sh) of: settle the entries in flight in one
# statement, take their keys' locks, hand each key its next entry with variant $2 (of
# variant.py: `today` is CLAIM_NEXT_SQL of src/inbox/postgres.rs; the others change it as
# their names say), commit. Prints the hand-on's mean
# time per round and per entry. Under the hot path's plan settings (generic plans, no
# sequential scans). `reads_only` claims nothing, so the round then runs `today` untimed
# to move on. A database lasts about 150 rounds (200 entries per key).
set -euo pipefail
db=$1 v=$2 n=$3
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
{
    echo "SET plan_cache_mode TO force_generic_plan; SET enable_seqscan TO off;"
    "$here/variant.py" "$v"
    [ "$v" = reads_only ] && "$here/variant.py" today
    for ((i = 0; i < n; i++)); do
        cat <<SQL
BEGIN;
SELECT array_agg(id ORDER BY correlation_key) AS ids, array_agg(correlation_key ORDER BY correlation_key) AS keys
FROM inbox_entry WHERE status = 'IN_PROGRESS' \\gset
SELECT count(*) FROM (SELECT pg_advisory_xact_lock(hashtextextended('r:' || k, 0)) FROM unnest(:'keys'::text[]) k) x \\g /dev/null
UPDATE inbox_entry SET status = 'DONE', lease_owner = NULL, lease_expires_at = NULL, finished_at = 5, updated_at = 5
WHERE id = ANY(:'ids'::bigint[]);
\\timing on
EXECUTE claim_next_$v('r', 10, true, false, 1000, 'me', 30000, :'ids', :'keys') \\g /dev/null
\\timing off
SQL
        [ "$v" = reads_only ] && echo "EXECUTE claim_next_today('r', 10, true, false, 1000, 'me', 30000, :'ids', :'keys') \\g /dev/null"
        echo "COMMIT;"
    done
} | psql -qAtX -h 127.0.0.1 -U postgres -d "$db" -v ON_ERROR_STOP=1 2>&1 |
    awk -v v="$v" '/^Time:/ { s += $2; n++ } END { printf "%s: %d rounds, hand-on %.2f ms per round, %.1f µs per entry (223)\n", v, n, s / n, s / n / 223 * 1000 }'
