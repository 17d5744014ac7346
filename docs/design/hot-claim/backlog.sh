#!/usr/bin/env bash
# Fills database $1 (made by layouts.sh with layout $2) with what window.sh, heads.sh and
# handon/setup.sh read: 100,000 finished entries and $4 waiting, over $3 keys; the head of
# every key that matches the SQL condition $5 (on correlation_key) in flight under a
# lease, each key's floor at its head (and, in layout key-row, its in-flight mark); then
# VACUUM ANALYZE.
set -euo pipefail
db=$1 layout=$2 keys=$3 waiting=$4 in_flight=$5
done_col="" done_val=""
if [ "$layout" != today ]; then done_col=", settled" done_val=", 'DONE'"; fi
psql -qAtX -h 127.0.0.1 -U postgres -d "$db" -v ON_ERROR_STOP=1 <<SQL
INSERT INTO inbox_entry (route, dedup_key, correlation_key, body, raw_data, attributes, message_id,
    payload_digest, status, attempts, next_attempt_at, received_at, updated_at, finished_at $done_col)
SELECT 'r', 'done-' || g, 'key-' || (g % $keys), convert_to(repeat('x', 90), 'UTF8'), convert_to(repeat('y', 90), 'UTF8'),
    '{}', 'm', md5(g::text), 'DONE', 1, 0, 1, 1, 1 $done_val
FROM generate_series(1, 100000) g;
INSERT INTO inbox_entry (route, dedup_key, correlation_key, body, raw_data, attributes, message_id,
    payload_digest, status, attempts, next_attempt_at, received_at, updated_at)
SELECT 'r', 'open-' || g, 'key-' || (g % $keys), convert_to(repeat('x', 90), 'UTF8'), convert_to(repeat('y', 90), 'UTF8'),
    '{}', 'm', md5(g::text), 'OPEN', 0, 0, 1, 1
FROM generate_series(1, $waiting) g;
WITH heads AS (SELECT DISTINCT ON (correlation_key) id, correlation_key FROM inbox_entry
               WHERE status = 'OPEN' AND ($in_flight) ORDER BY correlation_key, id)
UPDATE inbox_entry e SET status = 'IN_PROGRESS', lease_owner = 'me', lease_expires_at = 9e15, lease_token = 1
FROM heads h WHERE e.id = h.id;
INSERT INTO inbox_key_floor (route, correlation_key, floor)
SELECT 'r', correlation_key, min(id) FROM inbox_entry WHERE status IN ('OPEN', 'IN_PROGRESS') GROUP BY correlation_key;
SQL
if [ "$layout" = key-row ]; then
    psql -qAtX -h 127.0.0.1 -U postgres -d "$db" -v ON_ERROR_STOP=1 -c "UPDATE inbox_key_floor f SET in_flight = e.id
        FROM inbox_entry e WHERE e.id = f.floor AND e.status = 'IN_PROGRESS'"
fi
psql -qAtX -h 127.0.0.1 -U postgres -d "$db" -v ON_ERROR_STOP=1 -c "VACUUM ANALYZE inbox_entry" -c "VACUUM ANALYZE inbox_key_floor"
