#!/usr/bin/env python3
"""Prints `PREPARE claim_next_<variant> … AS <statement>;` for time.sh.

`today` is CLAIM_NEXT_SQL of src/inbox/postgres.rs as `claim_held!` builds it: the two
fragments the product includes (src/inbox/sql/claim_eligible_floor.sql, claim_set.sql)
are read from the tree, the macro's own text is written out below as it was at fd6d104.
Every other variant is `today` with the one change its name says, so none of them is a
copy that could drift from it."""
import pathlib
import sys

SQL = pathlib.Path(__file__).resolve().parents[4] / "src" / "inbox" / "sql"
ELIGIBLE = (SQL / "claim_eligible_floor.sql").read_text()
CLAIM_SET = (SQL / "claim_set.sql").read_text()
CHECKS = ELIGIBLE[ELIGIBLE.index("      AND (NOT $3"):]

TODAY = (
    "WITH candidates AS (\n"
    "    SELECT h.id FROM unnest($8::bigint[], $9::text[]) AS v(after, key)\n"
    "    CROSS JOIN LATERAL (\n"
    "        SELECT o.id FROM inbox_entry o\n"
    "        WHERE o.route = $1 AND o.correlation_key = v.key AND o.id > v.after AND o.status IN ('OPEN', 'PARKED')\n"
    "        ORDER BY o.id LIMIT 1) h\n"
    "), picked AS (\n"
    "    SELECT e.id FROM inbox_entry e\n"
    "    WHERE e.id = ANY(ARRAY(SELECT id FROM candidates)) AND e.route = $1 AND e.status = 'OPEN' AND e.next_attempt_at <= $2\n"
    + ELIGIBLE
    + "    LIMIT $5\n"
    "    FOR UPDATE SKIP LOCKED\n"
    "), claimed AS (\n"
    "UPDATE inbox_entry SET\n"
    + CLAIM_SET
    + "FROM picked WHERE inbox_entry.id = picked.id\n"
    "  AND (inbox_entry.correlation_key IS NULL OR inbox_entry.correlation_key = ANY($9))\n"
    "RETURNING inbox_entry.*\n"
    "), heads AS (\n"
    "    SELECT c.route, c.correlation_key, f.floor AS old, LEAST(c.id, (\n"
    "        SELECT min(o.id) FROM inbox_entry o\n"
    "        WHERE o.route = c.route AND o.correlation_key = c.correlation_key\n"
    "          AND o.id >= COALESCE(f.floor, 0) AND o.id < c.id AND o.status = 'PARKED')) AS floor\n"
    "    FROM claimed c\n"
    "    LEFT JOIN inbox_key_floor f ON f.route = c.route AND f.correlation_key = c.correlation_key\n"
    "    WHERE c.correlation_key IS NOT NULL\n"
    "), raised AS (\n"
    "    UPDATE inbox_key_floor f SET floor = h.floor FROM heads h\n"
    "    WHERE f.route = h.route AND f.correlation_key = h.correlation_key AND f.floor = h.old AND h.floor > h.old\n"
    "), created AS (\n"
    "    INSERT INTO inbox_key_floor (route, correlation_key, floor)\n"
    "    SELECT h.route, h.correlation_key, h.floor FROM heads h WHERE h.old IS NULL\n"
    "    ON CONFLICT (route, correlation_key) DO NOTHING\n"
    ")\n"
    "SELECT claimed.id FROM claimed"
)

FLOOR_SUBSELECT = (
    "COALESCE((\n"
    "                  SELECT f.floor FROM inbox_key_floor f\n"
    "                  WHERE f.route = e.route AND f.correlation_key = e.correlation_key), 0)"
)
HEADS_FROM_FLOOR = (
    "    SELECT c.route, c.correlation_key, f.floor AS old, LEAST(c.id, (\n",
    "          AND o.id >= COALESCE(f.floor, 0) AND o.id < c.id AND o.status = 'PARKED')) AS floor\n"
    "    FROM claimed c\n"
    "    LEFT JOIN inbox_key_floor f ON f.route = c.route AND f.correlation_key = c.correlation_key\n",
)


def edit(text, *pairs):
    for old, new in pairs:
        if old not in text:
            sys.exit(f"variant.py: the statement no longer has {old[:60]!r}")
        text = text.replace(old, new)
    return text


def cut(text, start, end, put):
    i, j = text.index(start), text.index(end)
    return text[:i] + put + text[j:]


def floor_once(text):
    """The key's floor read once, by a join in `picked`, for the checks and `heads`."""
    return edit(
        text,
        ("    SELECT e.id FROM inbox_entry e\n",
         "    SELECT e.id, COALESCE(f.floor, 0) AS floor, f.floor AS old FROM inbox_entry e\n"
         "    LEFT JOIN inbox_key_floor f ON f.route = e.route AND f.correlation_key = e.correlation_key\n"),
        (FLOOR_SUBSELECT, "COALESCE(f.floor, 0)"),
        ("    FOR UPDATE SKIP LOCKED\n", "    FOR UPDATE OF e SKIP LOCKED\n"),
        (HEADS_FROM_FLOOR[0], "    SELECT c.route, c.correlation_key, p.old, LEAST(c.id, (\n"),
        (HEADS_FROM_FLOOR[1],
         "          AND o.id >= p.floor AND o.id < c.id AND o.status = 'PARKED')) AS floor\n"
         "    FROM claimed c JOIN picked p ON p.id = c.id\n"),
    )


def skip_proven(text):
    """floor_once, and where the key's floor is the entry just settled, neither the checks
    nor the parked probe of `heads`: nothing of the key is unresolved at or below it."""
    return edit(
        floor_once(text),
        ("    SELECT h.id FROM unnest(", "    SELECT h.id, v.after FROM unnest("),
        ("    SELECT e.id, COALESCE(f.floor, 0) AS floor, f.floor AS old FROM inbox_entry e\n",
         "    SELECT e.id, COALESCE(f.floor, 0) AS floor, f.floor AS old, f.floor = n.after AS clear\n"
         "    FROM candidates n JOIN inbox_entry e ON e.id = n.id\n"),
        ("e.id = ANY(ARRAY(SELECT id FROM candidates)) AND ", ""),
        ("      AND (NOT $3 OR e.correlation_key IS NULL OR (", "      AND (NOT $3 OR e.correlation_key IS NULL OR f.floor = n.after OR ("),
        ("LEAST(c.id, (\n", "LEAST(c.id, CASE WHEN NOT p.clear THEN (\n"),
        ("o.status = 'PARKED')) AS floor", "o.status = 'PARKED') END) AS floor"),
    )


VARIANTS = {
    "today": lambda t: t,
    "floor_once": floor_once,
    "skip_proven": skip_proven,
    "no_checks": lambda t: edit(t, (CHECKS, "")),
    "no_floor_upkeep": lambda t: cut(t, "), heads AS (", "SELECT claimed.id FROM claimed", ")\n"),
    "no_row_lock": lambda t: edit(t, ("    FOR UPDATE SKIP LOCKED\n", "")),
    "reads_only": lambda t: t[: t.index("), claimed AS (")] + ")\nSELECT id FROM picked",
}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in VARIANTS:
        sys.exit(f"usage: variant.py {{{','.join(VARIANTS)}}}")
    name = sys.argv[1]
    print(f"PREPARE claim_next_{name}(text, bigint, boolean, boolean, bigint, text, bigint, bigint[], text[]) AS")
    print(VARIANTS[name](TODAY) + ";")
