//! Push-to-DONE throughput of a real Inlet, beside the raw insert rate of the same
//! database measured in the same run.
//!
//! ```text
//! cargo bench --bench push_to_done -- [--messages N] [--keys K] [--pushers P] [--store sqlite|postgres|both]
//! ```
//!
//! Defaults: N=5000 messages over K=100 keys from P=16 concurrent pushers, on both
//! stores. For each store it
//!
//! 1. opens the database (SQLite: a file in a temp dir with Inlet's pragmas — WAL,
//!    `synchronous=FULL`, busy timeout; PostgreSQL: a fresh database created through
//!    `INLET_TEST_PG_ADMIN_URL`, default `postgres://postgres@127.0.0.1:5432/postgres`,
//!    dropped at the end) and measures the raw insert rate of a row of about the size
//!    of an inbox row: one row per transaction from P tasks, and 100 rows per
//!    transaction for reference;
//! 2. starts Inlet in-process (the real `work_order` plugin, a push source and an HTTP
//!    target at an in-process fake that answers 204 and counts) and pushes N Pub/Sub
//!    push envelopes from P concurrent pushers, in order within each key;
//! 3. reports the ingest rate (N / time until every push was answered 200), the
//!    push→DONE rate (N / time from the first push until all N rows are DONE, polled
//!    every 20 ms) and the p50/p99 push latency.
//!
//! Benchmarks print figures; they never assert timings. A run that does not finish
//! (pushes refused, rows never DONE) fails loudly instead of printing a number.
//! Needs `scripts/build-plugins` (for `plugins/dist/work_order.wasm`) and, for the
//! PostgreSQL half, a reachable server (`scripts/ensure-postgres`).

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[path = "../tests/common/mod.rs"]
mod common;

use inlet::app;
use inlet::config::Config;
use inlet::inbox::Status;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{SqlitePool, SqlitePoolOptions};

/// Connections of the baseline's pool: Inlet's default `store.max_connections`.
const POOL_SIZE: u32 = 8;
/// The route's delivery concurrency.
const CONCURRENCY: u32 = 16;
/// Rows per transaction in the batched baseline.
const BATCH: usize = 100;
/// How often the DONE count is polled.
const POLL: Duration = Duration::from_millis(20);
/// Give up (loudly) if the rows are not all DONE by then.
const STALL_LIMIT: Duration = Duration::from_secs(300);
const ROUTE: &str = "bench";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

struct Args {
    messages: usize,
    keys: usize,
    pushers: usize,
    stores: Vec<Backend>,
}

