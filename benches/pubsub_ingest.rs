//! Pub/Sub streaming pull → committed inbox rows, beside the raw batched insert rate
//! of the same database measured in the same run; the independent publisher's rate;
//! the latency of a lone message; the memory of a real `inlet` working off a backlog.
//!
//! ```text
//! cargo bench --bench pubsub_ingest -- [--messages N] [--backlog B] [--store sqlite|postgres|both]
//! ```
//!
//! Defaults: N=20000 messages over 200 keys, B=100000, both stores. Against one real
//! Pub/Sub emulator (`gcloud beta emulators pubsub start`, started here) it
//!
//! 1. creates a topic with one ordered subscription per store (and one more for a bare
//!    pull), then publishes the N messages with Google's Python client
//!    (`tests/pubsub/publish.py`, ordering key = the message's key), so each consumer
//!    works off its own copy of the same backlog; then times a bare streaming pull
//!    (the client crate Inlet uses, nothing of Inlet's, every message acked on arrival)
//!    from its start until it has all N: what the emulator delivers by itself;
//! 2. for each store (PostgreSQL first, see 3): opens the database (SQLite: a file in a
//!    temp dir; PostgreSQL: a fresh database through `INLET_TEST_PG_ADMIN_URL`, dropped
//!    at the end), measures the raw insert rate of inbox-sized rows, 500 per transaction
//!    from one writer (what the pull source does: one writer, `batch_size` 500); then
//!    builds Inlet's pull source alone — the route (`work_order` plugin, `log` target),
//!    an [`Ingest`] on Inlet's own store (`inlet::inbox::open`) and a [`Puller`] — runs
//!    it, and times it from its start until N rows are committed (a `COUNT(*)` every
//!    20 ms). No relay runs. The number of inbox transactions comes from the
//!    `inlet_pubsub_batch_size` histogram;
//! 3. on SQLite, with the puller still running on the drained subscription, publishes
//!    20 lone messages one at a time through the emulator's REST API and measures from
//!    the publish call's return until the row is visible (polled every millisecond).
//!    That includes the emulator's own delivery latency, not only Inlet's `batch_wait`,
//!    so the same is then timed on a topic of its own up to a bare streaming pull (the
//!    client crate Inlet uses, nothing of Inlet's). PostgreSQL goes first so that these
//!    messages never sit in a backlog still to be measured (its subscription gets a
//!    copy too);
//! 4. publishes B messages UNORDERED to a fresh topic and subscription, starts the real
//!    `inlet run` (SQLite store, `log` target, `RUST_LOG=warn`) on it and samples
//!    `/proc/PID/status` (VmRSS, VmHWM) every 50 ms until B rows are stored; for
//!    comparison the RSS of an idle `inlet` (same routing file, an empty subscription)
//!    one second after its stream is up. Both are stopped with SIGTERM.
//!
//! Benchmarks print figures; they never assert timings. A run that does not finish
//! (rows never arrive) fails loudly instead of printing a number. Needs
//! `scripts/build-plugins`, a reachable PostgreSQL (`scripts/ensure-postgres`), gcloud
//! with the Pub/Sub emulator, and `INLET_PUBSUB_PYTHON` (`scripts/ensure-py-pubsub`).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod support;

use base64::Engine as _;
use inlet::config::{Config, SourceConfig};
use inlet::delivery::Clients;
use inlet::inbox::DbClock;
use inlet::ingest::Ingest;
use inlet::pubsub_client::Connection;
use inlet::routing::Route;
use inlet::source::pull::{Puller, RouteSet};
use inlet::telemetry::Metrics;
use inlet_testkit::emulator::PubSubEmulator;
use inlet_testkit::pg::TestPg;
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use inlet_testkit::py_pubsub::publish_independent;
use inlet_testkit::wait::wait_until;
use support::{Backend, Db, RawRow, Table, ms, rate};

