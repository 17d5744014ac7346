//! The platform benchmark: Inlet beside raw PostgreSQL, a plain SQLite loop and
//! a peer job queue (graphile-worker), on one machine in one run, printed as one table.
//!
//! ```text
//! scripts/bench [--rounds 3] [--quick] [--only SECTION,…]     # the README's command
//! cargo bench --bench platform -- [the same arguments]
//! ```
//!
//! Every Inlet figure comes from real `inlet run` processes (the binary of this
//! build, so `cargo bench` measures the release profile) talking to the local
//! PostgreSQL (a fresh database per measurement, through `INLET_TEST_PG_ADMIN_URL`) or a
//! SQLite file, with the real `work_order` plugin, delivering over HTTP to a keep-alive
//! target in this process that answers 204. Anchors and Inlet take turns, round by
//! round; each figure is the median of the rounds. Sections (`--only`):
//!
//! - `plugin`: one decode + render + classify through the plugin beside the same logic
//!   compiled natively.
//! - `ingest`: raw PostgreSQL — one autocommitted `INSERT … ON CONFLICT DO NOTHING`
//!   per row, the same rows again (every insert conflicting), and 100 rows per
//!   transaction — from as many tasks over as many connections as Inlet's ingest
//!   gets; then Inlet's push ingest from `--clients` concurrent HTTP clients with the
//!   route paused (so the relay does not share the cores), and the same pushes again
//!   (every one a duplicate). SQLite: Inlet's own insert statement in a plain loop,
//!   one transaction per batch of `--clients` rows, beside Inlet's push ingest.
//! - `relay`: graphile-worker processing no-op jobs spread over as many serial queues
//!   as Inlet has keys (`benches/peer/graphile.mjs`, installed from npm by
//!   `scripts/ensure-graphile`), beside Inlet relaying a preloaded backlog to the HTTP
//!   target with per-key order. The relay's rate runs from its first delivery to its
//!   last (start-up is not counted). Then the same backlog over 10 keys, beside the
//!   rate over `--keys`.
//!   Beside the rates, the CPU each part spent per unit of work (`support::cpu`):
//!   PostgreSQL, inlet and this process's HTTP target per delivery; PostgreSQL and the
//!   peer's node per job; and what the whole machine has per job at the peer's rate.
//!   Every row of CPU per unit on PostgreSQL also gives the write-ahead log written per
//!   unit, bytes and full-page images (`support::wal`), and so does the sustained row:
//!   figures that hardly vary between runs, where a change of layout shows at once.
//! - `latency`: push → delivered as fast as it goes (closed loop), then at half that
//!   rate (open loop) with the p50/p99 time from sending a push to the target seeing
//!   its delivery. A push shed with 503 (more than `max_concurrent_pushes` in flight)
//!   is sent again after its `Retry-After`, timed from its first send; the sheds are
//!   counted in the row. The first 2 s of each open loop are sent but not counted.
//! - `pushdone`: the same closed loop at ordinary settings (route concurrency 16,
//!   `--messages` over 100 keys from 16 clients) beside graphile-worker batched at
//!   concurrency 24 over 100 serial queues (20,000 jobs), with what a delivery slot
//!   spends per delivery and the CPU per message by part (PostgreSQL, inlet, this
//!   process's clients and target) beside the peer's per job.
//! - `sustained`: ingest and relay together for `--sustain-seconds` (10 minutes) at 80 %
//!   of the maximum measured first (the closed loop as in `latency`, one run of ten
//!   times `--messages`), paced on a fresh database from 128 senders, each push timed
//!   from when it was due: push → delivery p50/p99 in the first minute (after the
//!   warm-up) beside the last, and the inlet process's RSS after the first minute
//!   beside the end (read every 5 s, printed minute by minute), with a goal of no
//!   growth (≤ 1.10×). `--sustain-rate N` pushes at N msg/s instead and measures no
//!   maximum: two builds compared at one load rather than each at 80 % of its own.
//! - `shadow`: the push → delivery p50/p99 of an open loop at a fixed rate
//!   (`--shadow-rate`, default 200 msg/s, for `--latency-seconds`) with no candidate, beside the same with a
//!   candidate plugin in shadow that sleeps (an hour per call, until its backstop),
//!   traps, or hoards memory at every call (`plugins/work-order-next`, chosen by the
//!   work order id's prefix). A warm-up pair runs first and is not counted. Each
//!   round runs, per candidate, a pair: without and with, back to back, the first of
//!   the pair alternating between rounds. A row's p50/p99 pool every latency of its
//!   runs; the goal is the candidate's p99 within 10 % of its paired runs' without,
//!   judged on the median of the pairs' own ratios from three pairs up (robust to the
//!   one pair a stall of the machine lands in; the pooled ratio, each pair's ratio and
//!   a 90 % bootstrap interval over pairs are beside it). An A/A row takes the runs
//!   without a candidate two by two and compares them the same way: the noise floor
//!   the ratios are read against. The candidate runs
//!   under the default pacing unless `--shadow-cpu-percent` or
//!   `--shadow-memory-churn-mib-per-s` set `[plugins]` otherwise. Each row also gives
//!   the page faults the inlet process took per message, which unlike a p99 hardly
//!   varies between runs: it shows whether a candidate makes the process's memory
//!   map work.
//! - `backlog`: one instance at 10k / 100k / 1M entries of backlog: its rate, its mean
//!   claim time (`inlet_claim_duration_seconds`), its peak RSS (VmHWM); at the largest,
//!   the rate in its first 5 s beside the rate after 60 s.
//! - `instances`: 1, 2 and 4 instances on one database draining one backlog
//!   (`--instances-backlog`, 100,000 entries: about ten seconds on a fast machine).
//!
//! `--pool N` gives every Inlet under test N pooled connections (`store.max_connections`,
//! default 8, the product's default); the bench's own pools keep 8. With the
//! `instances` section it tells contention for keys from the cost of more backends.
//!
//! `--pg-delay-us N` puts the database N µs away from Inlet in each direction for the
//! `backlog` and `instances` sections (`support::delay`, a proxy in this process; the
//! bench's own connections go direct): what round trips cost where the database is
//! across a network, which loopback hides.
//!
//! Benchmarks print figures; they assert no timing. A run that does not finish (a push
//! refused, deliveries missing, rows not DONE) fails loudly instead of printing.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod support;

use inlet::config::PluginLimits;
use inlet::inbox::{Pause, Store};
use inlet::plugin::Plugin;
use inlet_testkit::pg::TestPg;
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use inlet_testkit::push::{post_push, push_envelope};
use inlet_testkit::wait::wait_until;
use support::RawRow;
use support::calls::{native_cycle, per_call, plugin_cycle};
use support::cpu::{CpuMeter, CpuSpent};
use support::wal::{WalMeter, WalPer};

const ROUTE: &str = "bench";
/// Connections of the bench's own pools, and of each Inlet's unless `--pool` says
/// otherwise: Inlet's default `store.max_connections`.
const POOL: u32 = 8;
const STALL_LIMIT: Duration = Duration::from_secs(600);

// ---------------------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------------------

#[derive(Clone)]
struct Args {
    rounds: usize,
    /// Concurrent push clients (and raw-insert tasks).
    clients: usize,
    /// Messages per ingest measurement.
    messages: usize,
    /// Correlation keys of every backlog.
    keys: usize,
    /// The relay section's backlog.
    relay_backlog: usize,
    /// Jobs the peer processes per round.
    peer_jobs: usize,
    peer_concurrency: usize,
    /// The route's delivery concurrency.
    concurrency: usize,
    /// Each Inlet's `store.max_connections` (`--pool`).
    pool: u32,
    backlogs: Vec<usize>,
    instances: Vec<usize>,
    instances_backlog: usize,
    /// How long the largest backlog is worked on (its rate after 60 s needs > 60 s).
    long_window: Duration,
    latency_window: Duration,
    /// How long the sustained section pushes (at 80 % of the measured maximum, or at
    /// `--sustain-rate`).
    sustain_window: Duration,
    /// The sustained section's push rate instead of 80 % of its measured maximum
    /// (`--sustain-rate`): two builds compared at one load, not each at its own.
    sustain_rate: Option<f64>,
    /// The shadow section's push rate, messages per second.
    shadow_rate: f64,
    /// `[plugins] shadow_cpu_percent` of the runs with a candidate (`None`: the default).
    shadow_cpu_percent: Option<usize>,
    /// `[plugins] shadow_memory_churn_mib_per_s` of the runs with a candidate (`None`:
    /// the default).
    shadow_churn_mib_per_s: Option<usize>,
    /// The candidates the shadow section runs (prefixes of `CANDIDATES`, without `-`).
    shadow_candidates: Option<Vec<String>>,
    /// The backlog and instances sections' Inlet reaches PostgreSQL through a proxy
    /// that holds each byte back this long in each direction (`support::delay`).
    pg_delay: Option<Duration>,
    only: Option<Vec<String>>,
}

const SECTIONS: [&str; 9] =
    ["plugin", "ingest", "relay", "latency", "pushdone", "sustained", "shadow", "backlog", "instances"];

impl Args {
    fn full() -> Args {
        Args {
            rounds: 3,
            clients: 64,
            messages: 10_000,
            keys: 1_000,
            relay_backlog: 200_000,
            peer_jobs: 50_000,
            // Each side at the setting it does best with, measured here (2026-12-02,
            // relay section, one run each): graphile-worker 34,304 jobs/s at 32 and
            // 24,476 at 128; Inlet 3,950-4,924 deliveries/s at 256, 5,336-6,499 at
            // 600, 7,354 at 1,000 — one delivery in flight per key, the most per-key
            // order allows with 1,000 keys.
            peer_concurrency: 32,
            concurrency: 1_000,
            pool: POOL,
            backlogs: vec![10_000, 100_000, 1_000_000],
            instances: vec![1, 2, 4],
            instances_backlog: 100_000,
            long_window: Duration::from_secs(66),
            latency_window: Duration::from_secs(10),
            sustain_window: Duration::from_secs(600),
            sustain_rate: None,
            shadow_rate: 200.0,
            shadow_cpu_percent: None,
            shadow_churn_mib_per_s: None,
            shadow_candidates: None,
            pg_delay: None,
            only: None,
        }
    }

    /// Everything small: to see that the command works, not to measure.
    fn quick() -> Args {
        Args {
            rounds: 1,
            messages: 1_000,
            relay_backlog: 5_000,
            peer_jobs: 5_000,
            backlogs: vec![2_000, 10_000],
            instances: vec![1, 2],
            instances_backlog: 5_000,
            long_window: Duration::from_secs(8),
            latency_window: Duration::from_secs(3),
            sustain_window: Duration::from_secs(130),
            ..Args::full()
        }
    }

    fn sizing(&self) -> Sizing {
        Sizing { concurrency: self.concurrency, pool: self.pool }
    }

    fn wants(&self, section: &str) -> bool {
        self.only.as_ref().is_none_or(|o| o.iter().any(|s| s == section))
    }
}

fn usage() -> &'static str {
    "usage: scripts/bench [--quick] [--rounds N] [--only plugin,ingest,relay,latency,pushdone,sustained,shadow,backlog,instances] \
     [--clients N] [--messages N] [--keys N] [--relay-backlog N] [--peer-jobs N] [--peer-concurrency N] \
     [--concurrency N] [--backlogs N,N,…] [--instances N,N,…] [--instances-backlog N] [--shadow-rate N] [--latency-seconds N] [--sustain-seconds N] [--sustain-rate N] [--shadow-cpu-percent N] [--shadow-memory-churn-mib-per-s N] [--shadow-candidates sleep,trap,hoard] \
     [--pool N] [--pg-delay-us N]"
}

