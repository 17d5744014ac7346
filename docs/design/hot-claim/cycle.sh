#!/usr/bin/env bash
# One delivery's writes, batch by batch, on database $1 made by layouts.sh with layout $2:
# per round, insert $4 entries over 1,000 keys, claim them, retry them (back to OPEN),
# claim them again and settle them DONE, each phase one statement. Prints the WAL bytes
# and the statement time per entry of each phase over the second half of $3 rounds (the
# first half fills the table), and how many of the table's updates were HOT.
# The statements write what the product's write (src/inbox/sql/claim_set.sql, settle.sql,
# the key floor a claim raises); they do not search as its claims do: the
# writes only, not the reads that find what to claim.
set -euo pipefail
db=$1 layout=$2 rounds=$3 batch=$4
psql=(psql -qAtX -h 127.0.0.1 -U postgres -d "$db" -v ON_ERROR_STOP=1)

settled_set="" unsettled="TRUE"
if [ "$layout" != today ]; then settled_set="settled = 'DONE',"; unsettled="settled IS NULL"; fi
# Layouts whose triggers keep settled and the lease table write what today's statements write.
case $layout in lease-trigger | lease-generated) settled_set="" ;; esac

insert="INSERT INTO inbox_entry (route, dedup_key, correlation_key, event_type, schema_version, body, raw_data,
    attributes, message_id, publish_time, delivery_attempt, payload_digest, status, attempts, next_attempt_at,
    received_at, updated_at)
SELECT 'r', 'dedup-' || g, 'key-' || (g % 1000), 'work.completed', '1', convert_to(repeat('x', 90), 'UTF8'),
    convert_to(repeat('y', 90), 'UTF8'), '{\"a\":\"b\"}', 'msg-' || g, '2026-08-01T10:00:00Z', 1, md5('dedup-' || g),
    'OPEN', 0, 0, 1, 1
FROM generate_series(:s, :s + $batch - 1) g ON CONFLICT DO NOTHING"

# The claim: the entries, then each key's floor (and, per layout, what says it is in flight).
claimed="UPDATE inbox_entry SET status = 'IN_PROGRESS', lease_owner = 'me', lease_token = lease_token + 1,
        lease_expires_at = 100, attempts = attempts + 1, updated_at = 2
    WHERE id IN (SELECT id FROM inbox_entry WHERE route = 'r' AND $unsettled AND status = 'OPEN' ORDER BY id LIMIT $batch)
    RETURNING id, route, correlation_key"
keys="SELECT DISTINCT ON (correlation_key) correlation_key, id FROM c ORDER BY correlation_key, id"
case $layout in
today | lease-trigger | lease-generated)
    claim="WITH c AS ($claimed), k AS ($keys)
UPDATE inbox_key_floor f SET floor = k.id FROM k WHERE f.route = 'r' AND f.correlation_key = k.correlation_key"
    ended="" ;;
key-row)
    claim="WITH c AS ($claimed), k AS ($keys)
UPDATE inbox_key_floor f SET floor = k.id, in_flight = k.id FROM k WHERE f.route = 'r' AND f.correlation_key = k.correlation_key"
    ended="UPDATE inbox_key_floor f SET in_flight = NULL FROM (SELECT DISTINCT correlation_key FROM s) k
WHERE f.route = 'r' AND f.correlation_key = k.correlation_key" ;;
lease-table | lease-table-lean)
    claim="WITH c AS ($claimed), l AS (INSERT INTO inbox_lease SELECT id, route, correlation_key, 100 FROM c), k AS ($keys)
UPDATE inbox_key_floor f SET floor = k.id FROM k WHERE f.route = 'r' AND f.correlation_key = k.correlation_key"
    ended="DELETE FROM inbox_lease l USING s WHERE l.entry_id = s.id" ;;
esac
in_flight="SELECT id FROM inbox_entry WHERE route = 'r' AND $unsettled AND status = 'IN_PROGRESS' ORDER BY id LIMIT $batch"
retried="UPDATE inbox_entry SET status = 'OPEN', lease_owner = NULL, lease_expires_at = NULL, updated_at = 3,
        next_attempt_at = 0, last_error = 'HTTP 503'
    WHERE id IN ($in_flight)"
settled="UPDATE inbox_entry SET status = 'DONE', $settled_set lease_owner = NULL, lease_expires_at = NULL,
        updated_at = 4, finished_at = 4, first_attempt = '{\"at\":1,\"outcome\":\"done\",\"status\":200}'
    WHERE id IN ($in_flight)"
if [ -n "$ended" ]; then
    retry="WITH s AS ($retried RETURNING id, correlation_key) $ended"
    settle="WITH s AS ($settled RETURNING id, correlation_key) $ended"
else
    retry="$retried"
    settle="$settled"
fi

"${psql[@]}" -c "INSERT INTO inbox_key_floor (route, correlation_key)
    SELECT 'r', 'key-' || g FROM generate_series(0, 999) g ON CONFLICT DO NOTHING" -c CHECKPOINT >/dev/null
phases=(insert claim retry claim2 settle)
declare -A wal us
for p in "${phases[@]}"; do wal[$p]=0; us[$p]=0; done
for ((r = 0; r < rounds; r++)); do
    script=""
    for p in "${phases[@]}"; do
        case $p in insert) st=$insert ;; claim | claim2) st=$claim ;; retry) st=$retry ;; settle) st=$settle ;; esac
        script+="SELECT pg_current_wal_insert_lsn() AS a, clock_timestamp() AS t \gset
$st;
SELECT '$p', pg_current_wal_insert_lsn() - :'a', round(extract(epoch FROM clock_timestamp() - :'t') * 1e6);
"
    done
    out=$("${psql[@]}" -v s=$((r * batch)) <<<"$script")
    if ((r >= rounds / 2)); then
        while IFS='|' read -r p w t; do
            wal[$p]=$((${wal[$p]} + ${w%.*}))
            us[$p]=$((${us[$p]} + ${t%.*}))
        done <<<"$out"
    fi
done
n=$(((rounds - rounds / 2) * batch))
line="$layout:"
total=0
for p in "${phases[@]}"; do
    line+=" $p $((${wal[$p]} / n)) B $((${us[$p]} / n)) µs;"
    total=$((total + ${wal[$p]}))
done
echo "$line WAL per entry $((total / n)) B"
"${psql[@]}" -c "SELECT 'updates ' || n_tup_upd || ', HOT ' || n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'inbox_entry'"