const PROJECT: &str = "inlet-bench";
/// The topic of parts 1–3, and the one of the backlog (part 4).
const TOPIC: &str = "orders";
const BACKLOG_TOPIC: &str = "backlog";
/// The subscription on [`TOPIC`] that the bare streaming pull drains.
const BARE_DRAIN: &str = "bare-drain";
const ROUTE: &str = "bench";
const KEYS: usize = 200;
/// Rows per transaction in the raw baseline: the pull source's default `batch_size`.
const BATCH: usize = 500;
/// How often the row count is polled.
const POLL: Duration = Duration::from_millis(20);
/// How often `/proc/PID/status` (and the row count) is sampled in part 4.
const SAMPLE: Duration = Duration::from_millis(50);
/// Lone messages in part 3, and the pause before each.
const LONE: usize = 20;
const LONE_GAP: Duration = Duration::from_millis(100);
/// Give up (loudly) if the rows are not all there by then.
const STALL_LIMIT: Duration = Duration::from_secs(300);

struct Args {
    messages: usize,
    backlog: usize,
    stores: Vec<Backend>,
}

fn usage() -> &'static str {
    "usage: cargo bench --bench pubsub_ingest -- [--messages N] [--backlog B] [--store sqlite|postgres|both]"
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args { messages: 20_000, backlog: 100_000, stores: vec![Backend::Postgres, Backend::Sqlite] };
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
            "--backlog" => args.backlog = number("--backlog", value("--backlog")?)?,
            "--store" => {
                let mut stores = Backend::parse_list(&value("--store")?)?;
                // PostgreSQL first: part 3 publishes to the shared topic on SQLite's turn.
                stores.sort_by_key(|b| *b == Backend::Sqlite);
                args.stores = stores;
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
        eprintln!("pubsub_ingest: {e}\n{}", usage());
        std::process::exit(2);
    });
    let plugin = support::work_order_plugin("pubsub_ingest");
    inlet::telemetry::init_logging();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let mut table = Table::default();
    runtime.block_on(async {
        let emulator = PubSubEmulator::start(PROJECT).await;
        eprintln!("emulator: {} (log {})", emulator.host, emulator.log_path().display());

        // One ordered subscription per store and one for the bare pull, all created
        // before anything is published.
        emulator.create_topic(TOPIC).await;
        for &backend in &args.stores {
            emulator.create_subscription(TOPIC, backend.name(), true).await;
        }
        emulator.create_subscription(TOPIC, BARE_DRAIN, true).await;
        let n = args.messages;
        let published = publish_independent(&emulator, TOPIC, n, KEYS, 0, true).await;
        eprintln!("publish: {n} ordered in {:.2} s", published.seconds);
        table.row(
            "pubsub",
            format!("python client publish, ordered ({n} over {KEYS} keys)"),
            format!("{:.0} msg/s  ({:.2} s)", published.rate, published.seconds),
        );

        let bare_drain = bare_pull_drain(&emulator, n).await;
        table.row(
            "pubsub",
            format!("emulator -> bare streaming pull, acked at once ({n}, ordered)"),
            rate(n, bare_drain, "msg/s"),
        );
        for &backend in &args.stores {
            bench_store(backend, &emulator, &args, bare_drain, &plugin, &mut table).await;
        }
        let bare = bare_pull_latency(&emulator).await;
        table.row(
            "pubsub",
            format!("lone message, publish returned -> bare streaming pull ({LONE}; emulator alone)"),
            bare.show(),
        );
        bench_backlog(&emulator, args.backlog, &plugin, &mut table).await;
    });

    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    println!();
    println!(
        "machine: nproc={nproc}  load at the end {}  N={} messages over {KEYS} keys  backlog={}  \
         (source defaults: batch_size {BATCH}, batch_wait 5ms, max_outstanding_messages 1000)",
        load.join(" "),
        args.messages,
        args.backlog
    );
    print!("{}", table.render());
}

// ---------------------------------------------------------------------------------------
// Parts 1–3: the pull source alone, per store
// ---------------------------------------------------------------------------------------