fn parse_args() -> Result<Args, String> {
    let raw: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let mut args = if raw.iter().any(|a| a == "--quick") { Args::quick() } else { Args::full() };
    let number = |flag: &str, v: &str| -> Result<usize, String> {
        v.replace('_', "")
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("{flag}: `{v}` is not a positive number"))
    };
    let list =
        |flag: &str, v: &str| -> Result<Vec<usize>, String> { v.split(',').map(|n| number(flag, n.trim())).collect() };
    let mut it = raw.iter();
    while let Some(flag) = it.next() {
        if flag == "--quick" {
            continue;
        }
        if flag == "--help" || flag == "-h" {
            println!("{}", usage());
            std::process::exit(0);
        }
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--rounds" => args.rounds = number(flag, v)?,
            "--clients" => args.clients = number(flag, v)?,
            "--messages" => args.messages = number(flag, v)?,
            "--keys" => args.keys = number(flag, v)?,
            "--relay-backlog" => args.relay_backlog = number(flag, v)?,
            "--peer-jobs" => args.peer_jobs = number(flag, v)?,
            "--peer-concurrency" => args.peer_concurrency = number(flag, v)?,
            "--concurrency" => args.concurrency = number(flag, v)?,
            "--pool" => args.pool = number(flag, v)? as u32,
            "--backlogs" => args.backlogs = list(flag, v)?,
            "--instances" => args.instances = list(flag, v)?,
            "--instances-backlog" => args.instances_backlog = number(flag, v)?,
            "--shadow-rate" => args.shadow_rate = number(flag, v)? as f64,
            "--latency-seconds" => args.latency_window = Duration::from_secs(number(flag, v)? as u64),
            "--sustain-seconds" => args.sustain_window = Duration::from_secs(number(flag, v)? as u64),
            "--sustain-rate" => args.sustain_rate = Some(number(flag, v)? as f64),
            "--shadow-cpu-percent" => args.shadow_cpu_percent = Some(number(flag, v)?),
            "--shadow-memory-churn-mib-per-s" => args.shadow_churn_mib_per_s = Some(number(flag, v)?),
            "--shadow-candidates" => {
                args.shadow_candidates = Some(v.split(',').map(|s| s.trim().to_string()).collect())
            }
            "--pg-delay-us" => args.pg_delay = Some(Duration::from_micros(number(flag, v)? as u64)),
            "--only" => {
                let names: Vec<String> = v.split(',').map(|s| s.trim().to_string()).collect();
                if let Some(bad) = names.iter().find(|n| !SECTIONS.contains(&n.as_str())) {
                    return Err(format!("--only: `{bad}` is not one of {}", SECTIONS.join(", ")));
                }
                args.only = Some(names);
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(args)
}

fn main() {
    let args = parse_args().unwrap_or_else(|e| {
        eprintln!("platform: {e}\n{}", usage());
        std::process::exit(2);
    });
    let plugin = support::work_order_plugin("platform");
    let mut report = Report::default();
    // Outside the runtime: it runs the plugin on a runtime of its own.
    if args.wants("plugin") {
        plugin_section(&plugin, &mut report);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let report = runtime.block_on(run(&args, &plugin, report));
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!();
    println!(
        "inlet platform benchmark: {} round(s), median shown; nproc={nproc}; {} push clients; route concurrency {}; \
         {} keys; Inlet's pool {} connections, the bench's {POOL}; PostgreSQL {}",
        args.rounds, args.clients, args.concurrency, args.keys, args.pool, report.pg_version
    );
    print!("{}", report.render());
}

async fn run(args: &Args, plugin: &Path, mut report: Report) -> Report {
    report.pg_version = pg_version().await;
    let target = Target::start().await;
    if args.wants("ingest") {
        ingest_section(args, plugin, &target, &mut report).await;
    }
    if args.wants("relay") {
        relay_section(args, plugin, &target, &mut report).await;
    }
    if args.wants("latency") {
        latency_section(args, plugin, &target, &mut report).await;
    }
    if args.wants("pushdone") {
        push_done_section(args, plugin, &target, &mut report).await;
    }
    if args.wants("sustained") {
        sustained_section(args, plugin, &target, &mut report).await;
    }
    if args.wants("shadow") {
        shadow_section(args, plugin, &target, &mut report).await;
    }
    if args.wants("backlog") {
        backlog_section(args, plugin, &target, &mut report).await;
    }
    if args.wants("instances") {
        instances_section(args, plugin, &target, &mut report).await;
    }
    report
}

async fn pg_version() -> String {
    let pg = TestPg::new().await;
    let pool = sqlx::PgPool::connect(&pg.url).await.expect("connect to PostgreSQL");
    let v: String = sqlx::query_scalar("SHOW server_version").fetch_one(&pool).await.expect("server_version");
    pool.close().await;
    v
}

// ---------------------------------------------------------------------------------------
// Plugin
// ---------------------------------------------------------------------------------------

fn plugin_section(path: &Path, report: &mut Report) {
    let cache = tempfile::tempdir().expect("tempdir");
    let plugin = Plugin::load(path, PluginLimits::default(), Some(cache.path())).expect("load the plugin");
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
    let n = 20_000;
    let native = per_call(n, native_cycle);
    let warm = per_call(n, || rt.block_on(plugin_cycle(&plugin)));
    report.row(
        "plugin",
        "decode + render + classify, warm instance",
        format!("{:.1} µs", warm.as_secs_f64() * 1e6),
        format!("native {:.1} µs", native.as_secs_f64() * 1e6),
        ratio(warm.as_secs_f64(), native.as_secs_f64()),
        None,
    );
}

// ---------------------------------------------------------------------------------------
// Ingest
// ---------------------------------------------------------------------------------------

async fn ingest_section(args: &Args, plugin: &Path, target: &Target, report: &mut Report) {
    let n = args.messages;
    let c = args.clients;
    let rows = RawRow::many(ROUTE, n, args.keys);
    let bodies = Arc::new(push_bodies(n, args.keys));
    let (mut one, mut conflict, mut batched, mut pushed, mut dup) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut wal, mut sqlite_pushed) = (vec![], vec![]);
    // CPU per row or push, by part: raw conflicting, raw 100/tx, Inlet's push, Inlet's duplicate.
    let (mut conflict_cpu, mut batched_cpu, mut pushed_cpu, mut dup_cpu) = (vec![], vec![], vec![], vec![]);
    let everyone = CpuPer::part(&[], None);
    for round in 1..=args.rounds {
        // PostgreSQL: the anchors on a fresh database…
        let pg = TestPg::new().await;
        let pool = pg_pool(&pg.url).await;
        sqlx::raw_sql(RAW_TABLE).execute(&pool).await.expect("create the raw table");
        one.push(rate(n, raw_pg_one_per_tx(&pool, &rows, c).await));
        let (meter, log) = (CpuMeter::start(), WalMeter::start(&pg.url).await);
        conflict.push(rate(n, raw_pg_one_per_tx(&pool, &rows, c).await));
        conflict_cpu.push(CpuPer::of(&meter.stop(&everyone), n).with_wal(log.stop(n).await));
        sqlx::raw_sql("TRUNCATE bench_raw").execute(&pool).await.expect("truncate");
        let (meter, log) = (CpuMeter::start(), WalMeter::start(&pg.url).await);
        batched.push(rate(n, raw_pg_batched(&pool, &rows, 100, c).await));
        batched_cpu.push(CpuPer::of(&meter.stop(&everyone), n).with_wal(log.stop(n).await));
        pool.close().await;
        drop(pg);
        // …then Inlet on another.
        let pg = TestPg::new().await;
        let ((first, first_cpu), (again, again_cpu)) =
            inlet_ingest(&pg.url, plugin, target, &bodies, args.keys, c, args.pool).await;
        pushed.push(rate(n, first));
        dup.push(rate(n, again));
        pushed_cpu.push(first_cpu);
        dup_cpu.push(again_cpu);
        drop(pg);
        // SQLite: the plain loop, then Inlet.
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("raw.db").display());
        wal.push(rate(n, raw_sqlite_loop(&url, &rows, c).await));
        let url = format!("sqlite://{}", dir.path().join("inbox.db").display());
        let ((first, _), _) = inlet_ingest(&url, plugin, target, &bodies, args.keys, c, args.pool).await;
        sqlite_pushed.push(rate(n, first));
        eprintln!(
            "ingest round {round}: pg raw 1/tx {:.0}, conflicting {:.0}, 100/tx {:.0}; inlet {:.0}, duplicates {:.0}; \
             sqlite loop {:.0}, inlet {:.0} /s",
            one[round - 1],
            conflict[round - 1],
            batched[round - 1],
            pushed[round - 1],
            dup[round - 1],
            wal[round - 1],
            sqlite_pushed[round - 1]
        );
    }
    let (one, conflict, batched, pushed, dup) =
        (median(one), median(conflict), median(batched), median(pushed), median(dup));
    let (wal, sqlite_pushed) = (median(wal), median(sqlite_pushed));
    let (conflict_cpu, batched_cpu) = (CpuPer::median(&conflict_cpu), CpuPer::median(&batched_cpu));
    let (pushed_cpu, dup_cpu) = (CpuPer::median(&pushed_cpu), CpuPer::median(&dup_cpu));
    report.row(
        "ingest pg",
        "raw INSERT … ON CONFLICT DO NOTHING, 1 row/tx",
        per_s(one, "rows"),
        String::new(),
        None,
        None,
    );
    report.row("ingest pg", "raw INSERT, 100 rows/tx", per_s(batched, "rows"), String::new(), None, None);
    report.row(
        "ingest pg",
        "inlet push ingest (route paused)",
        per_s(pushed, "msg"),
        format!("raw 100/tx {}", per_s(batched, "rows")),
        ratio(pushed, batched),
        Some(Goal::at_least(0.75, pushed / batched)),
    );
    // Where the cores went: the raw rows cost only PostgreSQL and the benchmark's
    // client; a push also costs its HTTP request (the clients are this process) and Inlet.
    report.row(
        "ingest pg",
        "CPU per push: postgres / inlet / HTTP clients / other, idle",
        pushed_cpu.describe(),
        format!("raw 100/tx per row: {}", batched_cpu.describe_raw()),
        None,
        None,
    );
    report.row(
        "ingest pg",
        "inlet push ingest vs raw 1 row/tx",
        per_s(pushed, "msg"),
        format!("raw 1/tx {}", per_s(one, "rows")),
        ratio(pushed, one),
        None,
    );
    // Cost per duplicate: the inverse of the rates.
    report.row(
        "ingest pg",
        "cost of a redelivered duplicate (time each)",
        format!("{:.0} µs", 1e6 / dup),
        format!("raw conflicting insert {:.0} µs", 1e6 / conflict),
        ratio(conflict, dup),
        Some(Goal::at_most(1.33, conflict / dup)),
    );
    report.row(
        "ingest pg",
        "CPU per duplicate: postgres / inlet / HTTP clients / other, idle",
        dup_cpu.describe(),
        format!("raw conflicting insert: {}", conflict_cpu.describe_raw()),
        None,
        None,
    );
    report.row(
        "ingest sqlite",
        "inlet push ingest",
        per_s(sqlite_pushed, "msg"),
        format!("plain WAL loop, {c}/tx {}", per_s(wal, "rows")),
        ratio(sqlite_pushed, wal),
        Some(Goal::at_least(1.0, sqlite_pushed / wal)),
    );
}

const RAW_TABLE: &str = "CREATE TABLE bench_raw (id BIGSERIAL PRIMARY KEY, route TEXT NOT NULL, \
     dedup_key TEXT NOT NULL, correlation_key TEXT, body BYTEA, raw_data BYTEA NOT NULL, \
     payload_digest TEXT NOT NULL, status TEXT NOT NULL, received_at BIGINT NOT NULL, \
     updated_at BIGINT NOT NULL, UNIQUE (route, dedup_key))";

const RAW_INSERT: &str = "INSERT INTO bench_raw (route, dedup_key, correlation_key, body, raw_data, payload_digest, \
     status, received_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, 'OPEN', $7, $7) \
     ON CONFLICT (route, dedup_key) DO NOTHING";

async fn pg_pool(url: &str) -> sqlx::PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(POOL)
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// Every row in its own autocommitted statement, from `tasks` tasks.
async fn raw_pg_one_per_tx(pool: &sqlx::PgPool, rows: &Arc<Vec<RawRow>>, tasks: usize) -> Duration {
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for t in 0..tasks {
        let (pool, rows) = (pool.clone(), Arc::clone(rows));
        set.spawn(async move {
            for row in rows.iter().skip(t).step_by(tasks) {
                support::bind_row!(RAW_INSERT, row).execute(&pool).await.expect("raw insert");
            }
        });
    }
    join_all(set).await;
    start.elapsed()
}

/// `batch` rows per transaction (one statement each), batches shared out over `tasks`.
async fn raw_pg_batched(pool: &sqlx::PgPool, rows: &Arc<Vec<RawRow>>, batch: usize, tasks: usize) -> Duration {
    let batches = rows.len().div_ceil(batch);
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for t in 0..tasks.min(batches) {
        let (pool, rows) = (pool.clone(), Arc::clone(rows));
        set.spawn(async move {
            for b in (t..batches).step_by(tasks) {
                let mut tx = pool.begin().await.expect("begin");
                for row in &rows[b * batch..((b + 1) * batch).min(rows.len())] {
                    support::bind_row!(RAW_INSERT, row).execute(&mut *tx).await.expect("raw insert");
                }
                tx.commit().await.expect("commit");
            }
        });
    }
    join_all(set).await;
    start.elapsed()
}

/// Inlet's own insert statement into Inlet's own schema, in one plain loop with
/// Inlet's pragmas: one transaction per `batch` rows.
async fn raw_sqlite_loop(url: &str, rows: &Arc<Vec<RawRow>>, batch: usize) -> Duration {
    drop(inlet::inbox::open(url, 1).await.expect("create the schema"));
    let options = inlet::inbox::sqlite::connect_options(url).expect("sqlite url");
    let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect_with(options).await.expect("open");
    let start = Instant::now();
    for chunk in rows.chunks(batch) {
        let mut tx = pool.begin().await.expect("begin");
        for r in chunk {
            let id: Option<i64> = sqlx::query_scalar(inlet::inbox::sqlite::INSERT_SQL)
                .bind(&r.route)
                .bind(&r.dedup_key)
                .bind(&r.correlation_key)
                .bind("work-order-completed")
                .bind("1")
                .bind(r.body.as_slice())
                .bind(r.raw_data.as_slice())
                .bind("[]")
                .bind(&r.dedup_key)
                .bind(None::<&str>)
                .bind(None::<i64>)
                .bind(&r.digest)
                .bind(None::<i64>)
                .bind("OPEN")
                .bind(r.now)
                .bind(None::<&str>)
                .bind(None::<i64>)
                .bind(None::<&str>)
                .fetch_optional(&mut *tx)
                .await
                .expect("insert");
            assert!(id.is_some(), "the plain loop's row was not inserted");
        }
        tx.commit().await.expect("commit");
    }
    let took = start.elapsed();
    pool.close().await;
    took
}

