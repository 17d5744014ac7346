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

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod support;

use inlet::app;
use inlet::config::Config;
use inlet::inbox::Status;
use inlet_testkit::pg::TestPg;
use inlet_testkit::push::push_envelope;
use support::{Backend, Db, POOL_SIZE, RawRow, Table, ms, rate};

/// The route's delivery concurrency.
const CONCURRENCY: u32 = 16;
/// Rows per transaction in the batched baseline.
const BATCH: usize = 100;
/// How often the DONE count is polled.
const POLL: Duration = Duration::from_millis(20);
/// Give up (loudly) if the rows are not all DONE by then.
const STALL_LIMIT: Duration = Duration::from_secs(300);
const ROUTE: &str = "bench";

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
            "--store" => args.stores = Backend::parse_list(&value("--store")?)?,
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
    let plugin = support::work_order_plugin("push_to_done");
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
            let pg = TestPg::new().await;
            (pg.url.clone(), Some(pg))
        }
    };
    eprintln!("{store}: {}", pg.as_ref().map_or(url.as_str(), |p| p.name()));
    let db = Db::open(backend, &url).await;

    // Raw inserts, same database, before Inlet touches it.
    let n = args.messages;
    let p = args.pushers;
    let rows = RawRow::many(ROUTE, n, args.keys);
    support::create_raw_table(&db, backend).await;
    let one = support::raw_insert_one_per_tx(&db, &rows, p).await;
    eprintln!("{store}: raw insert, 1 row/tx: {}", rate(n, one, "rows/s"));
    table.row(store, format!("raw insert, 1 row/tx ({p} tasks, {POOL_SIZE} conns)"), rate(n, one, "rows/s"));
    let batched = support::raw_insert_batched(&db, &rows, BATCH, p).await;
    eprintln!("{store}: raw insert, {BATCH} rows/tx: {}", rate(n, batched, "rows/s"));
    table.row(store, format!("raw insert, {BATCH} rows/tx ({p} tasks)"), rate(n, batched, "rows/s"));
    support::drop_raw_table(&db, backend).await;

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
        let done = db.count("SELECT COUNT(*) FROM inbox_entry WHERE status = 'DONE'", None).await;
        if done >= want {
            return start.elapsed();
        }
        if start.elapsed() > STALL_LIMIT {
            panic!("only {done} of {want} rows DONE after {STALL_LIMIT:?}: the relay stalled");
        }
    }
}

fn envelope(data: &[u8], message_id: &str) -> String {
    push_envelope(data, &[], message_id).to_string()
}

// ---------------------------------------------------------------------------------------
// Target
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