async fn bench_store(
    backend: Backend,
    emulator: &PubSubEmulator,
    args: &Args,
    bare_drain: Duration,
    plugin: &Path,
    table: &mut Table,
) {
    let store = backend.name();
    let n = args.messages;
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
    let rows = RawRow::many(ROUTE, n, KEYS);
    support::create_raw_table(&db, backend).await;
    let raw = support::raw_insert_batched(&db, &rows, BATCH, 1).await;
    support::drop_raw_table(&db, backend).await;
    drop(rows);
    eprintln!("{store}: raw insert, {BATCH} rows/tx: {}", rate(n, raw, "rows/s"));

    // The pull source, as `app` wires it, without relay or server.
    let subscription = emulator.subscription_path(store);
    let config = write_config(dir.path(), &url, plugin, &subscription, None);
    let route_config = config.routes[0].clone();
    let SourceConfig::Pubsub(source) = route_config.source.clone() else { unreachable!("a pubsub route") };
    let connection = Connection::emulator(&emulator.host);
    let clients = Clients::new(connection.clone());
    let cache = inlet::plugin::default_cache_dir();
    let metrics = Arc::new(Metrics::new());
    let route =
        Arc::new(Route::load(route_config, &clients, cache.as_deref(), &metrics).expect("the work_order plugin loads"));
    let inbox = inlet::inbox::open(&config.store.url, config.store.max_connections).await.expect("the inbox opens");
    let clock = DbClock::new(inbox.as_ref()).await.expect("the database clock");
    let ingest = Arc::new(Ingest::new(inbox, clock, Arc::clone(&metrics)));
    let batch_wait = source.batch_wait;
    let puller = Puller {
        routes: RouteSet::new(vec![route]),
        config: source,
        connection,
        ingest,
        metrics: Arc::clone(&metrics),
        ack_journal: None,
    };

    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let start = Instant::now();
    let pulling = tokio::spawn(puller.run(stop_rx));
    let ingest_time = wait_rows(&db, n as i64, start).await;
    let at_n = metrics.render();
    let batches = metric(&at_n, "inlet_pubsub_batch_size_count", "");
    let batched = metric(&at_n, "inlet_pubsub_batch_size_sum", "");
    eprintln!("{store}: pull -> committed: {}; {batches:.0} transactions", rate(n, ingest_time, "msg/s"));

    let lone = if backend == Backend::Sqlite { Some(lone_latency(emulator, &db).await) } else { None };

    let _ = stop.send(true);
    match tokio::time::timeout(Duration::from_secs(60), pulling).await {
        Ok(r) => r.expect("the puller task"),
        Err(_) => panic!("{store}: the puller did not stop within 60 s"),
    }
    let end = metrics.render();
    let duplicates = metric(&end, "inlet_ingested_total", "outcome=\"duplicate\"");
    let not_inserted = metric(&end, "inlet_ingested_total", "")
        - metric(&end, "inlet_ingested_total", "outcome=\"inserted\"")
        - duplicates;
    let nacked = metric(&end, "inlet_pubsub_messages_total", "outcome=\"nacked\"");
    let reconnects = metric(&end, "inlet_pubsub_reconnects_total", "");
    let stored = db.count("SELECT COUNT(*) FROM inbox_entry", None).await;
    let expected = n as i64 + if lone.is_some() { LONE as i64 } else { 0 };
    if stored != expected || not_inserted != 0.0 || reconnects != 0.0 {
        eprintln!(
            "{store}: WARNING: {stored} rows for {expected} messages; {not_inserted} parked/ignored/conflicts, \
             {reconnects} stream reconnects"
        );
    }
    db.close().await;
    drop(pg);

    let per_sec = |d: Duration| n as f64 / d.as_secs_f64();
    table.row(store, format!("raw insert, {BATCH} rows/tx (1 writer)"), rate(n, raw, "rows/s"));
    table.row(store, "pull -> committed (ingest only, no relay)".into(), rate(n, ingest_time, "msg/s"));
    table.row(store, format!("ingest vs raw {BATCH} rows/tx"), format!("{:.2}x", per_sec(ingest_time) / per_sec(raw)));
    table.row(
        store,
        "ingest vs bare streaming pull".into(),
        format!("{:.2}x", per_sec(ingest_time) / per_sec(bare_drain)),
    );
    table.row(
        store,
        "inbox transactions until N rows".into(),
        format!("{batches:.0}  (mean {:.1} rows/tx)", batched / batches.max(1.0)),
    );
    table.row(store, "redeliveries absorbed / nacked (whole run)".into(), format!("{duplicates:.0} / {nacked:.0}"));
    if let Some(lat) = lone {
        table.row(
            store,
            format!("lone message, publish returned -> row visible ({LONE}; incl. emulator)"),
            format!("{}; batch_wait {} ms", lat.show(), batch_wait.as_millis()),
        );
    }
}