/// Inlet with its route paused: `bodies` pushed from `clients` clients (a key's
/// messages in order from one client), then the same again. The two push times, each
/// with the CPU spent per push.
async fn inlet_ingest(
    url: &str,
    plugin: &Path,
    target: &Target,
    bodies: &Arc<Vec<(usize, String)>>,
    keys: usize,
    clients: usize,
    pool: u32,
) -> ((Duration, CpuPer), (Duration, CpuPer)) {
    let store = inlet::inbox::open(url, 2).await.expect("open the store");
    pause(&store).await;
    let inlet = Instance::start(url, plugin, target, Sizing { concurrency: 8, pool }, "ingest").await;
    warm_up(&inlet).await;
    let pids = [inlet.process.pid()];
    let part = CpuPer::part(&pids, None);
    let n = bodies.len();
    let (meter, log) = (CpuMeter::start(), wal_meter(url).await);
    let first = push_all(&inlet.push_url(), bodies, keys, clients, "inserted").await;
    let first = (first, CpuPer::of(&meter.stop(&part), n).with_wal(wal_per(log, n).await));
    let (meter, log) = (CpuMeter::start(), wal_meter(url).await);
    let again = push_all(&inlet.push_url(), bodies, keys, clients, "duplicate").await;
    let again = (again, CpuPer::of(&meter.stop(&part), n).with_wal(wal_per(log, n).await));
    let stored = count_entries(&store).await;
    assert_eq!(stored, bodies.len() as u64 + 1, "inlet stored {stored} rows for {} pushes and a warm-up", bodies.len());
    inlet.stop();
    drop(store);
    (first, again)
}

/// One push through the paused route: connections, the plugin and the store warm.
async fn warm_up(inlet: &Instance) {
    let data = br#"{"workOrderId":"warmup","completedItems":1,"completionTimestamp":"2026-08-01T10:00:00Z"}"#;
    let status = post_push(&reqwest::Client::new(), &inlet.base(), ROUTE, &push_envelope(data, &[], "warmup")).await;
    assert_eq!(status, 200, "the warm-up push was answered {status}");
}

/// A [`WalMeter`] started on the server behind `url`, if it is PostgreSQL's.
async fn wal_meter(url: &str) -> Option<WalMeter> {
    match url.starts_with("postgres") {
        true => Some(WalMeter::start(url).await),
        false => None,
    }
}

/// The log written per unit since `log` started (none on SQLite).
async fn wal_per(log: Option<WalMeter>, units: usize) -> WalPer {
    match log {
        Some(log) => log.stop(units).await,
        None => WalPer::default(),
    }
}

/// Message `i` of key `key-{i % keys}` as a push envelope; its seq is `i / keys + 1`.
fn push_bodies(n: usize, keys: usize) -> Vec<(usize, String)> {
    (0..n).map(|i| (i, push_body(i, keys, ""))).collect()
}

/// Pushes every body from `clients` clients, each owning whole keys; panics unless
/// every answer is 200 with the `outcome` expected. The time until the last answer.
///
/// Each client is one bare HTTP/1.1 connection (hyper's, no pool): the pushers are the
/// load, not what is measured, and they share the two cores with Inlet and PostgreSQL.
/// A `reqwest` client per request (URL parse, pool checkout, header map) cost 16–28 µs
/// of CPU per push, more than the raw anchor's whole client (docs/measurements.md).
async fn push_all(
    url: &str,
    bodies: &Arc<Vec<(usize, String)>>,
    keys: usize,
    clients: usize,
    outcome: &'static str,
) -> Duration {
    let url = reqwest::Url::parse(url).expect("the push URL");
    let host = url.host_str().expect("the push URL's host");
    let authority = format!("{host}:{}", url.port_or_known_default().expect("the push URL's port"));
    let mut lanes = Vec::with_capacity(clients);
    for _ in 0..clients {
        lanes.push(Pusher::connect(&authority, url.path()).await);
    }
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for (lane, mut pusher) in lanes.into_iter().enumerate() {
        let bodies = Arc::clone(bodies);
        set.spawn(async move {
            for (i, body) in bodies.iter().filter(|(i, _)| (i % keys) % clients == lane) {
                let (status, text) = pusher.post(body).await.unwrap_or_else(|e| panic!("push {i}: {e}"));
                assert!(
                    status == 200 && text.contains(outcome),
                    "push {i}: {status} {text} (wanted outcome {outcome})"
                );
            }
        });
    }
    join_all(set).await;
    start.elapsed()
}

/// One push client: a kept-alive HTTP/1.1 connection that sends one request at a time.
struct Pusher {
    sender: hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>,
    /// `host:port`: where it connects, and its `Host` header.
    authority: String,
    path: String,
}

impl Pusher {
    async fn connect(authority: &str, path: &str) -> Pusher {
        let stream =
            tokio::net::TcpStream::connect(authority).await.unwrap_or_else(|e| panic!("connect to {authority}: {e}"));
        stream.set_nodelay(true).expect("TCP_NODELAY");
        let (sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("an HTTP/1.1 handshake");
        // Drives the connection until the sender is dropped.
        tokio::spawn(connection);
        Pusher { sender, authority: authority.to_string(), path: path.to_string() }
    }

    /// POSTs one push envelope; the answer's status and body.
    async fn post(&mut self, body: &str) -> Result<(u16, String), Box<dyn std::error::Error + Send + Sync>> {
        use http_body_util::BodyExt;
        self.sender.ready().await?;
        let request = hyper::Request::post(self.path.as_str())
            .header(hyper::header::HOST, self.authority.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::copy_from_slice(body.as_bytes())))?;
        let answer = self.sender.send_request(request).await?;
        let status = answer.status().as_u16();
        let text = answer.into_body().collect().await?.to_bytes();
        Ok((status, String::from_utf8_lossy(&text).into_owned()))
    }
}

// ---------------------------------------------------------------------------------------
// Relay beside the peer
// ---------------------------------------------------------------------------------------

/// The keys of the relay section's few-keys row: the same backlog as its main row over
/// this many keys, beside the main row's rate. After a target's outage the backlog of
/// a route is often a few keys deep, and each key has one entry in flight at a time,
/// so how fast such a backlog drains is a figure of its own.
const FEW_KEYS: usize = 10;

async fn relay_section(args: &Args, plugin: &Path, target: &Target, report: &mut Report) {
    let peer = Peer::install();
    let few = (args.keys > FEW_KEYS).then(|| Args { keys: FEW_KEYS, ..args.clone() });
    let mut few_keys = vec![];
    let (mut relay, mut peers) = (vec![], vec![]);
    let (mut relay_cpu, mut peer_cpu) = (vec![], vec![]);
    let mut version = String::new();
    for round in 1..=args.rounds {
        let run = peer.run(args.peer_jobs, args.keys, args.peer_concurrency).await;
        let p = run.jobs_per_s;
        version = run.version;
        let drain = relay_drain(args, plugin, target, args.relay_backlog, 1).await;
        let r = drain.rate;
        eprintln!(
            "relay round {round}: graphile-worker {p:.0} jobs/s, inlet relay {r:.0} deliveries/s; CPU per job: {}; \
             per delivery: {}",
            run.cpu.describe(),
            drain.cpu.describe()
        );
        peers.push(p);
        relay.push(r);
        peer_cpu.push(run.cpu);
        relay_cpu.push(drain.cpu);
        if let Some(few) = &few {
            let f = relay_drain(few, plugin, target, args.relay_backlog, 1).await.rate;
            eprintln!("relay round {round}: inlet relay over {FEW_KEYS} keys {f:.0} deliveries/s");
            few_keys.push(f);
        }
    }
    let (relay, peer_rate) = (median(relay), median(peers));
    let (relay_cpu, peer_cpu) = (CpuPer::median(&relay_cpu), CpuPer::median(&peer_cpu));
    report.row(
        "relay pg",
        &format!("inlet relay, {} backlog over {} keys, per-key order, HTTP", args.relay_backlog, args.keys),
        per_s(relay, "deliveries"),
        format!(
            "graphile-worker {} no-op, {} jobs over {} queues, concurrency {}: {}",
            version,
            args.peer_jobs,
            args.keys,
            args.peer_concurrency,
            per_s(peer_rate, "jobs")
        ),
        ratio(relay, peer_rate),
        Some(Goal::at_least(1.0, relay / peer_rate)),
    );
    if !few_keys.is_empty() {
        let few_rate = median(few_keys);
        report.row(
            "relay pg",
            &format!("inlet relay, {} backlog over {FEW_KEYS} keys, per-key order, HTTP", args.relay_backlog),
            per_s(few_rate, "deliveries"),
            format!("the same over {} keys: {}", args.keys, per_s(relay, "deliveries")),
            ratio(few_rate, relay),
            Some(Goal::at_least(0.5, few_rate / relay)),
        );
    }
    // Where the cores went, per unit of work: what stands between the two rates.
    report.row(
        "relay pg",
        "CPU per delivery: postgres / inlet / HTTP target / other, idle",
        relay_cpu.describe(),
        peer_cpu_beside(&peer_cpu, peer_rate),
        None,
        None,
    );
}

/// The peer's CPU per job by part, and what the whole machine has per job at the
/// peer's rate (`cores / rate`): the column beside a row of Inlet's CPU per unit.
fn peer_cpu_beside(peer_cpu: &CpuPer, peer_rate: f64) -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    format!(
        "graphile-worker per job: {}; all {cores:.0} cores at its rate: {:.0} µs per job",
        peer_cpu.describe(),
        cores * 1e6 / peer_rate
    )
}

/// CPU per unit of work by part, in µs, and the share of the machine left idle: from a
/// [`CpuMeter`] over the phase that did the work.
#[derive(Clone, Copy, Default)]
struct CpuPer {
    postgres: f64,
    inlet: f64,
    /// The benchmark's own process: the HTTP target (and its polling).
    bench: f64,
    /// The peer's Node.js process.
    node: f64,
    other: f64,
    idle: f64,
    /// What PostgreSQL wrote to its log per unit (none measured: zero).
    wal: WalPer,
}

impl CpuPer {
    fn of(spent: &CpuSpent, units: usize) -> CpuPer {
        CpuPer {
            postgres: spent.micros_per("postgres", units),
            inlet: spent.micros_per("inlet", units),
            bench: spent.micros_per("bench", units),
            node: spent.micros_per("node", units),
            other: spent.micros_per("other", units),
            idle: spent.idle,
            wal: WalPer::default(),
        }
    }

    /// With the log written per unit over the same phase.
    fn with_wal(self, wal: WalPer) -> CpuPer {
        CpuPer { wal, ..self }
    }

    /// The group of a process: this benchmark, one of `inlets`, the peer `node`, a
    /// PostgreSQL process, or other.
    fn part(inlets: &[u32], node: Option<u32>) -> impl Fn(u32, &str) -> &'static str {
        move |pid, comm| {
            if pid == std::process::id() {
                "bench"
            } else if inlets.contains(&pid) {
                "inlet"
            } else if Some(pid) == node {
                "node"
            } else if comm == "postgres" {
                "postgres"
            } else {
                "other"
            }
        }
    }

    /// The median of each figure over the rounds.
    fn median(rounds: &[CpuPer]) -> CpuPer {
        let m = |f: fn(&CpuPer) -> f64| median(rounds.iter().map(f).collect());
        CpuPer {
            postgres: m(|c| c.postgres),
            inlet: m(|c| c.inlet),
            bench: m(|c| c.bench),
            node: m(|c| c.node),
            other: m(|c| c.other),
            idle: m(|c| c.idle),
            wal: WalPer { bytes: m(|c| c.wal.bytes), full_pages: m(|c| c.wal.full_pages) },
        }
    }

    /// `, WAL N B (F full pages)`, if the log was measured.
    fn describe_wal(&self) -> String {
        if self.wal.bytes > 0.0 {
            format!(", WAL {:.0} B ({:.2} full pages)", self.wal.bytes, self.wal.full_pages)
        } else {
            String::new()
        }
    }

    /// For a raw anchor: only PostgreSQL and this process (its client) take part.
    fn describe_raw(&self) -> String {
        format!(
            "postgres {:.0} / client {:.0} / other {:.0} µs, idle {:.0} %{}",
            self.postgres,
            self.bench,
            self.other + self.inlet + self.node,
            self.idle * 100.0,
            self.describe_wal()
        )
    }

    fn describe(&self) -> String {
        if self.node > 0.0 {
            format!(
                "postgres {:.0} / node {:.0} / other {:.0} µs, idle {:.0} %{}",
                self.postgres,
                self.node,
                self.bench + self.other + self.inlet,
                self.idle * 100.0,
                self.describe_wal()
            )
        } else {
            format!(
                "{:.0} / {:.0} / {:.0} / {:.0} µs, idle {:.0} %{}",
                self.postgres,
                self.inlet,
                self.bench,
                self.other,
                self.idle * 100.0,
                self.describe_wal()
            )
        }
    }
}

