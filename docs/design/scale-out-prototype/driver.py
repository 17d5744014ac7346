#!/usr/bin/env python3
"""Prototype driver for the inbox_key redesign (docs/design/scale-out-inbox.md).

    venv/bin/python driver.py bench            # old vs new (a) vs new (b), 10 and 1,000 keys, 1 and 4 clients
    venv/bin/python driver.py check            # concurrency check of the new layout (both variants)
    venv/bin/python driver.py migrate          # backfill of an old-layout inbox, then a drain on the new layout

Options: --backlog 200000 --deliveries 20000 --cap 30 --keys 10,1000 --clients 1,4 --layouts old,a,b
Databases are named i27_proto_*, created fresh and dropped at the end.
SQL: old/*.sql is today's hot path (verbatim from src/inbox/postgres.rs), new/*.sql the prototype.
"""
import argparse
import datetime
import json
import os
import random
import re
import statistics
import sys
import threading
import time

import psycopg
from psycopg.rows import dict_row
from psycopg.types.numeric import Int8Dumper

HERE = os.path.dirname(os.path.abspath(__file__))
MIGRATIONS = "/work/main/src/inbox/sql"
ADMIN = "host=127.0.0.1 user=postgres dbname=postgres"
ROUTE = "bench"
N = 16
LEASE_MS = 30_000
PLUGIN = "sha256:" + "ab" * 32
TICK = os.sysconf("SC_CLK_TCK")


def dsn(db):
    return f"host=127.0.0.1 user=postgres dbname={db} options='-c client_min_messages=warning'"


def sql(path):
    """A statement file with $n parameters, for psycopg (%(pn)s; literal % doubled)."""
    text = open(os.path.join(HERE, path)).read().replace("%", "%%")
    return re.sub(r"\$(\d+)", lambda m: f"%(p{m.group(1)})s", text)


def P(*args):
    return {f"p{i + 1}": a for i, a in enumerate(args)}


def connect(db):
    conn = psycopg.connect(dsn(db), autocommit=True)
    conn.adapters.register_dumper(int, Int8Dumper)  # as sqlx binds i64: every int is int8
    return conn


def now_ms():
    return int(time.time() * 1000)


def backend_cpu(pid):
    """utime + stime of a server backend, seconds."""
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / TICK
    except OSError:
        return float("nan")


# ---------------------------------------------------------------------------------------
# Databases
# ---------------------------------------------------------------------------------------

def admin(statement):
    with psycopg.connect(ADMIN, autocommit=True) as c:
        c.execute(statement)


def create_db(name, template=None):
    assert name.startswith("i27_proto_")
    admin(f"DROP DATABASE IF EXISTS {name}")
    admin(f"CREATE DATABASE {name}" + (f" TEMPLATE {template} STRATEGY FILE_COPY" if template else ""))