/// Polls the row count every 20 ms until it reaches `want`; the time since `start`.
async fn wait_rows(db: &Db, want: i64, start: Instant) -> Duration {
    let mut ticks = tokio::time::interval(POLL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let rows = db.count("SELECT COUNT(*) FROM inbox_entry", None).await;
        if rows >= want {
            return start.elapsed();
        }
        if start.elapsed() > STALL_LIMIT {
            panic!("only {rows} of {want} rows after {STALL_LIMIT:?}: the pull source stalled");
        }
    }
}

struct Latency {
    p50: Duration,
    max: Duration,
    min: Duration,
}

impl Latency {
    fn of(mut took: Vec<Duration>, what: &str) -> Latency {
        took.sort();
        eprintln!("{what}: {:?} ms", took.iter().map(|d| ms(*d).round()).collect::<Vec<_>>());
        Latency { p50: took[(took.len() - 1) / 2], max: took[took.len() - 1], min: took[0] }
    }

    fn show(&self) -> String {
        format!("p50 {:.1} ms / max {:.1} ms  (min {:.1} ms)", ms(self.p50), ms(self.max), ms(self.min))
    }
}

/// Publishes lone message `i` to `topic` through the emulator's REST API (no ordering
/// key); returns its dedup key (`eventId`) and when the publish call returned.
async fn publish_lone(http: &reqwest::Client, emulator: &PubSubEmulator, topic: &str, i: usize) -> (String, Instant) {
    let event_id = format!("lone-{i}");
    let data = format!(r#"{{"workOrderId":"lone","completedItems":{i},"completionTimestamp":"2026-08-01T10:00:00Z"}}"#);
    let body = serde_json::json!({ "messages": [{
        "data": base64::engine::general_purpose::STANDARD.encode(data),
        "attributes": { "eventId": event_id },
    }]});
    let r = http
        .post(format!("{}/topics/{topic}:publish", emulator.url()))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("publish a lone message");
    let returned = Instant::now();
    assert!(r.status().is_success(), "publish a lone message: {}", r.text().await.unwrap_or_default());
    (event_id, returned)
}

/// Publishes [`LONE`] messages one at a time to the source's topic and times each from
/// the publish call's return until its row is visible, polling every millisecond.
async fn lone_latency(emulator: &PubSubEmulator, db: &Db) -> Latency {
    let http = reqwest::Client::new();
    let sql = format!("SELECT COUNT(*) FROM inbox_entry WHERE route = '{ROUTE}' AND dedup_key = $1");
    let mut took = Vec::with_capacity(LONE);
    for i in 0..LONE {
        // The source is idle (its writer waits for a first message) when each arrives.
        tokio::time::sleep(LONE_GAP).await;
        let (event_id, published) = publish_lone(&http, emulator, TOPIC, i).await;
        while db.count(&sql, Some(event_id.as_str())).await == 0 {
            if published.elapsed() > Duration::from_secs(30) {
                panic!("lone message {event_id} not stored 30 s after its publish");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        took.push(published.elapsed());
    }
    Latency::of(took, "sqlite: lone messages, publish returned -> row visible")
}

/// A streaming pull with the client crate Inlet uses and nothing of Inlet's (no flow
/// control, no batching, no store): every message is acked on arrival and reported
/// as its `eventId` attribute and when it arrived.
struct BarePull {
    rx: tokio::sync::mpsc::UnboundedReceiver<(String, Instant)>,
    task: tokio::task::JoinHandle<()>,
}

impl BarePull {
    async fn start(emulator: &PubSubEmulator, subscription: &str) -> BarePull {
        let subscriber = Connection::emulator(&emulator.host).subscriber().await.expect("a subscriber client");
        let mut stream = subscriber.subscribe(emulator.subscription_path(subscription)).build();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Some(Ok((message, handler))) = stream.next().await {
                let at = Instant::now();
                handler.ack();
                let id = message.attributes.get("eventId").cloned().unwrap_or_default();
                if tx.send((id, at)).is_err() {
                    break;
                }
            }
        });
        BarePull { rx, task }
    }

    /// The next message, or a panic naming `what` after `within`.
    async fn next(&mut self, within: Duration, what: &str) -> (String, Instant) {
        tokio::time::timeout(within, self.rx.recv())
            .await
            .unwrap_or_else(|_| panic!("bare pull: {what} not received within {within:?}"))
            .expect("the bare pull's stream ended")
    }
}

impl Drop for BarePull {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The emulator's delivery rate alone: the time from opening a bare streaming pull
/// on [`BARE_DRAIN`] until it has received the `n` published messages (distinct
/// `eventId`s, so a redelivery is not counted twice).
async fn bare_pull_drain(emulator: &PubSubEmulator, n: usize) -> Duration {
    let start = Instant::now();
    let mut pull = BarePull::start(emulator, BARE_DRAIN).await;
    let mut seen = std::collections::HashSet::with_capacity(n);
    while seen.len() < n {
        let (id, _) = pull.next(STALL_LIMIT, &format!("message {} of {n}", seen.len() + 1)).await;
        seen.insert(id);
    }
    let took = start.elapsed();
    eprintln!("bare pull: {n} received in {:.2} s", took.as_secs_f64());
    took
}

/// The emulator's part of the lone-message latency: the same lone messages on a topic
/// of their own, timed from the publish call's return until a bare streaming pull
/// hands them over.
async fn bare_pull_latency(emulator: &PubSubEmulator) -> Latency {
    const BARE: &str = "bare";
    emulator.create_topic(BARE).await;
    emulator.create_subscription(BARE, BARE, false).await;
    let mut pull = BarePull::start(emulator, BARE).await;
    let http = reqwest::Client::new();
    // One message first, so the stream is open before anything is timed.
    let _ = publish_lone(&http, emulator, BARE, LONE).await;
    pull.next(Duration::from_secs(60), "the first message").await;
    let mut took = Vec::with_capacity(LONE);
    for i in 0..LONE {
        tokio::time::sleep(LONE_GAP).await;
        let (event_id, published) = publish_lone(&http, emulator, BARE, i).await;
        loop {
            let (id, at) = pull.next(Duration::from_secs(30), &event_id).await;
            if id == event_id {
                took.push(at.saturating_duration_since(published));
                break;
            }
        }
    }
    Latency::of(took, "bare pull: lone messages, publish returned -> received")
}

// ---------------------------------------------------------------------------------------
// Part 4: a real `inlet` process working off a backlog
// ---------------------------------------------------------------------------------------

async fn bench_backlog(emulator: &PubSubEmulator, backlog: usize, plugin: &Path, table: &mut Table) {
    emulator.create_topic(BACKLOG_TOPIC).await;
    emulator.create_subscription(BACKLOG_TOPIC, "backlog", false).await;
    let published = publish_independent(emulator, BACKLOG_TOPIC, backlog, KEYS, 0, false).await;
    eprintln!("publish: {backlog} unordered in {:.2} s", published.seconds);
    table.row(
        "pubsub",
        format!("python client publish, unordered ({backlog})"),
        format!("{:.0} msg/s  ({:.2} s)", published.rate, published.seconds),
    );
    // Created after the publish: empty, for the idle comparison.
    emulator.create_subscription(BACKLOG_TOPIC, "idle", false).await;
    let envs = [("RUST_LOG", "warn"), ("PUBSUB_EMULATOR_HOST", emulator.host.as_str())];

    // An idle inlet: same routing file, nothing to pull.
    let idle_dir = tempfile::tempdir().expect("tempdir");
    let idle_url = format!("sqlite://{}", idle_dir.path().join("inbox.db").display());
    let port = free_port();
    write_config(idle_dir.path(), &idle_url, plugin, &emulator.subscription_path("idle"), Some(port));
    let mut idle = InletProcess::spawn(&idle_dir.path().join("inlet.toml"), &envs);
    idle.wait_healthy(Duration::from_secs(60)).await;
    let http = reqwest::Client::new();
    let metrics_url = format!("{}/metrics", idle.base);
    wait_until("the idle inlet's stream to be up", Duration::from_secs(60), || {
        let (http, url) = (http.clone(), metrics_url.clone());
        async move {
            let text = match http.get(&url).send().await {
                Ok(r) => r.text().await.unwrap_or_default(),
                Err(_) => return false,
            };
            metric(&text, "inlet_pubsub_connected", "") >= 1.0
        }
    })
    .await;
    // A moment to settle after the stream opened.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_mem = proc_status(idle.pid()).unwrap_or_else(|| panic!("no /proc status for inlet {}", idle.name));
    let idle_exit = idle.sigterm_and_wait(Duration::from_secs(60));
    eprintln!(
        "idle inlet: VmRSS {:.1} MiB, VmHWM {:.1} MiB; exit {idle_exit}",
        mib(idle_mem.rss_kib),
        mib(idle_mem.hwm_kib)
    );

    // The loaded one.
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("inbox.db").display());
    let port = free_port();
    write_config(dir.path(), &url, plugin, &emulator.subscription_path("backlog"), Some(port));
    let spawned = Instant::now();
    let mut inlet = InletProcess::spawn(&dir.path().join("inlet.toml"), &envs);
    let pid = inlet.pid();
    inlet.wait_healthy(Duration::from_secs(60)).await;
    let healthy = spawned.elapsed();
    // The store is open (and migrated) before the listener is up.
    let db = Db::open(Backend::Sqlite, &url).await;
    let mut peak_rss_kib = 0u64;
    let mut samples = 0usize;
    let mut ticks = tokio::time::interval(SAMPLE);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (all_stored, last) = loop {
        ticks.tick().await;
        inlet.assert_running();
        let mem = proc_status(pid).unwrap_or_else(|| panic!("no /proc status for inlet {}", inlet.name));
        peak_rss_kib = peak_rss_kib.max(mem.rss_kib);
        samples += 1;
        let rows = db.count("SELECT COUNT(*) FROM inbox_entry", None).await;
        if rows >= backlog as i64 {
            break (spawned.elapsed(), mem);
        }
        if spawned.elapsed() > STALL_LIMIT {
            panic!("only {rows} of {backlog} rows after {STALL_LIMIT:?}: inlet stalled\n{}", inlet.log());
        }
    };
    db.close().await;
    let exit = inlet.sigterm_and_wait(Duration::from_secs(60));
    eprintln!(
        "backlog inlet: {backlog} rows in {:.2} s; VmHWM {:.1} MiB, max sampled VmRSS {:.1} MiB ({samples} samples); exit {exit}",
        all_stored.as_secs_f64(),
        mib(last.hwm_kib),
        mib(peak_rss_kib)
    );

    let name = "inlet run";
    table.row(name, "idle RSS (1 s after the stream is up)".into(), format!("{:.1} MiB", mib(idle_mem.rss_kib)));
    table.row(
        name,
        format!("peak RSS, {backlog}-message backlog (VmHWM)"),
        format!("{:.1} MiB  (max sampled VmRSS {:.1} MiB)", mib(last.hwm_kib), mib(peak_rss_kib)),
    );
    table.row(
        name,
        format!("time to store {backlog} (from spawn)"),
        format!(
            "{:.2} s  ({:.0} msg/s after /healthz at {:.2} s; relay on, log target)",
            all_stored.as_secs_f64(),
            backlog as f64 / (all_stored - healthy).as_secs_f64(),
            healthy.as_secs_f64()
        ),
    );
}

#[derive(Clone, Copy)]
struct Memory {
    rss_kib: u64,
    hwm_kib: u64,
}

/// VmRSS and VmHWM of a process, from `/proc/PID/status`.
fn proc_status(pid: u32) -> Option<Memory> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        line[name.len()..].trim().trim_end_matches("kB").trim().parse().ok()
    };
    Some(Memory { rss_kib: field("VmRSS:")?, hwm_kib: field("VmHWM:")? })
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// Writes `DIR/inlet.toml`: one route pulling `subscription` with the `work_order`
/// plugin into the `log` target, the store at `url`, and `[server] listen` on `port`
/// if given. Returns the loaded configuration.
fn write_config(dir: &Path, url: &str, plugin: &Path, subscription: &str, port: Option<u16>) -> Config {
    let server = port.map(|p| format!("[server]\nlisten = \"127.0.0.1:{p}\"\n\n")).unwrap_or_default();
    let path = dir.join("inlet.toml");
    std::fs::write(
        &path,
        format!(
            "[store]\nurl = \"{url}\"\n\n{server}[[route]]\nname = \"{ROUTE}\"\nplugin = \"{}\"\n\
             source = {{ kind = \"pubsub\", subscription = \"{subscription}\" }}\ntarget = {{ kind = \"log\" }}\n",
            plugin.display()
        ),
    )
    .expect("write the routing file");
    Config::load(&path).unwrap_or_else(|e| panic!("bench routing file is invalid:\n{e}"))
}

/// A metric's value in Prometheus text, summed over the samples named exactly `name`
/// whose labels contain `labels`.
fn metric(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| l.split(['{', ' ']).next() == Some(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |sum, v| sum + v)
}