/// What one drain measured.
struct Drain {
    /// Deliveries per second from the first delivery to the last (or to the window's end).
    rate: f64,
    /// Deliveries in the first 5 s and in the 5 s after 60 s, per second (if it lasted).
    first_5s: Option<f64>,
    after_60s: Option<f64>,
    claim_ms: Option<f64>,
    /// Entries claimed by settles (`inlet_claims_handed_on_total`) per delivery.
    handed_on: Option<f64>,
    /// How the settles were committed (`inlet_group_commit_*`).
    settles: Option<SettleBatches>,
    peak_rss_mib: Option<f64>,
    /// CPU per delivery by part, from the route's resume to the last delivery seen.
    cpu: CpuPer,
}

/// How a drain's settles were committed, over every instance.
struct SettleBatches {
    /// Settles per batch.
    size: f64,
    /// A batch's write, in ms.
    write_ms: f64,
    /// Batches that waited the whole linger for a settle that did not come, per batch.
    lingered_out: f64,
}

impl SettleBatches {
    /// The totals of the settles' (and the inserts', which a drain has none of)
    /// group-commit series over `instances`.
    async fn read(instances: &[Instance]) -> Option<SettleBatches> {
        let names = [
            "inlet_group_commit_batch_size_sum",
            "inlet_group_commit_batch_size_count",
            "inlet_group_commit_seconds_sum",
            "inlet_group_commit_lingered_out_total",
        ];
        let [writes, batches, seconds, lingered_out] = series_totals(instances, names.map(String::from)).await?;
        (batches > 0.0).then(|| SettleBatches {
            size: writes / batches,
            write_ms: seconds * 1e3 / batches,
            lingered_out: lingered_out / batches,
        })
    }

    fn describe(&self) -> String {
        format!(
            "{:.1} settles per batch, {:.2} ms per batch, {:.0} % lingered out",
            self.size,
            self.write_ms,
            self.lingered_out * 100.0
        )
    }
}

/// A fresh database with `backlog` OPEN entries, `instances` processes working it off
/// into the target, until all are delivered and DONE (or until `window` passes, if
/// given: then the rate is over the window).
async fn relay_drain(args: &Args, plugin: &Path, target: &Target, backlog: usize, instances: usize) -> Drain {
    relay_drain_for(args, plugin, target, backlog, instances, None).await
}

async fn relay_drain_for(
    args: &Args,
    plugin: &Path,
    target: &Target,
    backlog: usize,
    instances: usize,
    window: Option<Duration>,
) -> Drain {
    let pg = TestPg::new().await;
    let store = inlet::inbox::open(&pg.url, 2).await.expect("open the store");
    let pool = pg_pool(&pg.url).await;
    let loading = Instant::now();
    preload(&pool, backlog, args.keys).await;
    eprintln!("  backlog of {backlog} loaded in {:.1} s", loading.elapsed().as_secs_f64());
    pause(&store).await;
    // Inlet reaches the database through the delay proxy, if asked; the bench directly.
    let url = match args.pg_delay {
        Some(delay) => {
            let mut url = reqwest::Url::parse(&pg.url).expect("the database's URL");
            let upstream = format!("{}:{}", url.host_str().expect("a host"), url.port().unwrap_or(5432));
            let proxy = support::delay::DelayProxy::start(upstream.parse().expect("an IP address"), delay);
            url.set_port(Some(proxy.addr.port())).expect("a port");
            url.to_string()
        }
        None => pg.url.clone(),
    };
    let mut running = Vec::new();
    for i in 0..instances {
        running.push(Instance::start(&url, plugin, target, args.sizing(), &format!("relay-{i}")).await);
    }
    // The drain starts once every instance has its part of the keys (the route's
    // members, read every second).
    let want = (instances * instances) as f64;
    wait_until("every instance to see the others", Duration::from_secs(30), || {
        let running = &running;
        async move { series_totals(running, ["inlet_route_instances".to_string()]).await.is_some_and(|[n]| n == want) }
    })
    .await;
    let claims_before = sum_metric(&running, "inlet_claim_duration_seconds").await;
    target.reset();
    let (meter, log) = (CpuMeter::start(), WalMeter::start(&pg.url).await);
    store.resume_route(ROUTE).await.expect("resume");
    store.announce(&[ROUTE.to_string()]).await.expect("announce");

    let mut samples: Vec<(Instant, u64)> = Vec::new();
    let mut peak_kib = 0u64;
    let mut ticks = tokio::time::interval(Duration::from_millis(100));
    let began = Instant::now();
    loop {
        ticks.tick().await;
        let n = target.count();
        if let Some(first) = target.first() {
            samples.push((Instant::now(), n));
            if window.is_some_and(|w| first.elapsed() >= w) {
                break;
            }
        }
        for inlet in &mut running {
            inlet.process.assert_running();
            peak_kib = peak_kib.max(inlet.hwm_kib());
        }
        if n >= backlog as u64 {
            break;
        }
        assert!(began.elapsed() < STALL_LIMIT, "only {n} of {backlog} delivered after {STALL_LIMIT:?}");
    }
    let inlets: Vec<u32> = running.iter().map(|i| i.process.pid()).collect();
    let delivered = target.count() as usize;
    let cpu = CpuPer::of(&meter.stop(CpuPer::part(&inlets, None)), delivered).with_wal(log.stop(delivered).await);
    let claims_after = sum_metric(&running, "inlet_claim_duration_seconds").await;
    let handed_on = series_totals(&running, ["inlet_claims_handed_on_total".to_string()])
        .await
        .map(|[n]| n / target.count().max(1) as f64);
    let settles = SettleBatches::read(&running).await;
    let first = target.first().expect("a first delivery");
    let (rate, drained) = if target.count() >= backlog as u64 {
        let last = target.last().expect("a last delivery");
        ((backlog as f64 - 1.0) / (last - first).as_secs_f64(), true)
    } else {
        let (at, n) = *samples.last().expect("samples");
        (n as f64 / (at - first).as_secs_f64(), false)
    };
    let at = |secs: u64| -> Option<u64> {
        let t = first + Duration::from_secs(secs);
        samples.iter().find(|(when, _)| *when >= t).map(|(_, n)| *n)
    };
    let first_5s = at(5).map(|n| n as f64 / 5.0);
    let after_60s = at(60).zip(at(65)).map(|(a, b)| (b - a) as f64 / 5.0);
    let claim_ms = match (claims_before, claims_after) {
        (Some((s0, c0)), Some((s1, c1))) if c1 > c0 => Some((s1 - s0) * 1e3 / (c1 - c0)),
        _ => None,
    };
    if drained {
        // Delivered is not settled: wait for every row to be DONE.
        let want = backlog as u64;
        wait_until("every delivered entry to be DONE", Duration::from_secs(120), || {
            let store = Arc::clone(&store);
            async move { done_count(&store).await >= want }
        })
        .await;
        let seen = target.count();
        if seen != want {
            eprintln!(
                "  WARNING: the target saw {seen} requests for {want} entries (redeliveries after a lost settle?)"
            );
        }
    }
    for inlet in running {
        inlet.stop();
    }
    pool.close().await;
    drop(store);
    drop(pg);
    Drain { rate, first_5s, after_60s, claim_ms, handed_on, settles, peak_rss_mib: Some(peak_kib as f64 / 1024.0), cpu }
}

/// `n` OPEN entries as the work-order plugin decodes them, entry `i` of key
/// `key-{i % keys}` with seq `i / keys + 1`, ids in order.
async fn preload(pool: &sqlx::PgPool, n: usize, keys: usize) {
    const CHUNK: usize = 200_000;
    for from in (0..n).step_by(CHUNK) {
        let to = (from + CHUNK).min(n);
        sqlx::query(
            "INSERT INTO inbox_entry (route, dedup_key, correlation_key, event_type, schema_version, body, raw_data,
                 attributes, message_id, payload_digest, status, attempts, next_attempt_at, received_at, updated_at)
             SELECT $1, 'bench-' || i, 'key-' || (i % $4), 'work-order-completed', '1', b, b, '[]', 'bench-' || i,
                 md5(i::text), 'OPEN', 0, 0, 0, 0
             FROM generate_series($2::bigint, $3::bigint - 1) AS i,
                 LATERAL convert_to('{\"workOrderId\":\"key-' || (i % $4) || '\",\"completedItems\":' || (i / $4 + 1)
                     || ',\"completionTimestamp\":\"2026-08-01T10:00:00Z\"}', 'UTF8') AS b
             ORDER BY i",
        )
        .bind(ROUTE)
        .bind(from as i64)
        .bind(to as i64)
        .bind(keys as i64)
        .execute(pool)
        .await
        .expect("preload the backlog");
    }
    sqlx::query("VACUUM ANALYZE inbox_entry").execute(pool).await.expect("vacuum analyze");
}

// ---------------------------------------------------------------------------------------
// Latency
// ---------------------------------------------------------------------------------------

async fn latency_section(args: &Args, plugin: &Path, target: &Target, report: &mut Report) {
    let n = args.messages;
    let bodies = Arc::new(push_bodies(n, args.keys));
    let mut closed = vec![];
    for round in 1..=args.rounds {
        let per_s = closed_loop(args, plugin, target, &bodies, "latency").await;
        closed.push(per_s);
        eprintln!("latency round {round}: push -> delivered {per_s:.0} msg/s");
    }
    let closed = median(closed);
    report.row("latency pg", "push -> delivered, closed loop", per_s(closed, "msg"), String::new(), None, None);

    // Half that rate, open loop, on a fresh database.
    let half = closed / 2.0;
    let total = (half * args.latency_window.as_secs_f64()) as usize;
    let pg = TestPg::new().await;
    let inlet = Instance::start(&pg.url, plugin, target, args.sizing(), "latency").await;
    let paced = paced_latency(args, &inlet, target, total, "", half).await;
    report.row(
        "latency pg",
        &format!("push -> delivery at {half:.0} msg/s (half), p50 / p99"),
        format!("{:.1} ms / {:.1} ms", ms(paced.p50), ms(paced.p99)),
        format!(
            "{total} pushes over {:.0} s, {} shed (503) and {} refused connections, sent again",
            args.latency_window.as_secs_f64(),
            paced.shed,
            paced.refused
        ),
        None,
        None,
    );
    inlet.stop();
    drop(pg);
}

/// The push -> delivered row at ordinary settings: a route's concurrency as routing
/// files set it, keys and pushers as a product team's traffic has them.
const PUSH_DONE_KEYS: usize = 100;
const PUSH_DONE_CLIENTS: usize = 16;
const PUSH_DONE_CONCURRENCY: usize = 16;
/// The peer beside it: graphile-worker batched (localQueue) at a similar concurrency,
/// over as many serial queues as Inlet has keys.
const PUSH_DONE_PEER_JOBS: usize = 20_000;
const PUSH_DONE_PEER_CONCURRENCY: usize = 24;

/// Ingest and relay together at route concurrency 16: `--messages` pushes over 100
/// keys from 16 clients, from the first push to the last delivery, beside
/// graphile-worker draining no-op jobs over as many queues at concurrency 24. What a
/// delivery slot spends per delivery (concurrency / rate) is the figure that decides
/// it: a slot's time per delivery must be a few milliseconds.
async fn push_done_section(args: &Args, plugin: &Path, target: &Target, report: &mut Report) {
    let peer = Peer::install();
    let n = args.messages;
    let bodies = Arc::new(push_bodies(n, PUSH_DONE_KEYS));
    let load = Load {
        keys: PUSH_DONE_KEYS,
        clients: PUSH_DONE_CLIENTS,
        sizing: Sizing { concurrency: PUSH_DONE_CONCURRENCY, pool: args.pool },
    };
    let jobs = PUSH_DONE_PEER_JOBS.min(args.peer_jobs);
    let (mut inlet, mut peers, mut version, mut phases) = (vec![], vec![], String::new(), String::new());
    let (mut inlet_cpu, mut peer_cpu) = (vec![], vec![]);
    for round in 1..=args.rounds {
        let run = peer.run(jobs, PUSH_DONE_KEYS, PUSH_DONE_PEER_CONCURRENCY).await;
        version = run.version;
        peer_cpu.push(run.cpu);
        let ClosedLoop { per_s, metrics, cpu } = closed_loop_at(load, plugin, target, &bodies, "pushdone").await;
        phases = slot_phases(&metrics);
        eprintln!(
            "pushdone round {round}: graphile-worker {:.0} jobs/s, inlet push -> delivered {per_s:.0} msg/s \
             ({:.2} ms per delivery per slot: {}; CPU per message {})",
            run.jobs_per_s,
            PUSH_DONE_CONCURRENCY as f64 * 1e3 / per_s,
            phases,
            cpu.describe()
        );
        inlet_cpu.push(cpu);
        peers.push(run.jobs_per_s);
        inlet.push(per_s);
    }
    let (inlet, peer_rate) = (median(inlet), median(peers));
    report.row(
        "pushdone pg",
        &format!(
            "push -> delivered, {n} over {PUSH_DONE_KEYS} keys from {PUSH_DONE_CLIENTS} clients, route concurrency \
             {PUSH_DONE_CONCURRENCY}: {:.2} ms per delivery per slot",
            PUSH_DONE_CONCURRENCY as f64 * 1e3 / inlet
        ),
        per_s(inlet, "msg"),
        format!(
            "graphile-worker {version} batched, {jobs} jobs over {PUSH_DONE_KEYS} queues, concurrency \
             {PUSH_DONE_PEER_CONCURRENCY}: {}",
            per_s(peer_rate, "jobs")
        ),
        ratio(inlet, peer_rate),
        Some(Goal::at_least(0.5, inlet / peer_rate)),
    );
    report.row("pushdone pg", "where the slots' time went (last round)", phases, String::new(), None, None);
    // Where the cores went, per message: the pushes' HTTP clients and the target are
    // this process. With the cores all busy, a slot's time per delivery is mostly its
    // wait for a core, and only less CPU per message raises the rate.
    let (inlet_cpu, peer_cpu) = (CpuPer::median(&inlet_cpu), CpuPer::median(&peer_cpu));
    report.row(
        "pushdone pg",
        "CPU per message: postgres / inlet / HTTP clients and target / other, idle",
        inlet_cpu.describe(),
        peer_cpu_beside(&peer_cpu, peer_rate),
        None,
        None,
    );
}

