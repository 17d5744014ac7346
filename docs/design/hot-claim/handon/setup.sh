#!/usr/bin/env bash
# Database $1 with today's migrations (../layouts.sh today), 100,000 finished entries and
# 200,000 waiting over 1,000 keys, and the heads of 223 keys in flight, their floors at
# their heads: the state a settle batch meets before it hands its keys on.
set -euo pipefail
db=$1
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$here/../layouts.sh" "$db" today
psql -qAtX -h 127.0.0.1 -U postgres -d "$db" -v ON_ERROR_STOP=1 <<'SQL'
INSERT INTO inbox_entry (route, dedup_key, correlation_key, body, raw_data, attributes, message_id,
    payload_digest, status, attempts, next_attempt_at, received_at, updated_at, finished_at)
SELECT 'r', 'done-' || g, 'key-' || (g % 1000), convert_to(repeat('x', 90), 'UTF8'), convert_to(repeat('y', 90), 'UTF8'),
    '{}', 'm', md5(g::text), 'DONE', 1, 0, 1, 1, 1 FROM generate_series(1, 100000) g;
INSERT INTO inbox_entry (route, dedup_key, correlation_key, body, raw_data, attributes, message_id,
    payload_digest, status, attempts, next_attempt_at, received_at, updated_at)
SELECT 'r', 'open-' || g, 'key-' || (g % 1000), convert_to(repeat('x', 90), 'UTF8'), convert_to(repeat('y', 90), 'UTF8'),
    '{}', 'm', md5(g::text), 'OPEN', 0, 0, 1, 1 FROM generate_series(1, 200000) g;
WITH heads AS (SELECT DISTINCT ON (correlation_key) id, correlation_key FROM inbox_entry
               WHERE status = 'OPEN' AND correlation_key < 'key-3' ORDER BY correlation_key, id)
UPDATE inbox_entry e SET status = 'IN_PROGRESS', lease_owner = 'me', lease_expires_at = 9e15, lease_token = 1
FROM heads h WHERE e.id = h.id;
INSERT INTO inbox_key_floor (route, correlation_key, floor)
SELECT 'r', correlation_key, min(id) FROM inbox_entry WHERE status IN ('OPEN', 'IN_PROGRESS') GROUP BY correlation_key;
VACUUM ANALYZE inbox_entry; VACUUM ANALYZE inbox_key_floor;
SQL
