#!/usr/bin/env bash
# Creates database $1 with the inbox's PostgreSQL migrations (src/inbox/sql/postgres_*.sql)
# and then layout $2 on top:
#   today       as the migrations leave it
#   key-row     status in no index: a column `settled` (NULL while OPEN or IN_PROGRESS)
#               carries what the partial indexes need; "a key is in flight" is
#               inbox_key_floor.in_flight; the table keeps half of each page free
#   lease-table the same, but what is in flight is a row of a narrow inbox_lease
#               (entry, route, key, expiry), indexed by key and by expiry
#   lease-table-lean  the same without the expiry index
#   lease-trigger     lease-table-lean kept by a trigger, settled by a trigger too
#   lease-generated   lease-table-lean kept by a trigger, settled a generated column
set -euo pipefail
db=$1 layout=$2
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
sql="$here/../../../src/inbox/sql"
admin=(psql -qX -h 127.0.0.1 -U postgres -d postgres -v ON_ERROR_STOP=1)
"${admin[@]}" -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" 2>/dev/null
run=(psql -qX -h 127.0.0.1 -U postgres -d "$db" -v ON_ERROR_STOP=1)
for f in "$sql"/postgres_00*.sql; do "${run[@]}" -f "$f" >/dev/null; done

status_out_of_indexes="
DROP INDEX inbox_entry_open; DROP INDEX inbox_entry_unresolved_key; DROP INDEX inbox_entry_in_progress;
DROP INDEX inbox_entry_key_in_progress; DROP INDEX inbox_entry_status_id; DROP INDEX inbox_entry_finished;
DROP INDEX inbox_entry_failing;
ALTER TABLE inbox_entry ADD COLUMN settled TEXT;
CREATE INDEX inbox_entry_waiting ON inbox_entry (route, id) WHERE settled IS NULL;
CREATE INDEX inbox_entry_unresolved_key ON inbox_entry (route, correlation_key, id)
    WHERE settled IS NULL OR settled = 'PARKED';
CREATE INDEX inbox_entry_status_id ON inbox_entry (settled, id) WHERE settled IN ('PARKED', 'IGNORED');
CREATE INDEX inbox_entry_finished ON inbox_entry (finished_at) WHERE settled IN ('DONE', 'IGNORED');
CREATE INDEX inbox_entry_failing ON inbox_entry (route, error_fingerprint)
    WHERE (settled IS NULL OR settled = 'PARKED') AND error_fingerprint IS NOT NULL;
ALTER TABLE inbox_entry SET (fillfactor = 50);"

case $layout in
today) ;;
key-row)
    "${run[@]}" -c "$status_out_of_indexes" -c "ALTER TABLE inbox_key_floor ADD COLUMN in_flight BIGINT" ;;
lease-table)
    "${run[@]}" -c "$status_out_of_indexes" -c "
CREATE TABLE inbox_lease (entry_id BIGINT PRIMARY KEY, route TEXT NOT NULL, correlation_key TEXT,
                          expires_at BIGINT NOT NULL);
CREATE INDEX inbox_lease_key ON inbox_lease (route, correlation_key);
CREATE INDEX inbox_lease_expiry ON inbox_lease (route, expires_at);" ;;
lease-table-lean)
    # lease-table without the expiry index: the table holds only what is in flight (at
    # most the routes' concurrency), so a release can read a route's rows whole.
    "${run[@]}" -c "$status_out_of_indexes" -c "
CREATE TABLE inbox_lease (entry_id BIGINT PRIMARY KEY, route TEXT NOT NULL, correlation_key TEXT,
                          expires_at BIGINT NOT NULL);
CREATE INDEX inbox_lease_key ON inbox_lease (route, correlation_key);" ;;
lease-trigger | lease-generated)
    # The lease table kept by a trigger on inbox_entry, so that every writer (plain SQL
    # too) keeps it true without knowing of it; settled by a trigger as well, or as a
    # generated column (which PostgreSQL computes in every insert and update).
    if [ "$layout" = lease-generated ]; then
        settled_col="ALTER TABLE inbox_entry ADD COLUMN settled TEXT GENERATED ALWAYS AS
    (CASE WHEN status IN ('OPEN', 'IN_PROGRESS') THEN NULL ELSE status END) STORED;"
        settled_trigger=""
    else
        settled_col="ALTER TABLE inbox_entry ADD COLUMN settled TEXT;"
        settled_trigger="
CREATE FUNCTION inbox_entry_settled() RETURNS trigger LANGUAGE plpgsql AS \$\$
BEGIN
    NEW.settled := CASE WHEN NEW.status IN ('OPEN', 'IN_PROGRESS') THEN NULL ELSE NEW.status END;
    RETURN NEW;
END \$\$;
CREATE TRIGGER inbox_entry_settled_insert BEFORE INSERT ON inbox_entry
    FOR EACH ROW EXECUTE FUNCTION inbox_entry_settled();
CREATE TRIGGER inbox_entry_settled_update BEFORE UPDATE OF status ON inbox_entry
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION inbox_entry_settled();"
    fi
    "${run[@]}" -c "${status_out_of_indexes/ALTER TABLE inbox_entry ADD COLUMN settled TEXT;/$settled_col}" -c "$settled_trigger" -c "
CREATE TABLE inbox_lease (entry_id BIGINT PRIMARY KEY, route TEXT NOT NULL, correlation_key TEXT);
CREATE INDEX inbox_lease_key ON inbox_lease (route, correlation_key);
CREATE FUNCTION inbox_entry_lease() RETURNS trigger LANGUAGE plpgsql AS \$\$
BEGIN
    IF NEW.status = 'IN_PROGRESS' THEN
        INSERT INTO inbox_lease VALUES (NEW.id, NEW.route, NEW.correlation_key);
    ELSE
        DELETE FROM inbox_lease WHERE entry_id = OLD.id;
    END IF;
    RETURN NULL;
END \$\$;
CREATE TRIGGER inbox_entry_lease AFTER UPDATE OF status ON inbox_entry FOR EACH ROW
    WHEN ((OLD.status = 'IN_PROGRESS') <> (NEW.status = 'IN_PROGRESS')) EXECUTE FUNCTION inbox_entry_lease();" ;;
*) echo "unknown layout $layout" >&2; exit 2 ;;
esac