/// The sustained section's maximum is measured over this many times `--messages`.
const SUSTAIN_MAX_TIMES: usize = 10;
/// How long the sustained section's first and last windows are.
const SUSTAIN_EDGE: Duration = Duration::from_secs(60);
/// How often the sustained section reads the inlet process's RSS.
const RSS_EVERY: Duration = Duration::from_secs(5);
/// The most the inlet process's RSS may grow from the end of the sustained run's first
/// minute to its end and still count as no growth (what an allocator's arenas and a
/// connection pool settling in take, not a leak: a leak grows with every message).
const RSS_GROWTH_ALLOWED: f64 = 1.10;

/// Ingest and relay together, as long as `--sustain-seconds` says (10 minutes by
/// default), at 80 % of the maximum measured in the same run: the closed-loop push →
/// delivered rate on a fresh database. Then the open loop on another fresh database:
/// p50/p99 push → delivery in the first minute (after the warm-up) and in the last,
/// and the inlet process's RSS at the end of the first minute and at the end. A relay
/// that falls behind shows as a last minute slower than the first; a leak, as RSS
/// that grows.
async fn sustained_section(args: &Args, plugin: &Path, target: &Target, report: &mut Report) {
    let section = "sustained pg";
    // The maximum over ten times the latency section's messages (about half a minute
    // here): a burst of 10,000 on an empty table measured 3,137 to 4,625 msg/s in one
    // afternoon, and 80 % of its high end was more than the instance could keep up
    // for ten minutes.
    let per_second = match args.sustain_rate {
        Some(rate) => {
            eprintln!("sustained: at {rate:.0} msg/s as --sustain-rate says (no maximum measured)");
            rate
        }
        None => {
            let n = args.messages * SUSTAIN_MAX_TIMES;
            let bodies = Arc::new(push_bodies(n, args.keys));
            let max = closed_loop(args, plugin, target, &bodies, "sustained-max").await;
            eprintln!("sustained: the maximum, push -> delivered closed loop, {max:.0} msg/s");
            report.row(
                section,
                "push -> delivered, closed loop (the maximum)",
                per_s(max, "msg"),
                format!("{n} pushes from {} clients", args.clients),
                None,
                None,
            );
            max * 0.8
        }
    };
    let window = args.sustain_window;
    let total = (per_second * window.as_secs_f64()) as usize;
    let pg = TestPg::new().await;
    let inlet = Instance::start(&pg.url, plugin, target, args.sizing(), "sustained").await;
    let rss = {
        let pid = inlet.process.pid();
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (stop2, samples2) = (Arc::clone(&stop), Arc::clone(&samples));
        let task = tokio::spawn(async move {
            let start = Instant::now();
            let mut ticks = tokio::time::interval(RSS_EVERY);
            while !stop2.load(Ordering::SeqCst) {
                ticks.tick().await;
                samples2.lock().unwrap().push((start.elapsed(), rss_kib(pid)));
            }
        });
        (stop, samples, task)
    };
    eprintln!("sustained: {total} pushes at {per_second:.0} msg/s for {} s", window.as_secs());
    let log = WalMeter::start(&pg.url).await;
    let (paced, late, worst, began) = sustained_run(args, &inlet, target, total, per_second).await;
    let wal = log.stop(total).await;
    rss.0.store(true, Ordering::SeqCst);
    rss.2.await.expect("the RSS sampler");
    let samples = rss.1.lock().unwrap().clone();
    inlet.stop();
    drop(pg);

    // Push i was due i / per_second seconds in: the first and the last minute by number.
    let edge = (SUSTAIN_EDGE.as_secs_f64() * per_second) as usize;
    let of = |from: usize, to: usize| {
        let mut l: Vec<Duration> =
            paced.by_push.iter().filter(|(i, _)| (from..to).contains(i)).map(|(_, l)| *l).collect();
        l.sort();
        l
    };
    let (first, last) = (of(0, edge), of(total.saturating_sub(edge), total));
    // Minute by minute, to see when a run that ends slower than it began turned.
    for (minute, from) in (0..total).step_by(edge.max(1)).enumerate() {
        let l = of(from, (from + edge).min(total));
        // A last part of a minute's few pushes says nothing of its own.
        if l.len() >= edge / 2 {
            eprintln!(
                "sustained: minute {:>2}: p50 {:.1} ms, p99 {:.1} ms",
                minute + 1,
                ms(quantile(&l, 0.5)),
                ms(quantile(&l, 0.99))
            );
        }
    }
    for (from, to) in stalled_seconds(&paced.by_push, per_second) {
        eprintln!(
            "sustained: stalled (a push due then waited over {} ms): {}-{} UTC, {from}-{to} s in",
            STALLED.as_millis(),
            clock(began + Duration::from_secs(from)),
            clock(began + Duration::from_secs(to + 1)),
        );
    }
    assert!(!first.is_empty() && !last.is_empty(), "the sustained run is shorter than its first and last minutes");
    report.row(
        section,
        &format!(
            "push -> delivery at {per_second:.0} msg/s ({}) for {} s, p50 / p99",
            if args.sustain_rate.is_some() { "--sustain-rate" } else { "80 %" },
            window.as_secs()
        ),
        format!("first minute {:.1} / {:.1} ms", ms(quantile(&first, 0.5)), ms(quantile(&first, 0.99))),
        format!(
            "last minute {:.1} / {:.1} ms; whole run {:.1} / {:.1} ms; {total} pushes from {SUSTAIN_SENDERS} senders, \
             {late} sent over {} ms after they were due (the longest {:.0} ms), {} shed (503) and {} refused \
             connections, sent again; WAL per message {:.0} B ({:.2} full pages)",
            ms(quantile(&last, 0.5)),
            ms(quantile(&last, 0.99)),
            ms(paced.p50),
            ms(paced.p99),
            LATE.as_millis(),
            ms(worst),
            paced.shed,
            paced.refused,
            wal.bytes,
            wal.full_pages
        ),
        ratio(ms(quantile(&last, 0.99)), ms(quantile(&first, 0.99))),
        None,
    );
    // RSS at the end of the first minute, and at the end (every push delivered).
    let at = |t: Duration| samples.iter().rfind(|(s, _)| *s <= t).map_or(0, |(_, k)| *k);
    let (settled, end) = (at(SUSTAIN_EDGE), samples.last().map_or(0, |(_, k)| *k));
    let peak = samples.iter().map(|(_, k)| *k).max().unwrap_or(0);
    // Minute by minute: growth that levels off is the allocator and the pools settling
    // in; growth at the same pace every minute is a leak.
    for minute in 1..=samples.last().map_or(0, |(s, _)| s.as_secs() / 60) {
        let t = Duration::from_secs(minute * 60);
        eprintln!("sustained: RSS at minute {minute:>2}: {:.1} MiB", at(t) as f64 / 1024.0);
    }
    let growth = ratio(end as f64, settled as f64);
    report.row(
        section,
        "inlet RSS, end / after the first minute",
        format!("{:.1} MiB", end as f64 / 1024.0),
        format!("after the first minute {:.1} MiB; peak {:.1} MiB", settled as f64 / 1024.0, peak as f64 / 1024.0),
        growth,
        growth.map(|g| Goal::at_most(RSS_GROWTH_ALLOWED, g)),
    );
}

/// A push that waited this long for its delivery marks its second as stalled.
const STALLED: Duration = Duration::from_secs(1);

/// The stretches of seconds (by when pushes were due, from the run's start; both ends
/// included) in which some push waited over [`STALLED`], so a stall can be matched to
/// the database's log by wall-clock time.
fn stalled_seconds(by_push: &[(usize, Duration)], per_s: f64) -> Vec<(u64, u64)> {
    let mut seconds: Vec<u64> =
        by_push.iter().filter(|(_, l)| *l > STALLED).map(|(i, _)| (*i as f64 / per_s) as u64).collect();
    seconds.sort_unstable();
    seconds.dedup();
    let mut stretches: Vec<(u64, u64)> = Vec::new();
    for s in seconds {
        match stretches.last_mut() {
            Some((_, to)) if *to + 1 == s => *to = s,
            _ => stretches.push((s, s)),
        }
    }
    stretches
}

/// `at` as UTC wall-clock time, `HH:MM:SS` (PostgreSQL's log prints it so).
fn clock(at: std::time::SystemTime) -> String {
    let s = at.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()) % 86_400;
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// Senders of the sustained run: Inlet's default `max_concurrent_pushes`, so no push
/// is shed for their number.
const SUSTAIN_SENDERS: usize = 128;
/// A push sent this long after it was due was sent late (all senders were busy).
const LATE: Duration = Duration::from_millis(10);

/// Pushes `total` messages, push `i` due `i / per_s` seconds in, from
/// [`SUSTAIN_SENDERS`] senders on kept connections: each takes the next push, waits
/// until it is due, sends it (again after a 503's Retry-After or a failed connection)
/// and takes the next. A push is timed from when it was due, not from when a sender got
/// to it, so one that waited for a free sender counts the wait (no coordinated
/// omission). Also how many pushes were sent over [`LATE`] after they were due, and
/// the longest such wait.
///
/// Not [`paced_latency`]'s task per push: at thousands a second, with every push on a
/// connection of its own when the instance slows, the client's connection pool spent
/// this process's core on its waiters and the listener refused connections over its
/// per-peer cap (seen in the first runs of this section).
async fn sustained_run(
    args: &Args,
    inlet: &Instance,
    target: &Target,
    total: usize,
    per_s: f64,
) -> (Paced, u64, Duration, std::time::SystemTime) {
    warm_up(inlet).await;
    wait_delivered(target, 1).await;
    target.reset();
    target.record(true);
    let http = reqwest::Client::builder().pool_max_idle_per_host(SUSTAIN_SENDERS).build().expect("http client");
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let [late, worst_us, shed, refused] = [(); 4].map(|_| Arc::new(AtomicU64::new(0)));
    let (start, began) = (Instant::now(), std::time::SystemTime::now());
    let due = move |i: usize| start + Duration::from_secs_f64(i as f64 / per_s);
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..SUSTAIN_SENDERS {
        let (http, url, keys) = (http.clone(), inlet.push_url(), args.keys);
        let next = Arc::clone(&next);
        let [late, worst_us, shed, refused] = [&late, &worst_us, &shed, &refused].map(Arc::clone);
        set.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return;
                }
                let at = due(i);
                tokio::time::sleep_until(at.into()).await;
                let lag = at.elapsed();
                if lag > LATE {
                    late.fetch_add(1, Ordering::Relaxed);
                }
                worst_us.fetch_max(lag.as_micros() as u64, Ordering::Relaxed);
                let body = push_body(i, keys, "");
                loop {
                    assert!(at.elapsed() < STALL_LIMIT, "sustained push {i} was not taken for {STALL_LIMIT:?}");
                    let answer = match http
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body.clone())
                        .send()
                        .await
                    {
                        Ok(answer) => answer,
                        Err(_) => {
                            refused.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            continue;
                        }
                    };
                    match answer.status().as_u16() {
                        200 => {
                            // Read to the end, so the connection goes back to the pool.
                            let _ = answer.bytes().await;
                            break;
                        }
                        503 => {
                            shed.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(retry_after(answer.headers())).await;
                        }
                        status => panic!("sustained push {i} was answered {status}"),
                    }
                }
            }
        });
    }
    join_all(set).await;
    let took = start.elapsed();
    eprintln!(
        "sustained: every push answered after {:.0} s ({:.0} msg/s; due over {:.0} s)",
        took.as_secs_f64(),
        rate(total, took),
        total as f64 / per_s
    );
    let sent: Vec<Option<Instant>> = (0..total).map(|i| Some(due(i))).collect();
    let warm_up = (PACED_WARM_UP.as_secs_f64() * per_s) as usize;
    let paced =
        delivered(args.keys, target, &sent, warm_up, shed.load(Ordering::Relaxed), refused.load(Ordering::Relaxed))
            .await;
    (paced, late.load(Ordering::Relaxed), Duration::from_micros(worst_us.load(Ordering::Relaxed)), began)
}