fn usage() -> &'static str {
    "usage: cargo bench --bench push_to_done -- [--messages N] [--keys K] [--pushers P] [--store sqlite|postgres|both]"
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args { messages: 5000, keys: 100, pushers: 16, stores: vec![Backend::Sqlite, Backend::Postgres] };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (arg.clone(), None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            inline.clone().or_else(|| it.next()).ok_or_else(|| format!("{name} needs a value"))
        };
        let number = |name: &str, v: String| -> Result<usize, String> {
            v.parse::<usize>().ok().filter(|n| *n > 0).ok_or_else(|| format!("{name}: `{v}` is not a positive number"))
        };
        match flag.as_str() {
            // `cargo bench` passes `--bench` to every bench binary.
            "--bench" => {}
            "--messages" | "-n" => args.messages = number("--messages", value("--messages")?)?,
            "--keys" | "-k" => args.keys = number("--keys", value("--keys")?)?,
            "--pushers" | "-p" => args.pushers = number("--pushers", value("--pushers")?)?,
            "--store" => {
                args.stores = match value("--store")?.as_str() {
                    "sqlite" => vec![Backend::Sqlite],
                    "postgres" | "pg" => vec![Backend::Postgres],
                    "both" => vec![Backend::Sqlite, Backend::Postgres],
                    other => return Err(format!("--store: `{other}` is not sqlite, postgres or both")),
                }
            }
            "--help" | "-h" => {
                println!("{}", usage());
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(args)
}

fn main() {
    let args = parse_args().unwrap_or_else(|e| {
        eprintln!("push_to_done: {e}\n{}", usage());
        std::process::exit(2);
    });
    let plugin = Path::new(env!("CARGO_MANIFEST_DIR")).join("plugins/dist/work_order.wasm");
    if !plugin.is_file() {
        eprintln!("push_to_done: {} is missing; run scripts/build-plugins first", plugin.display());
        std::process::exit(2);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let mut table = Table::default();
    runtime.block_on(async {
        for &backend in &args.stores {
            bench_store(backend, &args, &plugin, &mut table).await;
        }
    });

    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!();
    println!(
        "machine: nproc={nproc}  N={} messages  K={} keys  P={} pushers  (inlet: concurrency {CONCURRENCY}, pool {POOL_SIZE}, poll 20ms)",
        args.messages, args.keys, args.pushers
    );
    print!("{}", table.render());
}

// ---------------------------------------------------------------------------------------
// One store
// ---------------------------------------------------------------------------------------

async fn bench_store(backend: Backend, args: &Args, plugin: &Path, table: &mut Table) {
    let store = backend.name();
    let dir = tempfile::tempdir().expect("tempdir");
    let (url, pg) = match backend {
        Backend::Sqlite => (format!("sqlite://{}", dir.path().join("inbox.db").display()), None),
        Backend::Postgres => {
            let pg = common::TestPg::new().await;
            (pg.url.clone(), Some(pg))
        }
    };
    eprintln!("{store}: {}", pg.as_ref().map_or(url.as_str(), |p| p.name()));
    let db = Db::open(backend, &url).await;

    // Raw inserts, same database, before Inlet touches it.
    let n = args.messages;
    let p = args.pushers;
    let rows = Arc::new((0..n).map(|i| RawRow::new(i, args.keys)).collect::<Vec<_>>());
    db.exec(backend.raw_table_ddl()).await.expect("create the baseline table");
    let one = raw_insert_one_per_tx(&db, &rows, p).await;
    eprintln!("{store}: raw insert, 1 row/tx: {}", rate(n, one, "rows/s"));
    table.row(store, format!("raw insert, 1 row/tx ({p} tasks, {POOL_SIZE} conns)"), rate(n, one, "rows/s"));
    let batched = raw_insert_batched(&db, &rows, p).await;
    eprintln!("{store}: raw insert, {BATCH} rows/tx: {}", rate(n, batched, "rows/s"));
    table.row(store, format!("raw insert, {BATCH} rows/tx ({p} tasks)"), rate(n, batched, "rows/s"));
    db.exec("DROP TABLE bench_raw").await.expect("drop the baseline table");
    if backend == Backend::Sqlite {
        db.exec("PRAGMA wal_checkpoint(TRUNCATE)").await.expect("checkpoint");
    }

    // Inlet.
    let target = FakeTarget::start().await;
    let config_path = dir.path().join("inlet.toml");
    std::fs::write(
        &config_path,
        format!(
            "[store]\nurl = \"{url}\"\n\n[[route]]\nname = \"{ROUTE}\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\n\
             target = {{ kind = \"http\", url = \"{}\", timeout = \"10s\" }}\nconcurrency = {CONCURRENCY}\n",
            plugin.display(),
            target.url
        ),
    )
    .expect("write the routing file");
    let config = Config::load(&config_path).unwrap_or_else(|e| panic!("bench routing file is invalid:\n{e}"));
    let options = app::Options {
        poll: Duration::from_millis(20),
        listen: Some("127.0.0.1:0".parse().unwrap()),
        ..app::Options::default()
    };
    let running = app::start(&config, options).await.expect("inlet starts");
    let push_url = format!("http://{}/push/{ROUTE}", running.addr);
    let http = reqwest::Client::builder().pool_max_idle_per_host(p * 2).build().expect("http client");

    // Warm-up: one message through the whole path (plugin instances, connections).
    let warmup = envelope(
        b"{\"workOrderId\":\"warmup\",\"completedItems\":1,\"completionTimestamp\":\"2026-08-01T10:00:00Z\"}",
        "warmup-0",
    );
    let status = http.post(&push_url).header("content-type", "application/json").body(warmup).send().await;
    assert_eq!(status.map(|r| r.status().as_u16()).ok(), Some(200), "warm-up push was not answered 200");
    wait_done(&db, 1, Instant::now()).await;

    // The measured run.
    let bodies: Vec<(usize, String)> = (0..n)
        .map(|i| {
            let key = i % args.keys;
            let seq = i / args.keys + 1;
            let data = format!(
                r#"{{"workOrderId":"key-{key}","completedItems":{seq},"completionTimestamp":"2026-08-01T10:00:00Z"}}"#
            );
            (i, envelope(data.as_bytes(), &format!("bench-{i}")))
        })
        .collect();
    // A key belongs to one pusher, which sends its messages in order.
    let mut lanes: Vec<Vec<String>> = vec![Vec::new(); p];
    for (i, body) in bodies {
        lanes[(i % args.keys) % p].push(body);
    }
    let idle = lanes.iter().filter(|l| l.is_empty()).count();
    if idle > 0 {
        eprintln!("{store}: note: {idle} of {p} pushers have no key (K < P)");
    }

    let start = Instant::now();
    let done_watch = {
        let db = db.clone();
        tokio::spawn(async move { wait_done(&db, n as i64 + 1, start).await })
    };
    let mut pushers = tokio::task::JoinSet::new();
    for lane in lanes {
        let http = http.clone();
        let url = push_url.clone();
        pushers.spawn(async move {
            let mut latencies = Vec::with_capacity(lane.len());
            let mut refused = Vec::new();
            for body in lane {
                let sent = Instant::now();
                let result = http.post(&url).header("content-type", "application/json").body(body).send().await;
                let status = match result {
                    Ok(r) => {
                        let s = r.status().as_u16();
                        let _ = r.bytes().await;
                        s
                    }
                    Err(e) => {
                        refused.push(e.to_string());
                        0
                    }
                };
                latencies.push(sent.elapsed());
                if status != 200 && status != 0 {
                    refused.push(format!("status {status}"));
                }
            }
            (latencies, refused)
        });
    }
    let mut latencies = Vec::with_capacity(n);
    let mut refused = Vec::new();
    while let Some(joined) = pushers.join_next().await {
        let (l, r) = joined.expect("pusher task");
        latencies.extend(l);
        refused.extend(r);
    }
    let ingest = start.elapsed();
    if !refused.is_empty() {
        panic!("{store}: {} of {n} pushes were not answered 200, e.g. {}", refused.len(), refused[0]);
    }
    eprintln!("{store}: inlet push (ingest): {}", rate(n, ingest, "msg/s"));
    let to_done = done_watch.await.expect("DONE watcher");
    eprintln!("{store}: inlet push -> DONE: {}", rate(n, to_done, "msg/s"));

    // Sanity: everything went through once, nothing parked or retried.
    let delivered = target.count.load(Ordering::Relaxed);
    let counts = running.shared.store.counts().await.expect("inbox counts");
    let unresolved: i64 = counts.iter().filter(|c| c.route == ROUTE).map(|c| c.count).sum();
    let parked: i64 = counts.iter().filter(|c| c.route == ROUTE && c.status == Status::Parked).map(|c| c.count).sum();
    if delivered != n as u64 + 1 || unresolved != 0 {
        eprintln!(
            "{store}: WARNING: the target saw {delivered} requests for {} messages; {unresolved} unresolved ({parked} parked)",
            n + 1
        );
    }
    running.stop().await;
    db.close().await;
    drop(pg);

    latencies.sort();
    let pct = |q: f64| latencies[((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1];
    table.row(store, "inlet push (ingest)".into(), rate(n, ingest, "msg/s"));
    table.row(store, "inlet push -> DONE".into(), rate(n, to_done, "msg/s"));
    table.row(
        store,
        "inlet push latency p50 / p99".into(),
        format!("{:.1} ms / {:.1} ms", ms(pct(0.50)), ms(pct(0.99))),
    );
    let per_sec = |d: Duration| n as f64 / d.as_secs_f64();
    table.row(store, "push -> DONE vs raw 1 row/tx".into(), format!("{:.2}x", per_sec(to_done) / per_sec(one)));
}

/// Polls the DONE count every 20 ms until it reaches `want`; the time since `start`.
async fn wait_done(db: &Db, want: i64, start: Instant) -> Duration {
    let mut ticks = tokio::time::interval(POLL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let done = db.count_done().await;
        if done >= want {
            return start.elapsed();
        }
        if start.elapsed() > STALL_LIMIT {
            panic!("only {done} of {want} rows DONE after {STALL_LIMIT:?}: the relay stalled");
        }
    }
}

fn envelope(data: &[u8], message_id: &str) -> String {
    common::push_envelope(data, &[], message_id).to_string()
}

fn rate(n: usize, d: Duration, unit: &str) -> String {
    format!("{:.0} {unit}  ({:.2} s)", n as f64 / d.as_secs_f64(), d.as_secs_f64())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

// ---------------------------------------------------------------------------------------
// Raw insert baseline
// ---------------------------------------------------------------------------------------

/// A row of about an inbox row's size: the work-order payload as it arrives and as it
/// is decoded (~100 bytes each), a SHA-256 hex digest, a few short TEXT and BIGINT columns.
struct RawRow {
    route: String,
    dedup_key: String,
    correlation_key: String,
    body: Vec<u8>,
    raw_data: Vec<u8>,
    digest: String,
    now: i64,
}

impl RawRow {
    fn new(i: usize, keys: usize) -> RawRow {
        let key = format!("key-{}", i % keys);
        let raw = format!(
            r#"{{"workOrderId":"{key}","completedItems":{},"completionTimestamp":"2026-08-01T10:00:00Z"}}"#,
            i / keys + 1
        );
        RawRow {
            route: ROUTE.into(),
            dedup_key: format!("bench-{i}"),
            correlation_key: key,
            body: raw.clone().into_bytes(),
            digest: inlet::inbox::digest_hex(raw.as_bytes()),
            raw_data: raw.into_bytes(),
            now: 1_785_000_000_000 + i as i64,
        }
    }
}

const RAW_INSERT: &str = "INSERT INTO bench_raw (route, dedup_key, correlation_key, body, raw_data, payload_digest, \
                          status, received_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, 'OPEN', $7, $7)";

impl Backend {
    fn raw_table_ddl(self) -> &'static str {
        match self {
            Backend::Sqlite => {
                "CREATE TABLE bench_raw (id INTEGER PRIMARY KEY AUTOINCREMENT, route TEXT NOT NULL, \
                 dedup_key TEXT NOT NULL, correlation_key TEXT, body BLOB, raw_data BLOB NOT NULL, \
                 payload_digest TEXT NOT NULL, status TEXT NOT NULL, received_at INTEGER NOT NULL, \
                 updated_at INTEGER NOT NULL)"
            }
            Backend::Postgres => {
                "CREATE TABLE bench_raw (id BIGSERIAL PRIMARY KEY, route TEXT NOT NULL, \
                 dedup_key TEXT NOT NULL, correlation_key TEXT, body BYTEA, raw_data BYTEA NOT NULL, \
                 payload_digest TEXT NOT NULL, status TEXT NOT NULL, received_at BIGINT NOT NULL, \
                 updated_at BIGINT NOT NULL)"
            }
        }
    }
}

/// N rows, one autocommitted INSERT each (as Inlet's ingest does), from `tasks` tasks.
async fn raw_insert_one_per_tx(db: &Db, rows: &Arc<Vec<RawRow>>, tasks: usize) -> Duration {
    db.exec("DELETE FROM bench_raw").await.expect("empty the baseline table");
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for t in 0..tasks {
        let (db, rows) = (db.clone(), Arc::clone(rows));
        set.spawn(async move {
            for row in rows.iter().skip(t).step_by(tasks) {
                db.insert_one(row).await.expect("raw insert");
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.expect("insert task");
    }
    start.elapsed()
}

/// N rows, BATCH per transaction, batches shared out over `tasks` tasks.
async fn raw_insert_batched(db: &Db, rows: &Arc<Vec<RawRow>>, tasks: usize) -> Duration {
    db.exec("DELETE FROM bench_raw").await.expect("empty the baseline table");
    let batches = rows.len().div_ceil(BATCH);
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for t in 0..tasks.min(batches) {
        let (db, rows) = (db.clone(), Arc::clone(rows));
        set.spawn(async move {
            for b in (t..batches).step_by(tasks) {
                let chunk = &rows[b * BATCH..((b + 1) * BATCH).min(rows.len())];
                db.insert_batch(chunk).await.expect("raw batch insert");
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.expect("insert task");
    }
    start.elapsed()
}

macro_rules! bind_row {
    ($sql:expr, $row:expr) => {
        sqlx::query($sql)
            .bind(&$row.route)
            .bind(&$row.dedup_key)
            .bind(&$row.correlation_key)
            .bind($row.body.as_slice())
            .bind($row.raw_data.as_slice())
            .bind(&$row.digest)
            .bind($row.now)
    };
}

/// The benchmark's own connection pool to the store's database.
#[derive(Clone)]
enum Db {
    Sqlite(SqlitePool),
    Pg(PgPool),
}

impl Db {
    async fn open(backend: Backend, url: &str) -> Db {
        match backend {
            // Exactly the pragmas Inlet's SQLite store uses.
            Backend::Sqlite => {
                let options = inlet::inbox::sqlite::connect_options(url).expect("sqlite url");
                let pool = SqlitePoolOptions::new()
                    .max_connections(POOL_SIZE)
                    .acquire_timeout(Duration::from_secs(30))
                    .connect_with(options)
                    .await
                    .unwrap_or_else(|e| panic!("cannot open {url}: {e}"));
                Db::Sqlite(pool)
            }
            Backend::Postgres => {
                let pool = PgPoolOptions::new()
                    .max_connections(POOL_SIZE)
                    .acquire_timeout(Duration::from_secs(30))
                    .connect(url)
                    .await
                    .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
                Db::Pg(pool)
            }
        }
    }

    async fn exec(&self, sql: &str) -> Result<(), sqlx::Error> {
        match self {
            Db::Sqlite(p) => sqlx::raw_sql(sql).execute(p).await.map(drop),
            Db::Pg(p) => sqlx::raw_sql(sql).execute(p).await.map(drop),
        }
    }

    async fn insert_one(&self, row: &RawRow) -> Result<(), sqlx::Error> {
        match self {
            Db::Sqlite(p) => bind_row!(RAW_INSERT, row).execute(p).await.map(drop),
            Db::Pg(p) => bind_row!(RAW_INSERT, row).execute(p).await.map(drop),
        }
    }

    async fn insert_batch(&self, rows: &[RawRow]) -> Result<(), sqlx::Error> {
        match self {
            Db::Sqlite(p) => {
                let mut tx = p.begin().await?;
                for row in rows {
                    bind_row!(RAW_INSERT, row).execute(&mut *tx).await?;
                }
                tx.commit().await
            }
            Db::Pg(p) => {
                let mut tx = p.begin().await?;
                for row in rows {
                    bind_row!(RAW_INSERT, row).execute(&mut *tx).await?;
                }
                tx.commit().await
            }
        }
    }

    /// DONE rows in Inlet's inbox (index `inbox_entry_status_id`).
    async fn count_done(&self) -> i64 {
        const SQL: &str = "SELECT COUNT(*) FROM inbox_entry WHERE status = 'DONE'";
        let n = match self {
            Db::Sqlite(p) => sqlx::query_scalar::<_, i64>(SQL).fetch_one(p).await,
            Db::Pg(p) => sqlx::query_scalar::<_, i64>(SQL).fetch_one(p).await,
        };
        n.expect("count DONE rows")
    }

    async fn close(&self) {
        match self {
            Db::Sqlite(p) => p.close().await,
            Db::Pg(p) => p.close().await,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Target and output
// ---------------------------------------------------------------------------------------

/// An in-process HTTP server answering 204 to `POST /engine-rest/message`, counting.
struct FakeTarget {
    url: String,
    count: Arc<AtomicU64>,
    server: tokio::task::JoinHandle<()>,
}

impl FakeTarget {
    async fn start() -> FakeTarget {
        let count = Arc::new(AtomicU64::new(0));
        let app =
            axum::Router::new()
                .route(
                    "/engine-rest/message",
                    axum::routing::post(
                        |axum::extract::State(count): axum::extract::State<Arc<AtomicU64>>,
                         _body: axum::body::Bytes| async move {
                            count.fetch_add(1, Ordering::Relaxed);
                            axum::http::StatusCode::NO_CONTENT
                        },
                    ),
                )
                .with_state(Arc::clone(&count));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the fake target");
        let url = format!("http://{}", listener.local_addr().expect("fake target address"));
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("fake target server");
        });
        FakeTarget { url, count, server }
    }
}

impl Drop for FakeTarget {
    fn drop(&mut self) {
        self.server.abort();
    }
}

#[derive(Default)]
struct Table {
    rows: Vec<[String; 3]>,
}

impl Table {
    fn row(&mut self, store: &str, metric: String, value: String) {
        self.rows.push([store.to_string(), metric, value]);
    }

    fn render(&self) -> String {
        let header = ["store".to_string(), "metric".to_string(), "value".to_string()];
        let all: Vec<&[String; 3]> = std::iter::once(&header).chain(self.rows.iter()).collect();
        let w0 = all.iter().map(|r| r[0].len()).max().unwrap_or(0);
        let w1 = all.iter().map(|r| r[1].len()).max().unwrap_or(0);
        let mut out = String::new();
        for r in all {
            let _ = writeln!(out, "{:<w0$}  {:<w1$}  {}", r[0], r[1], r[2]);
        }
        out
    }
}