def drop_db(name):
    assert name.startswith("i27_proto_")
    admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def apply_schema(db, layout):
    with connect(db) as c:
        for n in range(1, 11):
            f = [x for x in os.listdir(MIGRATIONS) if x.startswith(f"postgres_{n:04d}_")][0]
            c.execute(open(os.path.join(MIGRATIONS, f)).read())
        if layout in ("a", "b", "a2"):
            c.execute(open(os.path.join(HERE, "new/schema.sql")).read())
            c.execute(open(os.path.join(HERE, "new/advance_many.sql")).read())
        if layout == "b":
            c.execute(open(os.path.join(HERE, "new/schema_b.sql")).read())
            day = datetime.datetime.now(datetime.timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
            lo = int(day.timestamp() * 1000)
            c.execute(f"CREATE TABLE inbox_done_{day:%Y%m%d} PARTITION OF inbox_done FOR VALUES FROM ({lo}) TO ({lo + 86_400_000})")


# ---------------------------------------------------------------------------------------
# Inserts
# ---------------------------------------------------------------------------------------

def insert_params(entries, now, layout, parked_blocks=True):
    """entries: (dedup, key, status); the INSERT_MANY_SQL columns."""
    n = len(entries)
    bodies = [json.dumps({"workOrderId": k, "completedItems": i, "completionTimestamp": "2026-08-01T10:00:00Z"}).encode()
              for i, (d, k, s) in enumerate(entries)]
    args = [
        [ROUTE] * n, [d for d, k, s in entries], [k for d, k, s in entries], ["work-order-completed"] * n, ["1"] * n,
        bodies, bodies, ["[]"] * n, [d for d, k, s in entries], [None] * n, [None] * n,
        [f"digest-{d}" for d, k, s in entries], [s for d, k, s in entries], [None] * n, [None] * n, [None] * n, now,
    ]
    if layout != "old":
        args.append(parked_blocks)
    return P(*args)


INSERT_FILE = {"old": "old/insert_many.sql", "a": "new/insert_many_a.sql", "b": "new/insert_many_b.sql",
               "a2": "new/insert_many_a.sql"}


def load(db, layout, backlog, keys, batch=100):
    stmt = sql(INSERT_FILE[layout])
    with connect(db) as c:
        pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
        cpu0, t0 = backend_cpu(pid), time.monotonic()
        for lo in range(0, backlog, batch):
            entries = [(f"bench-{i}", f"key-{i % keys}", "OPEN") for i in range(lo, min(lo + batch, backlog))]
            rows = c.execute(stmt, insert_params(entries, 0, layout)).fetchall()
            assert all(r[0] is not None for r in rows), rows[:3]
        secs, cpu = time.monotonic() - t0, backend_cpu(pid) - cpu0
        c.execute("VACUUM ANALYZE inbox_entry")
        if layout != "old":
            c.execute("VACUUM ANALYZE inbox_key")
    return backlog / secs, cpu / backlog * 1e6


# ---------------------------------------------------------------------------------------
# Relay clients
# ---------------------------------------------------------------------------------------

class OldClient:
    """Today's ordered claim (PgStore::claim_rows) and SETTLE_MANY_SQL with an attempt row."""
    KEYS, HEADS, UNKEYED, HELD = sql("old/claim_keys.sql"), sql("old/claim_heads.sql"), sql("old/claim_unkeyed.sql"), sql("old/claim_held.sql")
    SETTLE = sql("old/settle_many.sql")

    def __init__(self, db, owner, slots=None, parked_blocks=True):
        self.conn, self.owner, self.pb = connect(db), owner, parked_blocks
        self.heads_first = False  # PgStore::few_keys, per instance

    def claim(self):
        c, now = self.conn, now_ms()
        with c.transaction():
            c.execute("SET LOCAL synchronous_commit TO OFF")
            cands = [] if self.heads_first else c.execute(
                self.KEYS, P(ROUTE, now, True, self.pb, N, max(N * 4, 4096))).fetchall()
            short = N - len(cands)
            if short > 0:
                taken = [k for _, k in cands if k is not None]
                heads = c.execute(self.HEADS, P(ROUTE, now, self.pb, short, taken)).fetchall()
                walked = heads[0][2] if heads else 0
                self.heads_first = walked <= 256
                cands += [(i, k) for i, k, _ in heads if i is not None]
            short = N - len(cands)
            if self.heads_first and short > 0:
                cands += c.execute(self.UNKEYED, P(ROUTE, now, short)).fetchall()
            if not cands:
                return []
            ids = [i for i, _ in cands]
            held = [k for _, k in cands if k is not None]
            cur = c.cursor(row_factory=dict_row)
            rows = cur.execute(self.HELD, P(ROUTE, now, True, self.pb, N, self.owner, LEASE_MS, ids, held)).fetchall()
        return [{"id": r["id"], "key": r["correlation_key"], "token": r["lease_token"], "attempts": r["attempts"],
                 "claimed_at": now} for r in rows]

    def settle(self, items):
        """items: (claimed row, outcome, next). Only DONE is used in the benchmark."""
        now = now_ms()
        ids = [r["id"] for r, o, nx in items]
        n = len(items)
        args = P(ids, [self.owner] * n, [r["token"] for r, o, nx in items], [o for r, o, nx in items], [now] * n,
                 [nx for r, o, nx in items], [None] * n, [now] * n, [None] * n, [None] * n, [None] * n, [None] * n,
                 [False] * n, [None] * n, [None] * n, [None] * n,
                 ids, [r["attempts"] for r, o, nx in items], [self.owner] * n, [r["claimed_at"] for r, o, nx in items],
                 [now - r["claimed_at"] for r, o, nx in items], ["done"] * n, [o for r, o, nx in items], [None] * n,
                 ["[]"] * n, [PLUGIN] * n)
        return {r[0]: True for r in self.conn.execute(self.SETTLE, args).fetchall()}


class NewClient:
    CLAIM = sql("new/claim.sql")
    SETTLE = {"a": sql("new/settle_a.sql"), "b": sql("new/settle_b.sql"), "a2": sql("new/settle_a2.sql")}
    late_payloads = 0

    def __init__(self, db, owner, slots, layout, parked_blocks=True, lease_ms=LEASE_MS, attempt_rows=False):
        self.conn, self.owner, self.slots, self.pb = connect(db), owner, slots, parked_blocks
        self.settle_sql, self.lease_ms, self.attempt_rows = self.SETTLE[layout], lease_ms, attempt_rows

    def claim(self):
        now = now_ms()
        cur = self.conn.cursor(row_factory=dict_row)
        rows = cur.execute(self.CLAIM, P(ROUTE, self.slots, now, N, self.pb, self.owner, self.lease_ms)).fetchall()
        late = [r["id"] for r in rows if r["entry_id"] is None]
        if late:  # committed after the claim's snapshot: read in a statement of its own
            NewClient.late_payloads += len(late)
            got = {r["id"]: r for r in cur.execute(
                "SELECT id, attempts FROM inbox_entry WHERE id = ANY(%(p1)s)", P(late)).fetchall()}
            for r in rows:
                if r["entry_id"] is None:
                    r["attempts"] = got[r["id"]]["attempts"]
        return [{"id": r["id"], "key": r["key"], "token": r["lease_token"], "attempts": r["attempts"] + 1,
                 "claimed_at": now} for r in rows]

    def settle(self, items, error=None):
        """items: (claimed row, outcome DONE/IGNORED/RETRY/PARKED, next attempt at). Returns {id: locked}."""
        now = now_ms()
        n = len(items)
        rows = [r for r, o, nx in items]
        # No attempt row for a first attempt that ends the entry (its summary is on the row).
        att = [(r, o) for r, o, nx in items if self.attempt_rows or not (r["attempts"] == 1 and o in ("DONE", "IGNORED"))]
        args = P([r["id"] for r in rows], [ROUTE] * n, [r["key"] for r in rows], [self.owner] * n,
                 [r["token"] for r in rows], [o for r, o, nx in items], [now] * n, [nx for r, o, nx in items],
                 [error if o != "DONE" else None for r, o, nx in items], [None] * n, [None] * n,
                 [r["claimed_at"] for r in rows], [now - r["claimed_at"] for r in rows], [PLUGIN] * n, self.pb,
                 [r["id"] for r, o in att], [r["attempts"] for r, o in att], [self.owner] * len(att),
                 [r["claimed_at"] for r, o in att], [now - r["claimed_at"] for r, o in att],
                 [o.lower() for r, o in att], [o if o != "RETRY" else "OPEN" for r, o in att], [None] * len(att),
                 ["[]"] * len(att), [PLUGIN] * len(att))
        return {r[0]: r[1] for r in self.conn.execute(self.settle_sql, args).fetchall()}


MAINTAIN_MIN_ROWS, VACUUM_SHARE, ANALYZE_SHARE = 10_000, 20, 10


def maintain(conn, tables):
    """PgStore::maintain_tables, for each hot table."""
    did = []
    for t in tables:
        live, dead, changed = conn.execute(
            "SELECT n_live_tup, n_dead_tup, n_mod_since_analyze FROM pg_stat_user_tables WHERE relid = %s::regclass",
            (t,)).fetchone()
        analyze = changed >= max(live // ANALYZE_SHARE, MAINTAIN_MIN_ROWS)
        if dead >= max(live // VACUUM_SHARE, MAINTAIN_MIN_ROWS):
            conn.execute(f"VACUUM {'(ANALYZE) ' if analyze else ''}{t}")
            did.append(f"vacuum{'+analyze' if analyze else ''} {t}")
        elif analyze:
            conn.execute(f"ANALYZE {t}")
            did.append(f"analyze {t}")
    return did


def slots_of(i, clients):
    per = 256 // clients
    return list(range(i * per, 256 if i == clients - 1 else (i + 1) * per))


def relay(db, layout, clients, deliveries, cap, attempt_rows=False):
    tables = ["inbox_entry"] + (["inbox_key"] if layout != "old" else [])
    made = []
    for i in range(clients):
        if layout == "old":
            made.append(OldClient(db, f"inst-{i}"))
        else:
            made.append(NewClient(db, f"inst-{i}", slots_of(i, clients), layout, attempt_rows=attempt_rows))
    pids = [m.conn.execute("SELECT pg_backend_pid()").fetchone()[0] for m in made]
    lock = threading.Lock()
    state = {"delivered": 0, "claims": 0, "empty": 0, "claim_s": 0.0, "settle_s": 0.0, "maint": []}
    stop = threading.Event()
    start = threading.Barrier(clients + 1)

    def run(i, cl):
        last_maint = time.monotonic()
        start.wait()
        t_end = time.monotonic() + cap
        while not stop.is_set():
            t0 = time.monotonic()
            rows = cl.claim()
            t1 = time.monotonic()
            if rows:
                ok = cl.settle([(r, "DONE", None) for r in rows])
                assert len(ok) == len(rows), (len(ok), len(rows))
            t2 = time.monotonic()
            with lock:
                state["claims"] += 1
                state["claim_s"] += t1 - t0
                state["settle_s"] += t2 - t1
                state["delivered"] += len(rows)
                if not rows:
                    state["empty"] += 1
                if state["delivered"] >= deliveries:
                    stop.set()
            if time.monotonic() >= t_end:
                stop.set()
            if not rows:
                time.sleep(0.002)
            if i == 0 and time.monotonic() - last_maint >= 5:
                state["maint"] += maintain(cl.conn, tables)
                last_maint = time.monotonic()

    threads = [threading.Thread(target=run, args=(i, m)) for i, m in enumerate(made)]
    for t in threads:
        t.start()
    cpu0 = sum(backend_cpu(p) for p in pids)
    start.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join()
    secs = time.monotonic() - t0
    cpu = sum(backend_cpu(p) for p in pids) - cpu0
    for m in made:
        m.conn.close()
    d = state["delivered"]
    return {"rate": d / secs, "delivered": d, "secs": secs, "claims": state["claims"], "empty": state["empty"],
            "claim_ms": state["claim_s"] / max(state["claims"], 1) * 1000,
            "settle_ms": state["settle_s"] / max(state["claims"] - state["empty"], 1) * 1000,
            "cpu_us": cpu / max(d, 1) * 1e6, "maint": state["maint"]}


def bench(args):
    results = []
    for keys in args.keys:
        for layout in args.layouts:
            tmpl = f"i27_proto_t_{layout}_{keys}"
            create_db(tmpl)
            apply_schema(tmpl, layout)
            ins_rate, ins_cpu = load(tmpl, layout, args.backlog, keys)
            print(f"[{keys} keys, {layout}] loaded {args.backlog} at {ins_rate:,.0f} rows/s, {ins_cpu:.0f} us backend CPU/row",
                  flush=True)
            for clients in args.clients:
                run = f"i27_proto_r_{layout}_{keys}_{clients}"
                create_db(run, template=tmpl)
                r = relay(run, layout, clients, args.deliveries, args.cap, attempt_rows=args.attempt_rows)
                r.update(keys=keys, layout=layout, clients=clients, insert_rate=ins_rate, insert_cpu_us=ins_cpu)
                results.append(r)
                print(f"[{keys} keys, {layout}, {clients} clients] {r['rate']:,.0f} deliveries/s "
                      f"({r['delivered']} in {r['secs']:.1f} s), claim {r['claim_ms']:.2f} ms mean over {r['claims']} "
                      f"({r['empty']} empty), settle {r['settle_ms']:.2f} ms, {r['cpu_us']:.0f} us backend CPU/delivery; "
                      f"maintenance: {', '.join(r['maint']) or 'none'}", flush=True)
                drop_db(run)
            drop_db(tmpl)
    out = os.path.join(HERE, args.out)
    json.dump(results, open(out, "w"), indent=1)
    print("late payloads (claim snapshot missed the entry):", NewClient.late_payloads)
    table(results)


def table(results):
    print("\n| keys | clients | old /s | new (a) /s | new (b) /s | a/old | b/old | claim ms old / a / b | CPU us/delivery old / a / b |")
    print("|---|---|---|---|---|---|---|---|---|")
    by = {(r["keys"], r["clients"], r["layout"]): r for r in results}
    for keys, clients in sorted({(r["keys"], r["clients"]) for r in results}):
        o, a, b = (by.get((keys, clients, l)) for l in ("old", "a", "b"))
        f = lambda r, k, fmt: format(r[k], fmt) if r else "-"
        ratio = lambda r: f"{r['rate'] / o['rate']:.1f}x" if r and o else "-"
        print(f"| {keys:,} | {clients} | {f(o, 'rate', ',.0f')} | {f(a, 'rate', ',.0f')} | {f(b, 'rate', ',.0f')} | "
              f"{ratio(a)} | {ratio(b)} | {f(o, 'claim_ms', '.2f')} / {f(a, 'claim_ms', '.2f')} / {f(b, 'claim_ms', '.2f')} | "
              f"{f(o, 'cpu_us', '.0f')} / {f(a, 'cpu_us', '.0f')} / {f(b, 'cpu_us', '.0f')} |")
    print("\n| keys | insert rows/s old / a / b | insert CPU us/row old / a / b |")
    print("|---|---|---|")
    for keys in sorted({r["keys"] for r in results}):
        rs = [next((r for r in results if r["keys"] == keys and r["layout"] == l), None) for l in ("old", "a", "b")]
        print(f"| {keys:,} | " + " / ".join(f"{r['insert_rate']:,.0f}" if r else "-" for r in rs) + " | "
              + " / ".join(f"{r['insert_cpu_us']:.0f}" if r else "-" for r in rs) + " |")


# ---------------------------------------------------------------------------------------
# Concurrency check
# ---------------------------------------------------------------------------------------

def check(args, layout):
    db = f"i27_proto_check_{layout}"
    create_db(db)
    apply_schema(db, layout)
    keys = [f"k{i}" for i in range(20)]
    inserted = {k: [] for k in keys}  # ids per key
    claimed = {k: [] for k in keys}  # [id, outcome] per key, in claim order
    inflight = {}  # key -> (relay, id)
    lock = threading.Lock()
    stop_ins, stop_all = threading.Event(), threading.Event()
    stats = {"batches": 0, "claims": 0, "empty": 0, "settles": 0, "done": 0, "retry": 0, "park": 0, "requeue": 0,
             "abandon": 0, "moving": 0, "violations": [], "errors": []}
    seq = iter(range(10 ** 9))
    LEASE = 400  # ms: abandoned attempts come back quickly

    def inserter(i):
        try:
            c = connect(db)
            stmt = sql(f"neg/insert_donothing_{layout}.sql" if args.neg == "donothing" else INSERT_FILE[layout])
            rnd = random.Random(i)
            while not stop_ins.is_set():
                with lock:
                    ents = [(f"m-{next(seq)}", rnd.choice(keys), "OPEN") for _ in range(rnd.randint(1, 20))]
                rows = c.execute(stmt, insert_params(ents, now_ms(), layout)).fetchall()
                with lock:
                    for (d, k, s), r in zip(ents, rows):
                        assert r[0] is not None
                        inserted[k].append(r[0])
                    stats["batches"] += 1
                time.sleep(rnd.random() * 0.004)
        except Exception as e:  # noqa
            stats["errors"].append(f"inserter {i}: {e!r}")
            stop_ins.set()
            stop_all.set()

    def relayer(i):
        try:
            cl = NewClient(db, f"relay-{i}", list(range(256)), layout, parked_blocks=True, lease_ms=LEASE)
            if args.neg == "nolock":
                cl.CLAIM = sql("neg/claim_nolock.sql")
            if args.neg == "snapshot":
                cl.settle_sql = sql(f"neg/settle_stmt_snapshot_{layout}.sql")
            rnd = random.Random(100 + i)
            parked = []  # (id, when)
            while not stop_all.is_set():
                rows = cl.claim()
                with lock:
                    stats["claims"] += 1
                    stats["empty"] += not rows
                    for r in rows:
                        if r["key"] in inflight:
                            stats["violations"].append(f"key {r['key']}: {r['id']} leased while {inflight[r['key']]} in flight")
                        inflight[r["key"]] = (i, r["id"])
                        r["slot"] = [r["id"], None]
                        claimed[r["key"]].append(r["slot"])
                items = []
                for r in rows:
                    x = rnd.random()
                    if x < 0.02:
                        o = "ABANDON"
                    elif x < 0.07:
                        o = "RETRY"
                    elif x < 0.09:
                        o = "PARKED"
                    else:
                        o = "DONE"
                    r["slot"][1] = o
                    if o != "ABANDON":
                        items.append((r, o, now_ms() + rnd.randint(0, 30) if o == "RETRY" else None))
                with lock:  # released before the settle is sent (see REPORT.md)
                    for r in rows:
                        del inflight[r["key"]]
                if items:
                    res = cl.settle(items, error="boom")
                    with lock:
                        for r, o, nx in items:
                            if r["id"] not in res:
                                stats["violations"].append(f"settle of {r['id']} refused (lease lost)")
                            elif res[r["id"]] is False:
                                stats["moving"] += 1
                            stats[{"DONE": "done", "RETRY": "retry", "PARKED": "park"}[o]] += 1
                            if o == "PARKED":
                                parked.append((r["id"], time.monotonic()))
                        stats["settles"] += 1
                stats["abandon"] += sum(1 for r in rows if r["slot"][1] == "ABANDON")
                still = []
                for pid_, when in parked:
                    if time.monotonic() - when > 0.05:
                        got = cl.conn.execute(sql("new/requeue.sql"), P(pid_, now_ms())).fetchall()
                        assert len(got) == 1, (pid_, got)
                        with lock:
                            stats["requeue"] += 1
                    else:
                        still.append((pid_, when))
                parked[:] = still
                if not rows:
                    if stop_ins.is_set() and not parked:
                        left = cl.conn.execute("SELECT count(*) FROM inbox_key").fetchone()[0]
                        if left == 0:
                            stop_all.set()
                    time.sleep(0.002)
        except Exception as e:  # noqa
            stats["errors"].append(f"relay {i}: {e!r}")
            stop_ins.set()
            stop_all.set()

    ts = [threading.Thread(target=inserter, args=(i,)) for i in range(2)] + \
         [threading.Thread(target=relayer, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    time.sleep(args.check_seconds)
    stop_ins.set()
    deadline = time.monotonic() + 120
    while not stop_all.is_set() and time.monotonic() < deadline:
        time.sleep(0.5)
    stop_all.set()
    for t in ts:
        t.join()
    # The end state, and per key: DONE ids in claim order = every inserted id ascending, once.
    bad = list(stats["violations"]) + list(stats["errors"])
    with connect(db) as c:
        left_keys = c.execute("SELECT count(*) FROM inbox_key").fetchone()[0]
        left_open = c.execute("SELECT count(*) FROM inbox_entry WHERE status IN ('OPEN', 'PARKED', 'IN_PROGRESS')").fetchone()[0]
        fin = "inbox_done" if layout == "b" else "inbox_entry"  # a2 keeps rows like a
        done_db = c.execute(f"SELECT count(*), count(DISTINCT id) FROM {fin} WHERE status = 'DONE'").fetchone()
    if left_keys or left_open:
        bad.append(f"left over: {left_keys} key rows, {left_open} unresolved entries")
    total = 0
    for k in keys:
        done = [i for i, o in claimed[k] if o == "DONE"]
        total += len(done)
        if done != sorted(inserted[k]):
            miss = set(inserted[k]) - set(done)
            twice = len(done) - len(set(done))
            inv = sum(1 for a, b in zip(done, done[1:]) if b <= a)
            bad.append(f"key {k}: {len(inserted[k])} inserted, {len(done)} done, {len(miss)} missing, "
                       f"{twice} twice, {inv} out of order")
    if done_db[0] != total or done_db[1] != total:
        bad.append(f"database holds {done_db} DONE rows, driver saw {total}")
    drop_db(db)
    n_ins = sum(len(v) for v in inserted.values())
    print(f"[check {layout}{' NEGATIVE CONTROL ' + args.neg if args.neg else ''}] {n_ins} entries inserted in {stats['batches']} batches over 20 keys by 2 inserters; "
          f"2 relays (all slots each): {stats['claims']} claims ({stats['empty']} empty), {stats['settles']} settles: "
          f"{stats['done']} done, {stats['retry']} retry, {stats['park']} parked (+{stats['requeue']} requeued), "
          f"{stats['abandon']} abandoned (lease expiry), {stats['moving']} head advances left 'moving'; "
          f"late payloads {NewClient.late_payloads}", flush=True)
    print(f"[check {layout}] " + ("HELD: no key leased twice, per-key DONE order = ascending ids, none missing, none twice"
                                  if not bad else "FAILED:\n  " + "\n  ".join(bad[:20])), flush=True)
    return not bad


# ---------------------------------------------------------------------------------------
# Migration: an old-layout inbox with entries in every state, backfilled, drained
# ---------------------------------------------------------------------------------------

def migrate(args):
    db = "i27_proto_migrate"
    create_db(db)
    apply_schema(db, "old")
    keys, n = 50, 5000
    load(db, "old", n, keys)
    with connect(db) as c:
        old = OldClient(db, "old-inst")
        # some delivered, some in flight (lease held), some parked (block-key), some waiting for a retry
        for _ in range(20):
            rows = old.claim()
            old.settle([(r, "DONE", None) for r in rows])
        inflight = old.claim()
        c.execute("UPDATE inbox_entry SET status = 'PARKED' WHERE id IN (SELECT min(id) FROM inbox_entry "
                  "WHERE status = 'OPEN' AND correlation_key IN ('key-1', 'key-2', 'key-3') GROUP BY correlation_key)")
        c.execute("UPDATE inbox_entry SET next_attempt_at = %s WHERE id IN (SELECT min(id) FROM inbox_entry "
                  "WHERE status = 'OPEN' AND correlation_key IN ('key-4', 'key-5') GROUP BY correlation_key)",
                  (now_ms() + 2000,))
        old.conn.close()
        delivered_before = {r[0] for r in c.execute("SELECT id FROM inbox_entry WHERE status = 'DONE'")}
        expect = {}
        for i, k in c.execute("SELECT id, correlation_key FROM inbox_entry WHERE status <> 'DONE' ORDER BY id"):
            expect.setdefault(k, []).append(i)
        # expand + backfill (+ move the finished rows: variant b)
        c.execute(open(os.path.join(HERE, "new/schema.sql")).read())
        c.execute(open(os.path.join(HERE, "new/schema_b.sql")).read())
        for stmt in open(os.path.join(HERE, "new/backfill.sql")).read().split(";\n"):
            if stmt.strip():
                c.execute(re.sub(r"\$(\d+)", lambda m: f"%(p{m.group(1)})s", stmt.replace("%", "%%")), P(ROUTE, True))
        moved = 0
        while True:
            cur = c.execute(sql("new/move_done.sql"))
            moved += cur.rowcount
            if cur.rowcount == 0:
                break
        states = dict(c.execute("SELECT state, count(*) FROM inbox_key GROUP BY state").fetchall())
        print(f"[migrate] backfilled key rows by state: {states}; {moved} finished rows moved to inbox_done", flush=True)
    # the attempts in flight settle after the migration, fenced on the key row
    cl = NewClient(db, "old-inst", list(range(256)), "b")
    res = cl.settle([({"id": r["id"], "key": r["key"], "token": r["token"], "attempts": r["attempts"],
                       "claimed_at": r["claimed_at"]}, "DONE", None) for r in inflight])
    assert len(res) == len(inflight), (len(res), len(inflight))
    order = {k: [] for k in expect}
    for r in inflight:
        order[r["key"]].append(r["id"])
    cl2 = NewClient(db, "new-inst", list(range(256)), "b")
    requeued = False
    t_end = time.monotonic() + 60
    while time.monotonic() < t_end:
        rows = cl2.claim()
        for r in rows:
            order[r["key"]].append(r["id"])
        if rows:
            cl2.settle([(r, "DONE", None) for r in rows])
        else:
            left = cl2.conn.execute("SELECT state, count(*) FROM inbox_key GROUP BY state").fetchall()
            if not left:
                break
            if all(s == "blocked" for s, _ in left) and not requeued:
                for (pid_,) in cl2.conn.execute("SELECT head_id FROM inbox_key WHERE state = 'blocked'").fetchall():
                    cl2.conn.execute(sql("new/requeue.sql"), P(pid_, now_ms()))
                requeued = True
            time.sleep(0.05)
    bad = [k for k in expect if order[k] != expect[k]]
    twice = [i for k in order for i in order[k] if i in delivered_before]
    print(f"[migrate] {sum(map(len, expect.values()))} unresolved entries over {len(expect)} keys drained after the "
          f"backfill: " + ("order kept, none lost, none twice" if not bad and not twice
                           else f"FAILED on keys {bad[:5]}, {len(twice)} delivered again"), flush=True)
    drop_db(db)


# ---------------------------------------------------------------------------------------
# Deterministic interleaving: the key row's creation race
# ---------------------------------------------------------------------------------------

def race(args, variant):
    """T1 draws an id for key K, then stalls (its next row waits for key J's lock, held
    exclusively by S0) before its key-row upsert; T2 inserts K (a larger id), creates the
    key row and commits; a claim runs; S0 lets T1 go; claims drain K. K must be
    delivered 1st id, then 2nd. variant: ok | donothing (neg/insert_donothing_a.sql) |
    nolock (neg/claim_nolock.sql)."""
    db = "i27_proto_race"
    create_db(db)
    apply_schema(db, "a")
    ins = sql("neg/insert_donothing_a.sql" if variant == "donothing" else "new/insert_many_a.sql")
    s0, t1, t2 = connect(db), connect(db), connect(db)
    cl = NewClient(db, "claimer", list(range(256)), "a")
    if variant == "nolock":
        cl.CLAIM = sql("neg/claim_nolock.sql")
    s0.execute("BEGIN")
    s0.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (ROUTE + ":J",))
    got = {}
    th = threading.Thread(target=lambda: got.setdefault("t1", t1.execute(
        ins, insert_params([("r-1", "K", "OPEN"), ("r-2", "J", "OPEN")], now_ms(), "a")).fetchall()))
    th.start()
    time.sleep(0.5)  # T1 has drawn K's id and waits for J's lock
    t2_ids = [r[0] for r in t2.execute(ins, insert_params([("r-3", "K", "OPEN")], now_ms(), "a")).fetchall()]
    order = [r["id"] for r in cl.claim() if r["key"] == "K"]
    during = list(order)
    if order:
        cl.settle([({"id": order[0], "key": "K", "token": 1, "attempts": 1, "claimed_at": now_ms()}, "DONE", None)])
    s0.execute("COMMIT")
    th.join()
    t1_k = got["t1"][0][0]
    for _ in range(5):
        rows = [r for r in cl.claim() if r["key"] == "K"]
        order += [r["id"] for r in rows]
        if rows:
            cl.settle([(r, "DONE", None) for r in rows])
    left = cl.conn.execute("SELECT count(*) FROM inbox_entry WHERE correlation_key = 'K' AND status = 'OPEN'").fetchone()[0]
    ok = order == [t1_k] + t2_ids and left == 0
    print(f"[race {variant}] T1 drew {t1_k} for K, T2 committed {t2_ids[0]} first; claimed while T1 in flight: {during}; "
          f"K delivered in order {order}, {left} of K left OPEN: " + ("HELD" if ok else "VIOLATED"), flush=True)
    for c in (s0, t1, t2, cl.conn):
        c.close()
    drop_db(db)
    return ok


def race_settle(args, variant):
    """The settle's snapshot: a settle of keys A and K (DONE both) starts, takes its
    snapshot and stalls on A's row (held by H); meanwhile an insert of K (a new entry
    after K's leased head) commits; H lets go; the settle locks K, gets L(K) (the insert
    is done) and looks for K's next head. It must find the new entry. variant: ok |
    snapshot (neg/settle_stmt_snapshot_a.sql: the probe in the statement's snapshot)."""
    db = "i27_proto_race"
    create_db(db)
    apply_schema(db, "a")
    ins = sql("new/insert_many_a.sql")
    h, t1 = connect(db), connect(db)
    cl = NewClient(db, "claimer", list(range(256)), "a")
    if variant == "snapshot":
        cl.settle_sql = sql("neg/settle_stmt_snapshot_a.sql")
    t1.execute(ins, insert_params([("s-1", "A", "OPEN"), ("s-2", "K", "OPEN")], now_ms(), "a"))
    leased = cl.claim()
    assert sorted(r["key"] for r in leased) == ["A", "K"], leased
    h.execute("BEGIN")
    h.execute("SELECT 1 FROM inbox_key WHERE correlation_key = 'A' FOR UPDATE")
    got = {}
    th = threading.Thread(target=lambda: got.setdefault("s", cl.settle([(r, "DONE", None) for r in leased])))
    th.start()
    time.sleep(0.5)  # the settle has its snapshot and waits for A's row
    new_k = t1.execute(ins, insert_params([("s-3", "K", "OPEN")], now_ms(), "a")).fetchall()[0][0]
    h.execute("COMMIT")
    th.join()
    c2 = NewClient(db, "claimer2", list(range(256)), "a")
    after = [r["id"] for r in c2.claim() if r["key"] == "K"]
    state = c2.conn.execute("SELECT state, head_id FROM inbox_key WHERE correlation_key = 'K'").fetchone()
    ok = after == [new_k]
    print(f"[race settle {variant}] settle of K's head committed after an insert of K ({new_k}) that committed after "
          f"the settle's snapshot; settle result {got['s']}; next claim of K: {after} (key row now {state}): "
          + ("HELD" if ok else "VIOLATED (entry orphaned)"), flush=True)
    for c in (h, t1, cl.conn, c2.conn):
        c.close()
    drop_db(db)
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["bench", "check", "migrate", "race", "all"])
    ap.add_argument("--backlog", type=int, default=200_000)
    ap.add_argument("--deliveries", type=int, default=20_000)
    ap.add_argument("--cap", type=float, default=30.0, help="seconds per relay measurement at most")
    ap.add_argument("--keys", type=lambda s: [int(x) for x in s.split(",")], default=[10, 1000])
    ap.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4])
    ap.add_argument("--layouts", type=lambda s: s.split(","), default=["old", "a", "b"])
    ap.add_argument("--check-seconds", type=float, default=60)
    ap.add_argument("--out", default="results.json")
    ap.add_argument("--attempt-rows", action="store_true", help="bench: the new layout writes an attempt row per delivery too")
    ap.add_argument("--neg", choices=["donothing", "nolock", "snapshot"], help="check: a deliberately broken variant (neg/*.sql)")
    ap.add_argument("--check-layouts", type=lambda s: s.split(","), default=["a", "b"])
    args = ap.parse_args()
    ok = True
    if args.mode in ("check", "all"):
        for layout in args.check_layouts:
            ok &= check(args, layout)
    if args.mode in ("race", "all"):
        for v in ("ok", "donothing", "nolock"):
            r = race(args, v)
            ok &= r if v == "ok" else True
        for v in ("ok", "snapshot"):
            r = race_settle(args, v)
            ok &= r if v == "ok" else True
    if args.mode in ("migrate", "all"):
        migrate(args)
    if args.mode in ("bench", "all"):
        bench(args)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