/// The resident set of process `pid` (`VmRSS`, KiB); 0 once it is gone.
fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// A `kB` field of `/proc/PID/status` (`field` with its colon); 0 once the process is gone.
fn status_kib(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Push → delivered as fast as it goes: `bodies` pushed from `--clients` clients into
/// a fresh instance on a fresh database, from the first push to the last delivery
/// (msg/s).
async fn closed_loop(
    args: &Args,
    plugin: &Path,
    target: &Target,
    bodies: &Arc<Vec<(usize, String)>>,
    name: &str,
) -> f64 {
    let load = Load { keys: args.keys, clients: args.clients, sizing: args.sizing() };
    closed_loop_at(load, plugin, target, bodies, name).await.per_s
}

/// What a closed loop measured: its rate, the instance's `/metrics` at the end, and
/// the CPU per message by part from the first push to the last delivery.
struct ClosedLoop {
    per_s: f64,
    metrics: String,
    cpu: CpuPer,
}

/// How a closed loop pushes and how its instance is sized.
#[derive(Clone, Copy)]
struct Load {
    /// The keys the bodies spread over (each client owns whole keys).
    keys: usize,
    clients: usize,
    sizing: Sizing,
}

/// [`closed_loop`] at a load of its own; with the instance's metrics as it ended.
async fn closed_loop_at(
    load: Load,
    plugin: &Path,
    target: &Target,
    bodies: &Arc<Vec<(usize, String)>>,
    name: &str,
) -> ClosedLoop {
    let n = bodies.len();
    let pg = TestPg::new().await;
    let store = inlet::inbox::open(&pg.url, 2).await.expect("open the store");
    let inlet = Instance::start(&pg.url, plugin, target, load.sizing, name).await;
    warm_up(&inlet).await;
    wait_delivered(target, 1).await;
    target.reset();
    let (meter, log) = (CpuMeter::start(), WalMeter::start(&pg.url).await);
    let start = Instant::now();
    push_all(&inlet.push_url(), bodies, load.keys, load.clients, "inserted").await;
    wait_delivered(target, n as u64).await;
    let per_s = rate(n, start.elapsed());
    let cpu = CpuPer::of(&meter.stop(CpuPer::part(&[inlet.process.pid()], None)), n).with_wal(log.stop(n).await);
    let metrics = async { reqwest::get(format!("{}/metrics", inlet.base())).await?.text().await };
    let metrics = metrics.await.unwrap_or_else(|e| panic!("read the instance's metrics: {e}"));
    inlet.stop();
    drop(store);
    drop(pg);
    ClosedLoop { per_s, metrics, cpu }
}

/// Where a delivery slot's time went in a run, from the instance's metrics: the mean
/// claim, the mean exchange with the target, and each group commit's writes per batch
/// and time per batch.
fn slot_phases(metrics: &str) -> String {
    let total = |name: &str, label: &str| samples_total(metrics, name, label);
    let mean_ms = |name: &str, label: &str| {
        let count = total(&format!("{name}_count"), label);
        if count > 0.0 { total(&format!("{name}_sum"), label) * 1e3 / count } else { 0.0 }
    };
    let group = |g: &str| {
        let label = format!("group=\"{g}\"");
        let batches = total("inlet_group_commit_batch_size_count", &label).max(1.0);
        format!(
            "{g} {:.1} per batch, {:.2} ms per batch, {:.0} % lingered out",
            total("inlet_group_commit_batch_size_sum", &label) / batches,
            mean_ms("inlet_group_commit_seconds", &label),
            total("inlet_group_commit_lingered_out_total", &label) * 100.0 / batches
        )
    };
    format!(
        "{:.0} claims, {:.2} ms each; target {:.2} ms; {} handed on; {}; {}",
        total("inlet_claim_duration_seconds_count", ""),
        mean_ms("inlet_claim_duration_seconds", ""),
        mean_ms("inlet_delivery_duration_seconds", ""),
        total("inlet_claims_handed_on_total", ""),
        group("settles"),
        group("inserts")
    )
}

/// What an open-loop run measured.
struct Paced {
    p50: Duration,
    p99: Duration,
    shed: u64,
    /// Sends that failed below HTTP (a connection refused or cut), each sent again.
    refused: u64,
    /// Every counted push's latency, sorted (the shadow section pools them across runs).
    latencies: Vec<Duration>,
    /// Every counted push's latency by its number, in the order they were sent (push
    /// `i` was due `i / per_s` seconds into the run).
    by_push: Vec<(usize, Duration)>,
}

/// Sends `bodies` to `inlet` at `per_s`, each at its time whatever the answers before
/// it, and times each from its first send to the target's first delivery of it. The
/// first [`PACED_WARM_UP`] of the schedule is sent and delivered but not counted: a
/// fresh instance on a fresh database pays for its first plans and pages there.
async fn paced_latency(
    args: &Args,
    inlet: &Instance,
    target: &Target,
    total: usize,
    prefix: &str,
    per_s: f64,
) -> Paced {
    warm_up(inlet).await;
    wait_delivered(target, 1).await;
    target.reset();
    target.record(true);
    let http = reqwest::Client::builder().pool_max_idle_per_host(args.clients).build().expect("http client");
    let sent: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; total]));
    let shed = Arc::new(AtomicU64::new(0));
    // Sends that failed below HTTP, and the first one's error.
    let refused: Arc<Mutex<(u64, Option<String>)>> = Arc::default();
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..total {
        // Made as it is sent: a long run's bodies would not all fit in memory at once
        // beside the instance measured.
        let body = push_body(i, args.keys, prefix);
        let at = start + Duration::from_secs_f64(i as f64 / per_s);
        let (http, url, sent, shed) = (http.clone(), inlet.push_url(), Arc::clone(&sent), Arc::clone(&shed));
        let refused = Arc::clone(&refused);
        tokio::time::sleep_until(at.into()).await;
        set.spawn(async move {
            // The latency runs from the first send: a push shed with 503 is sent again
            // after the server's Retry-After, as a well-behaved sender would, and the
            // wait is part of its latency. So is one whose connection the listener
            // refused (over `max_connections_per_peer`: every push here comes from one
            // address), sent again after a second.
            let first = Instant::now();
            sent.lock().unwrap()[i] = Some(first);
            loop {
                assert!(first.elapsed() < STALL_LIMIT, "paced push {i} was shed for {STALL_LIMIT:?}");
                let answer = http.post(&url).header("content-type", "application/json").body(body.clone()).send().await;
                let answer = match answer {
                    Ok(answer) => answer,
                    Err(e) => {
                        {
                            let mut refused = refused.lock().unwrap();
                            refused.0 += 1;
                            refused.1.get_or_insert_with(|| format!("{e:?}"));
                        }
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                };
                match answer.status().as_u16() {
                    200 => break,
                    503 => {
                        shed.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(retry_after(answer.headers())).await;
                    }
                    status => panic!("paced push {i} was answered {status}"),
                }
            }
        });
    }
    join_all(set).await;
    let shed = shed.load(Ordering::Relaxed);
    let (refused, first_refusal) = refused.lock().unwrap().clone();
    if let Some(error) = &first_refusal {
        eprintln!("paced run: {refused} sends failed below HTTP and were sent again; the first: {error}");
    }
    let sent = sent.lock().unwrap().clone();
    let warm_up = (PACED_WARM_UP.as_secs_f64() * per_s) as usize;
    delivered(args.keys, target, &sent, warm_up, shed, refused).await
}

/// Waits for a delivery of every push `sent` holds (push `i` timed from `sent[i]`),
/// then times each from then to the target's first delivery of it; the first
/// `warm_up` are not counted.
async fn delivered(
    keys: usize,
    target: &Target,
    sent: &[Option<Instant>],
    warm_up: usize,
    shed: u64,
    refused: u64,
) -> Paced {
    let total = sent.len();
    wait_until("a delivery of every paced push", STALL_LIMIT, || async {
        // Counted first: sorting millions of records at every poll would take the
        // cores the instance is still using.
        if target.count() < total as u64 {
            return false;
        }
        let mut seen: Vec<(usize, u64)> = target.recorded().iter().map(|(k, s, _)| (*k, *s)).collect();
        seen.sort_unstable();
        seen.dedup();
        seen.len() >= total
    })
    .await;
    target.record(false);
    // The first delivery of each push (a redelivery after a lost answer counts once).
    let mut first: std::collections::HashMap<usize, Instant> = std::collections::HashMap::new();
    for (key, seq, at) in target.recorded() {
        first.entry(key + (seq as usize - 1) * keys).or_insert(at);
    }
    let matched = first.keys().filter(|i| sent.get(**i).copied().flatten().is_some()).count();
    assert_eq!(matched, total, "deliveries matched to {matched} of {total} paced pushes");
    let mut by_push: Vec<(usize, Duration)> = first
        .iter()
        .filter(|(i, _)| **i >= warm_up.min(total / 2))
        .filter_map(|(i, at)| sent.get(*i).copied().flatten().map(|s| (*i, at.saturating_duration_since(s))))
        .collect();
    by_push.sort_unstable();
    let mut latencies: Vec<Duration> = by_push.iter().map(|(_, l)| *l).collect();
    latencies.sort();
    Paced { p50: quantile(&latencies, 0.5), p99: quantile(&latencies, 0.99), shed, refused, latencies, by_push }
}

/// The `q` quantile of sorted `latencies` (the nearest rank).
fn quantile(latencies: &[Duration], q: f64) -> Duration {
    latencies[((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1]
}

/// The start of a paced run that is not counted.
const PACED_WARM_UP: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------------------
// Shadow
// ---------------------------------------------------------------------------------------

/// The candidates the shadow section runs beside the serving plugin: the work order
/// id prefix that makes `work-order-next` misbehave, and what it does.
const CANDIDATES: [(&str, &str); 3] =
    [("sleep-", "sleeps an hour per call"), ("trap-", "traps at every call"), ("hoard-", "keeps 8 MiB more per call")];

async fn shadow_section(args: &Args, plugin: &Path, target: &Target, report: &mut Report) {
    let candidate = plugin.with_file_name("work_order_next.wasm");
    assert!(candidate.is_file(), "{} is missing; run scripts/build-plugins first", candidate.display());
    let per_s = args.shadow_rate;
    let total = (per_s * args.latency_window.as_secs_f64()) as usize;
    let chosen = |prefix: &str| {
        args.shadow_candidates.as_ref().is_none_or(|w| w.iter().any(|n| prefix.trim_end_matches('-') == n))
    };
    // Per candidate, one pair of runs per round: (without, with), each run's figures
    // and the page faults the process took per message.
    let mut pairs: Vec<Vec<[ShadowRun; 2]>> = CANDIDATES.iter().map(|_| Vec::new()).collect();
    // A warm-up pair, not counted: the first runs of a bench are the slowest (a cold
    // page cache, a database that has not yet grown its files), and one slow run
    // would weigh on whichever candidate came first.
    if let Some((prefix, _)) = CANDIDATES.iter().find(|(p, _)| chosen(p)) {
        for shadowed in [false, true] {
            let run = shadow_run(args, plugin, &candidate, shadowed, target, total, prefix, per_s).await;
            eprintln!("shadow warm-up (not counted): {prefix}* p99 {:.1} ms", ms(run.paced.p99));
        }
    }
    for round in 1..=args.rounds {
        for (c, (prefix, _)) in CANDIDATES.iter().enumerate() {
            if !chosen(prefix) {
                continue;
            }
            // Without a candidate and with it, back to back, each on a fresh database;
            // which goes first alternates between rounds, so a drift of the machine
            // during a round weighs on both sides alike. The bodies carry the
            // candidate's prefix in every run (the serving plugin treats every id
            // alike).
            let order = if round % 2 == 1 { [false, true] } else { [true, false] };
            let mut pair: [Option<ShadowRun>; 2] = [None, None];
            for shadowed in order {
                let run = shadow_run(args, plugin, &candidate, shadowed, target, total, prefix, per_s).await;
                eprintln!(
                    "shadow round {round}: {prefix}* {} p99 {:.1} ms, {:.1} page faults per message",
                    if shadowed { "with the candidate" } else { "without" },
                    ms(run.paced.p99),
                    run.faults
                );
                pair[usize::from(shadowed)] = Some(run);
            }
            let [Some(without), Some(with)] = pair else { unreachable!("both runs of a pair ran") };
            pairs[c].push([without, with]);
        }
    }
    let all_without: Vec<&ShadowRun> = pairs.iter().flatten().map(|[w, _]| w).collect();
    if all_without.is_empty() {
        return;
    }
    let (p50, p99) = pooled(&all_without);
    report.row(
        "shadow pg",
        &format!("push -> delivery at {per_s:.0} msg/s, no candidate, p50 / p99 (all runs pooled)"),
        format!("{:.1} ms / {:.1} ms", ms(p50), ms(p99)),
        format!(
            "{total} pushes per run, {} runs, per-run p99 {}; {:.1} page faults per message",
            all_without.len(),
            spread(all_without.iter().map(|r| r.paced.p99)),
            median(all_without.iter().map(|r| r.faults).collect())
        ),
        None,
        None,
    );
    // The noise floor: the runs without a candidate taken two by two in the order
    // they ran (candidate by candidate, round by round), each pair compared as a
    // candidate's pairs are.
    let aa: Vec<[&ShadowRun; 2]> = all_without.chunks_exact(2).map(|p| [p[0], p[1]]).collect();
    if !aa.is_empty() {
        let ratios: Vec<f64> = aa.iter().map(|[a, b]| pair_ratio(a, b)).collect();
        let estimate = estimate(&aa);
        report.row(
            "shadow pg",
            "A/A: no candidate on either side (runs without, two by two), p99 ratio",
            format!("{} pairs", aa.len()),
            format!(
                "ratio per pair {}; {}; what the machine alone moves a p99 by: read the ratios below against it",
                spread(ratios.into_iter()),
                interval_text(bootstrap_interval(&aa))
            ),
            Some(estimate),
            None,
        );
    }
    for (c, (_, what)) in CANDIDATES.iter().enumerate() {
        let runs = &pairs[c];
        if runs.is_empty() {
            continue;
        }
        let side = |s: usize| runs.iter().map(|p| &p[s]).collect::<Vec<_>>();
        let (without, with) = (side(0), side(1));
        let paired: Vec<[&ShadowRun; 2]> = runs.iter().map(|[w, s]| [w, s]).collect();
        let ratio = estimate(&paired);
        let (p50, p99) = pooled(&with);
        report.row(
            "shadow pg",
            &format!(
                "the same with a candidate that {what}{}{}, p50 / p99 (pooled)",
                args.shadow_cpu_percent.map_or(String::new(), |p| format!(" (shadow_cpu_percent {p})")),
                args.shadow_churn_mib_per_s.map_or(String::new(), |m| format!(" (shadow_memory_churn_mib_per_s {m})"))
            ),
            format!("{:.1} ms / {:.1} ms", ms(p50), ms(p99)),
            format!(
                "its paired runs without: p99 {:.1} ms (pooled ratio {:.2}×); ratio per pair {}; {}; {:.1} page faults per message",
                ms(pooled(&without).1),
                pooled(&with).1.as_secs_f64() / pooled(&without).1.as_secs_f64(),
                spread(paired.iter().map(|[w, s]| pair_ratio(w, s))),
                interval_text(bootstrap_interval(&paired)),
                median(with.iter().map(|r| r.faults).collect())
            ),
            Some(ratio),
            Some(Goal { text: "p99 within 10 %".into(), met: ratio <= 1.10 }),
        );
    }
}

/// One run of the shadow section.
struct ShadowRun {
    paced: Paced,
    /// Page faults the inlet process took per message.
    faults: f64,
}

/// A run of `total` paced pushes on a fresh database and a fresh instance, with the
/// candidate in shadow if `shadowed`; a run with a candidate must show it misbehaved
/// (a fault or work dropped), or the run proves nothing.
#[allow(clippy::too_many_arguments)]
async fn shadow_run(
    args: &Args,
    plugin: &Path,
    candidate: &Path,
    shadowed: bool,
    target: &Target,
    total: usize,
    prefix: &str,
    per_s: f64,
) -> ShadowRun {
    let pg = TestPg::new().await;
    let shadow = shadowed.then_some(Shadow {
        candidate,
        cpu_percent: args.shadow_cpu_percent,
        churn_mib_per_s: args.shadow_churn_mib_per_s,
    });
    let inlet = Instance::start_with(&pg.url, plugin, shadow, target, args.sizing(), "shadow").await;
    let faults_before = inlet.page_faults();
    let paced = paced_latency(args, &inlet, target, total, prefix, per_s).await;
    let faults = (inlet.page_faults() - faults_before) as f64 / total as f64;
    if shadowed {
        let metrics = reqwest::get(format!("{}/metrics", inlet.base()))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text");
        let misbehaved: f64 = metrics
            .lines()
            .filter(|l| l.starts_with("inlet_shadow_faults_total{") || l.starts_with("inlet_shadow_dropped_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert!(misbehaved > 0.0, "the {prefix} candidate neither faulted nor fell behind:\n{metrics}");
    }
    inlet.stop();
    drop(pg);
    ShadowRun { paced, faults }
}

/// The p50 and p99 of every latency of `runs` taken together: one estimate from all
/// their samples, where the median of per-run p99s would rest on each run's ~60
/// slowest.
fn pooled(runs: &[&ShadowRun]) -> (Duration, Duration) {
    let mut all: Vec<Duration> = runs.iter().flat_map(|r| r.paced.latencies.iter().copied()).collect();
    all.sort_unstable();
    (quantile(&all, 0.5), quantile(&all, 0.99))
}

/// The second run's p99 over the first's.
fn pair_ratio(first: &ShadowRun, second: &ShadowRun) -> f64 {
    second.paced.p99.as_secs_f64() / first.paced.p99.as_secs_f64()
}

/// What a row's ratio (and its goal) rests on: the median of the pairs' own ratios
/// from three pairs up, else the ratio of the pooled p99s. A pair's runs ran back to
/// back, so its ratio cancels what the machine did across the bench (the disk's
/// slow hours); the median leaves out the one pair a stall of the machine lands in,
/// which decides a pooled p99 on its own (seen: one pair at 30× beside three under
/// 1.4×). The pooled ratio is printed beside it.
fn estimate(pairs: &[[&ShadowRun; 2]]) -> f64 {
    if pairs.len() >= 3 {
        median(pairs.iter().map(|[a, b]| pair_ratio(a, b)).collect())
    } else {
        let side = |s: usize| pairs.iter().map(|p| p[s]).collect::<Vec<_>>();
        pooled(&side(1)).1.as_secs_f64() / pooled(&side(0)).1.as_secs_f64()
    }
}

/// A 90 % interval of [`estimate`] by resampling whole pairs (a pair's samples share
/// a machine state, so they are not resampled one by one): `None` for one pair.
fn bootstrap_interval(pairs: &[[&ShadowRun; 2]]) -> Option<(f64, f64)> {
    use rand::{Rng, SeedableRng};
    if pairs.len() < 2 {
        return None;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(24);
    let mut ratios: Vec<f64> = (0..1_000)
        .map(|_| {
            let pick: Vec<[&ShadowRun; 2]> = (0..pairs.len()).map(|_| pairs[rng.gen_range(0..pairs.len())]).collect();
            estimate(&pick)
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    Some((ratios[ratios.len() / 20], ratios[ratios.len() * 19 / 20]))
}

fn interval_text(interval: Option<(f64, f64)>) -> String {
    interval.map_or("one pair: no interval".into(), |(lo, hi)| format!("90 % interval over pairs {lo:.2}×–{hi:.2}×"))
}

/// "lowest–highest" of per-run figures: durations in ms, plain numbers as ratios.
fn spread<T: Spread>(values: impl Iterator<Item = T>) -> String {
    let mut v: Vec<T> = values.collect();
    v.sort_by(|a, b| a.value().total_cmp(&b.value()));
    match (v.first(), v.last()) {
        (Some(lo), Some(hi)) => format!("{}–{}", lo.show(), hi.show()),
        _ => String::new(),
    }
}

trait Spread {
    fn value(&self) -> f64;
    fn show(&self) -> String;
}

impl Spread for Duration {
    fn value(&self) -> f64 {
        self.as_secs_f64()
    }
    fn show(&self) -> String {
        format!("{:.1} ms", ms(*self))
    }
}

impl Spread for f64 {
    fn value(&self) -> f64 {
        *self
    }
    fn show(&self) -> String {
        format!("{self:.2}×")
    }
}

/// [`push_bodies`] with the work order ids prefixed (`sleep-key-3`).
/// Message `i` of key `{prefix}key-{i % keys}` as a push envelope; its seq is
/// `i / keys + 1`.
fn push_body(i: usize, keys: usize, prefix: &str) -> String {
    let data = format!(
        r#"{{"workOrderId":"{prefix}key-{}","completedItems":{},"completionTimestamp":"2026-08-01T10:00:00Z"}}"#,
        i % keys,
        i / keys + 1
    );
    push_envelope(data.as_bytes(), &[], &format!("bench-{i}")).to_string()
}

/// The wait a shed push's `Retry-After` asks for (seconds), 1 s if it has none.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Duration {
    let secs = headers.get(reqwest::header::RETRY_AFTER).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    Duration::from_secs(secs.unwrap_or(1))
}

async fn wait_delivered(target: &Target, n: u64) {
    let what = format!("{n} deliveries at the target");
    wait_until(&what, STALL_LIMIT, || async move { target.count() >= n }).await;
}

// ---------------------------------------------------------------------------------------
// Backlog size and instances
// ---------------------------------------------------------------------------------------

async fn backlog_section(args: &Args, plugin: &Path, target: &Target, report: &mut Report) {
    let largest = *args.backlogs.iter().max().expect("a backlog");
    let mut smallest_rate = None;
    for &backlog in &args.backlogs {
        let window = (backlog == largest).then_some(args.long_window);
        let d = relay_drain_for(args, plugin, target, backlog, 1, window).await;
        eprintln!(
            "backlog {backlog}: {:.0} deliveries/s, claim {:?} ms, handed on {:?}, {}, peak RSS {:?} MiB, CPU per delivery (postgres / inlet / bench / other) {}",
            d.rate,
            d.claim_ms,
            d.handed_on,
            d.settles.as_ref().map_or("no settle batches".to_string(), SettleBatches::describe),
            d.peak_rss_mib,
            d.cpu.describe()
        );
        let base = *smallest_rate.get_or_insert(d.rate);
        let mut claim = d.claim_ms.map_or("n/a".to_string(), |c| format!("{c:.2} ms per claim"));
        if let Some(share) = d.handed_on.filter(|s| *s > 0.0) {
            claim.push_str(&format!(", {:.0} % handed on by settles", share * 100.0));
        }
        report.row(
            "backlog pg",
            &format!(
                "1 instance, {backlog} backlog{}{}",
                window.map_or(String::new(), |w| format!(" ({} s)", w.as_secs())),
                away(args)
            ),
            per_s(d.rate, "deliveries"),
            claim,
            ratio(d.rate, base),
            (backlog == largest && backlog != args.backlogs[0]).then(|| Goal::at_least(0.9, d.rate / base)),
        );
        if backlog == largest {
            if let (Some(first), Some(later)) = (d.first_5s, d.after_60s) {
                report.row(
                    "backlog pg",
                    &format!("{backlog} backlog: 60-65 s beside the first 5 s"),
                    per_s(later, "deliveries"),
                    format!("first 5 s {}", per_s(first, "deliveries")),
                    ratio(later, first),
                    Some(Goal::at_least(0.7, later / first)),
                );
            }
            if let Some(rss) = d.peak_rss_mib {
                report.row(
                    "backlog pg",
                    &format!("peak RSS, {backlog} backlog (VmHWM)"),
                    format!("{rss:.0} MiB"),
                    String::new(),
                    None,
                    Some(Goal { text: "< 300 MB".into(), met: rss * 1.048_576 < 300.0 }),
                );
            }
        }
    }
}

/// How far the database is, where `--pg-delay-us` puts it away from Inlet.
fn away(args: &Args) -> String {
    args.pg_delay.map_or(String::new(), |d| format!(", PostgreSQL {} µs away each way", d.as_micros()))
}

async fn instances_section(args: &Args, plugin: &Path, target: &Target, report: &mut Report) {
    let mut one = None;
    for &k in &args.instances {
        let d = relay_drain(args, plugin, target, args.instances_backlog, k).await;
        eprintln!(
            "instances {k}: {:.0} deliveries/s, handed on {:?}, {}, CPU per delivery (postgres / inlets / bench / other) {}",
            d.rate,
            d.handed_on,
            d.settles.as_ref().map_or("no settle batches".to_string(), SettleBatches::describe),
            d.cpu.describe()
        );
        let base = *one.get_or_insert(d.rate);
        // What a delivery cost each part: whether instances add work per delivery
        // (contention) or share a machine that was already full.
        report.row(
            "instances pg",
            &format!("{k} instance(s), {} backlog{}", args.instances_backlog, away(args)),
            per_s(d.rate, "deliveries"),
            format!("CPU per delivery, postgres / inlets / HTTP target / other: {}", d.cpu.describe()),
            ratio(d.rate, base),
            None,
        );
    }
}

// ---------------------------------------------------------------------------------------
// Inlet processes
// ---------------------------------------------------------------------------------------

/// A candidate in shadow and the pacing it runs under (`None`: the default).
struct Shadow<'a> {
    candidate: &'a Path,
    cpu_percent: Option<usize>,
    churn_mib_per_s: Option<usize>,
}

/// How an Inlet under test is sized: its route's concurrency and its store's pool.
#[derive(Clone, Copy)]
struct Sizing {
    concurrency: usize,
    pool: u32,
}

struct Instance {
    process: InletProcess,
    _dir: tempfile::TempDir,
}

impl Instance {
    /// `inlet run` on `url` with one push route into the target, healthy.
    async fn start(url: &str, plugin: &Path, target: &Target, sizing: Sizing, name: &str) -> Instance {
        Instance::start_with(url, plugin, None, target, sizing, name).await
    }

    /// [`Instance::start`], with a candidate plugin in shadow if one is given (and the
    /// shadow's pacing, if given).
    async fn start_with(
        url: &str,
        plugin: &Path,
        shadow: Option<Shadow<'_>>,
        target: &Target,
        Sizing { concurrency, pool }: Sizing,
        name: &str,
    ) -> Instance {
        let mut plugins = String::new();
        if let Some(percent) = shadow.as_ref().and_then(|s| s.cpu_percent) {
            plugins.push_str(&format!("shadow_cpu_percent = {percent}\n"));
        }
        if let Some(mib) = shadow.as_ref().and_then(|s| s.churn_mib_per_s) {
            plugins.push_str(&format!("shadow_memory_churn_mib_per_s = {mib}\n"));
        }
        if !plugins.is_empty() {
            plugins = format!("[plugins]\n{plugins}\n");
        }
        let candidate = shadow.map(|s| format!("candidate = \"{}\"\n", s.candidate.display())).unwrap_or_default();
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let config = dir.path().join("inlet.toml");
        std::fs::write(
            &config,
            format!(
                "[store]\nurl = \"{url}\"\nmax_connections = {pool}\n\n[server]\nlisten = \"127.0.0.1:{port}\"\n\n\
                 [admin]\nauth = \"none-loopback\"\n\n{plugins}\
                 [[route]]\nname = \"{ROUTE}\"\nplugin = \"{}\"\n{candidate}source = {{ kind = \"push\" }}\n\
                 target = {{ kind = \"http\", url = \"{}\", timeout = \"10s\" }}\nordering = \"per-key\"\nconcurrency = {concurrency}\n",
                plugin.display(),
                target.url
            ),
        )
        .expect("write the routing file");
        let instance = format!("{name}-{port}");
        let mut process = InletProcess::spawn(&config, &[("RUST_LOG", "warn"), ("INLET_INSTANCE", instance.as_str())]);
        process.wait_healthy(Duration::from_secs(120)).await;
        Instance { process, _dir: dir }
    }

    fn base(&self) -> String {
        self.process.base.clone()
    }

    fn push_url(&self) -> String {
        format!("{}/push/{ROUTE}", self.process.base)
    }

    /// Page faults the process has taken so far, minor and major (`/proc/PID/stat`
    /// fields 10 and 12): how often its threads entered the kernel for memory.
    fn page_faults(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.process.pid())).unwrap_or_default();
        // Fields after the command name, which is in parentheses and may hold spaces.
        let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<u64> = rest.split_whitespace().map(|f| f.parse().unwrap_or(0)).collect();
        // `rest` starts at field 3 (state), so field N is at index N - 3.
        fields.get(7).copied().unwrap_or(0) + fields.get(9).copied().unwrap_or(0)
    }

    fn hwm_kib(&self) -> u64 {
        status_kib(self.process.pid(), "VmHWM:")
    }

    fn stop(mut self) {
        let status = self.process.sigterm_and_wait(Duration::from_secs(60));
        assert!(status.success(), "inlet exited with {status}\n{}", self.process.log());
    }
}

/// The sum and count of a histogram over the instances' `/metrics`.
async fn sum_metric(instances: &[Instance], name: &str) -> Option<(f64, f64)> {
    let [sum, count] = series_totals(instances, [format!("{name}_sum"), format!("{name}_count")]).await?;
    Some((sum, count))
}

/// The sum of every sample of `name` in a `/metrics` text whose line contains `label`
/// ("" for all).
fn samples_total(metrics: &str, name: &str, label: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.split(['{', ' ']).next() == Some(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Each series' value summed over its labels and over `instances`.
async fn series_totals<const N: usize>(instances: &[Instance], series: [String; N]) -> Option<[f64; N]> {
    let http = reqwest::Client::new();
    let mut totals = [0.0; N];
    for i in instances {
        let text = http.get(format!("{}/metrics", i.base())).send().await.ok()?.text().await.ok()?;
        for (total, name) in totals.iter_mut().zip(&series) {
            *total += samples_total(&text, name, "");
        }
    }
    Some(totals)
}

async fn pause(store: &Arc<dyn Store>) {
    let pause = Pause { route: ROUTE.into(), paused_at: 0, paused_by: "bench".into(), reason: "preloading".into() };
    store.pause_route(&pause).await.expect("pause the route");
}

async fn count_entries(store: &Arc<dyn Store>) -> u64 {
    let filter = inlet::inbox::ListFilter { route: Some(ROUTE.into()), ..Default::default() };
    store.count(&filter).await.expect("count entries")
}

async fn done_count(store: &Arc<dyn Store>) -> u64 {
    let filter = inlet::inbox::ListFilter {
        route: Some(ROUTE.into()),
        status: Some(inlet::inbox::Status::Done),
        ..Default::default()
    };
    store.count(&filter).await.expect("count DONE")
}

// ---------------------------------------------------------------------------------------
// The target
// ---------------------------------------------------------------------------------------

/// A keep-alive HTTP server answering 204 to `POST /engine-rest/message`: counts, notes
/// the first and last arrival, and, while recording, each delivery's key and seq.
struct Target {
    url: String,
    state: Arc<TargetState>,
    server: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct TargetState {
    count: AtomicU64,
    times: Mutex<(Option<Instant>, Option<Instant>)>,
    recording: AtomicBool,
    recorded: Mutex<Vec<(usize, u64, Instant)>>,
}

impl Target {
    async fn start() -> Target {
        let state = Arc::new(TargetState::default());
        let app = axum::Router::new()
            .route("/engine-rest/message", axum::routing::post(deliver))
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the target");
        let url = format!("http://{}", listener.local_addr().expect("target address"));
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("target server");
        });
        Target { url, state, server }
    }

    fn reset(&self) {
        self.state.count.store(0, Ordering::SeqCst);
        *self.state.times.lock().unwrap() = (None, None);
        self.state.recorded.lock().unwrap().clear();
    }

    fn count(&self) -> u64 {
        self.state.count.load(Ordering::SeqCst)
    }

    fn first(&self) -> Option<Instant> {
        self.state.times.lock().unwrap().0
    }

    fn last(&self) -> Option<Instant> {
        self.state.times.lock().unwrap().1
    }

    fn record(&self, on: bool) {
        self.state.recording.store(on, Ordering::SeqCst);
    }

    fn recorded(&self) -> Vec<(usize, u64, Instant)> {
        self.state.recorded.lock().unwrap().clone()
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn deliver(
    axum::extract::State(state): axum::extract::State<Arc<TargetState>>,
    body: axum::body::Bytes,
) -> axum::http::StatusCode {
    let now = Instant::now();
    if state.recording.load(Ordering::SeqCst) {
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        // `key-N`, or with a candidate's prefix (`sleep-key-N`).
        let key =
            v["correlationKeys"]["workOrderId"]["value"].as_str().and_then(|k| k.rsplit_once("key-")).map(|(_, n)| n);
        let seq = v["processVariables"]["completedItems"]["value"].as_u64();
        if let (Some(key), Some(seq)) = (key.and_then(|k| k.parse().ok()), seq) {
            state.recorded.lock().unwrap().push((key, seq, now));
        }
    }
    {
        let mut times = state.times.lock().unwrap();
        times.0.get_or_insert(now);
        times.1 = Some(now);
    }
    state.count.fetch_add(1, Ordering::SeqCst);
    axum::http::StatusCode::NO_CONTENT
}

// ---------------------------------------------------------------------------------------
// The peer: graphile-worker
// ---------------------------------------------------------------------------------------

struct Peer {
    node: PathBuf,
    modules: PathBuf,
    script: PathBuf,
}

/// One run of the peer.
struct PeerRun {
    jobs_per_s: f64,
    version: String,
    /// CPU per job by part, over the runner's timed phase.
    cpu: CpuPer,
}

impl Peer {
    /// Installs graphile-worker from npm (once; cached under the build directory).
    fn install() -> Peer {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        let out = std::process::Command::new(repo.join("scripts/ensure-graphile"))
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("run scripts/ensure-graphile");
        assert!(out.status.success(), "scripts/ensure-graphile failed ({})", out.status);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let last = stdout.lines().last().expect("ensure-graphile printed nothing");
        let (node, modules) = last.split_once('\t').unwrap_or_else(|| panic!("ensure-graphile's last line: `{last}`"));
        Peer { node: node.into(), modules: modules.into(), script: repo.join("benches/peer/graphile.mjs") }
    }

    /// One run on a fresh database: its jobs per second, and the CPU spent while the
    /// runner timed them (between its `{"phase":"timed"}` and `{"phase":"untimed"}`
    /// lines).
    async fn run(&self, jobs: usize, queues: usize, concurrency: usize) -> PeerRun {
        use tokio::io::AsyncBufReadExt as _;
        let pg = TestPg::new().await;
        let mut child = tokio::process::Command::new(&self.node)
            .arg(&self.script)
            .args(["--db", &pg.url, "--jobs", &jobs.to_string(), "--keys", &queues.to_string()])
            // Batched fetch and completion (its fastest settings), and jobs of a queue in
            // the order they were added (`--fifo`), as Inlet keeps a key's order.
            .args(["--concurrency", &concurrency.to_string(), "--batch", "--fifo"])
            .env("INLET_PEER_MODULES", &self.modules)
            .current_dir(self.modules.parent().unwrap_or(&self.modules))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("run the graphile-worker runner");
        let node = child.id();
        let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("piped")).lines();
        let (mut meter, mut spent, mut stdout) = (None, None, Vec::new());
        while let Some(line) = lines.next_line().await.expect("read the runner's output") {
            match line.as_str() {
                r#"{"phase":"timed"}"# => meter = Some((CpuMeter::start(), WalMeter::start(&pg.url).await)),
                r#"{"phase":"untimed"}"# => {
                    if let Some((cpu, log)) = meter.take() {
                        spent = Some((cpu.stop(CpuPer::part(&[], node)), log.stop(jobs).await));
                    }
                }
                _ => stdout.push(line),
            }
        }
        let status = child.wait().await.expect("wait for the graphile-worker runner");
        let stdout = stdout.join("\n");
        assert!(status.success(), "graphile-worker runner failed ({status}): {stdout}");
        let (spent, wal) = spent.expect("the runner printed no {\"phase\":\"untimed\"} line");
        let line = stdout.lines().last().unwrap_or_default();
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("runner printed `{line}`: {e}"));
        assert_eq!(v["jobs"].as_u64(), Some(jobs as u64), "runner: {line}");
        drop(pg);
        PeerRun {
            jobs_per_s: v["jobs_per_s"].as_f64().unwrap_or_else(|| panic!("runner: no jobs_per_s in {line}")),
            version: v["version"].as_str().unwrap_or("?").to_string(),
            cpu: CpuPer::of(&spent, jobs).with_wal(wal),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Figures and the table
// ---------------------------------------------------------------------------------------

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn per_s(v: f64, unit: &str) -> String {
    format!("{v:.0} {unit}/s")
}

async fn join_all(mut set: tokio::task::JoinSet<()>) {
    while let Some(r) = set.join_next().await {
        r.expect("task");
    }
}

fn ratio(a: f64, b: f64) -> Option<f64> {
    Some(a / b)
}

struct Goal {
    text: String,
    met: bool,
}

impl Goal {
    fn at_least(want: f64, got: f64) -> Goal {
        Goal { text: format!("≥ {want:.2}×"), met: got >= want }
    }

    fn at_most(want: f64, got: f64) -> Goal {
        Goal { text: format!("≤ {want:.2}×"), met: got <= want }
    }
}

struct Row {
    section: String,
    what: String,
    value: String,
    beside: String,
    ratio: Option<f64>,
    goal: Option<Goal>,
}

#[derive(Default)]
struct Report {
    pg_version: String,
    rows: Vec<Row>,
}

impl Report {
    fn row(
        &mut self,
        section: &str,
        what: &str,
        value: String,
        beside: String,
        ratio: Option<f64>,
        goal: Option<Goal>,
    ) {
        self.rows.push(Row { section: section.into(), what: what.into(), value, beside, ratio, goal });
    }

    fn render(&self) -> String {
        let header = ["section", "what", "inlet", "beside", "ratio", "goal"].map(String::from);
        let cells: Vec<[String; 6]> = std::iter::once(header)
            .chain(self.rows.iter().map(|r| {
                [
                    r.section.clone(),
                    r.what.clone(),
                    r.value.clone(),
                    r.beside.clone(),
                    r.ratio.map_or(String::new(), |x| format!("{x:.2}×")),
                    r.goal
                        .as_ref()
                        .map_or(String::new(), |g| format!("{} {}", g.text, if g.met { "met" } else { "NOT MET" })),
                ]
            }))
            .collect();
        let width = |i: usize| cells.iter().map(|c| c[i].chars().count()).max().unwrap_or(0);
        let widths: Vec<usize> = (0..6).map(width).collect();
        let mut out = String::new();
        for c in &cells {
            let line: Vec<String> =
                c.iter().zip(&widths).map(|(s, w)| format!("{s}{}", " ".repeat(w - s.chars().count()))).collect();
            out.push_str(line.join("  ").trim_end());
            out.push('\n');
        }
        out
    }
}
