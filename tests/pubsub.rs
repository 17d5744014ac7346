//! The Pub/Sub pull source against the real emulator, with messages published by
//! Google's own Python client (not Inlet's code): volume and per-key order, SIGKILL
//! and SIGTERM of a real `inlet` process, PostgreSQL going away, the emulator
//! restarting. Every test uses its own emulator, topic and subscription.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use inlet::app::{self, Running};
use inlet::config::Config;
use inlet::pubsub_client::Connection;
use inlet_testkit::camunda::FakeCamunda;
use inlet_testkit::emulator::PubSubEmulator;
use inlet_testkit::paths::plugin_path;
use inlet_testkit::pg::TestPg;
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use inlet_testkit::proxy::TcpProxy;
use inlet_testkit::py_pubsub::{assert_drained, publish_independent, publish_spread, publish_with_attributes};
use inlet_testkit::wait::{wait_for, wait_until};

const PROJECT: &str = "inlet-test";
const TOPIC: &str = "orders";
const SUBSCRIPTION: &str = "inlet";

/// The `[[route]]` of these tests: work orders pulled from the test subscription and
/// delivered to a fake Camunda, one key at a time. A 2 s target timeout keeps the
/// lease (and so the take-over after a SIGKILL) short. `source` adds source fields.
fn pull_route(target_url: &str, source: &str) -> String {
    format!(
        r#"[[route]]
name = "orders"
plugin = "{plugin}"
concurrency = 16
max_steps = 1
source = {{ kind = "pubsub", subscription = "projects/{PROJECT}/subscriptions/{SUBSCRIPTION}", lease_extension = "10s"{source} }}
target = {{ kind = "http", url = "{target_url}", timeout = "2s" }}
"#,
        plugin = plugin_path("work_order").display()
    )
}

/// Source fields that let `inlet pubsub setup` create the topic and the (ordered)
/// subscription.
fn setup_fields() -> String {
    format!(r#", topic = "projects/{PROJECT}/topics/{TOPIC}""#)
}

/// An emulator with the ordered test topic and subscription.
async fn emulator() -> PubSubEmulator {
    let emulator = PubSubEmulator::start(PROJECT).await;
    create_topology(&emulator).await;
    emulator
}

async fn create_topology(emulator: &PubSubEmulator) {
    emulator.create_topic(TOPIC).await;
    emulator.create_subscription(TOPIC, SUBSCRIPTION, true).await;
}

/// An emulator with the test topic and an UNORDERED subscription, for the tests
/// where a consumer goes away mid-run. The emulator does not redeliver what an
/// ordered subscription had handed to a stream that is gone (killed, stopped or
/// reopened): seen here, 5,306 of 8,000 outstanding messages came back within 12 s
/// of the restart and the rest not in five minutes; its log shows a
/// NoSuchMethodError for every closed stream, so it never learns the stream is
/// closed and keeps each key pinned to it. Google's service does not do this.
/// Unordered subscriptions strand far fewer, but still some (400
/// of 2,000 after three kills with Google's own client), so these tests check
/// Inlet's side exactly and only report the broker's ([`assert_acked_were_stored`]).
async fn emulator_unordered() -> PubSubEmulator {
    let emulator = PubSubEmulator::start(PROJECT).await;
    emulator.create_topic(TOPIC).await;
    emulator.create_subscription(TOPIC, SUBSCRIPTION, false).await;
    emulator
}

/// Every message of every key reached the target at least once (redeliveries
/// after a crash may repeat some), never two of one key at a time.
fn assert_all_delivered(camunda: &FakeCamunda, keys: usize, per_key: usize) {
    for k in 0..keys {
        let key = format!("key-{k}");
        let mut seqs = camunda.correlated_seqs(&key);
        seqs.sort();
        seqs.dedup();
        let expected: Vec<i64> = (0..per_key as i64).collect();
        assert_eq!(seqs, expected, "deliveries of {key} missing");
    }
    assert_eq!(camunda.max_in_flight_per_key(), 1, "two deliveries of one key overlapped");
}

/// Reads the inbox straight from the database, beside whatever Inlet is doing.
enum Rows {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

impl Rows {
    async fn open(url: &str) -> Rows {
        if let Some(path) = url.strip_prefix("sqlite://") {
            let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path).read_only(true);
            // The file appears when Inlet first opens it.
            let pool = wait_for("the SQLite inbox file", Duration::from_secs(30), || {
                let options = options.clone();
                async move { sqlx::SqlitePool::connect_with(options).await.ok() }
            })
            .await;
            Rows::Sqlite(pool)
        } else {
            Rows::Postgres(sqlx::PgPool::connect(url).await.expect("connect to the test database"))
        }
    }

    async fn scalar(&self, sql: &str) -> i64 {
        let r = match self {
            Rows::Sqlite(p) => sqlx::query_scalar::<_, i64>(sql).fetch_one(p).await,
            Rows::Postgres(p) => sqlx::query_scalar::<_, i64>(sql).fetch_one(p).await,
        };
        // Before Inlet has migrated the schema the table does not exist yet.
        r.unwrap_or(0)
    }

    async fn rows(&self) -> i64 {
        self.scalar("SELECT COUNT(*) FROM inbox_entry").await
    }

    async fn done(&self) -> i64 {
        self.scalar("SELECT COUNT(*) FROM inbox_entry WHERE status = 'DONE'").await
    }

    async fn distinct_messages(&self) -> i64 {
        self.scalar("SELECT COUNT(DISTINCT message_id) FROM inbox_entry").await
    }

    /// Exactly `n` rows, one per broker message.
    async fn assert_once_each(&self, n: usize, what: &str) {
        assert_eq!(self.rows().await, n as i64, "{what}");
        assert_eq!(self.distinct_messages().await, n as i64, "{what}: one row per message id");
    }

    /// The broker message ids that have a row.
    async fn message_ids(&self) -> HashSet<String> {
        let sql = "SELECT message_id FROM inbox_entry";
        let ids = match self {
            Rows::Sqlite(p) => sqlx::query_scalar::<_, String>(sql).fetch_all(p).await,
            Rows::Postgres(p) => sqlx::query_scalar::<_, String>(sql).fetch_all(p).await,
        };
        ids.expect("read the stored message ids").into_iter().collect()
    }

    /// The dedup keys of `route`'s entries that are DONE, sorted.
    async fn done_dedup_keys(&self, route: &str) -> Vec<String> {
        let sql = "SELECT dedup_key FROM inbox_entry WHERE route = $1 AND status = 'DONE' ORDER BY dedup_key";
        let keys = match self {
            Rows::Sqlite(p) => sqlx::query_scalar::<_, String>(sql).bind(route).fetch_all(p).await,
            Rows::Postgres(p) => sqlx::query_scalar::<_, String>(sql).bind(route).fetch_all(p).await,
        };
        keys.expect("read the dedup keys")
    }

    /// How many stored entries are of messages numbered `first` or later
    /// (`publish_independent`'s numbering: dedup key `evt-{i}`).
    async fn stored_from(&self, first: usize) -> usize {
        let sql = "SELECT dedup_key FROM inbox_entry";
        let keys = match self {
            Rows::Sqlite(p) => sqlx::query_scalar::<_, String>(sql).fetch_all(p).await,
            Rows::Postgres(p) => sqlx::query_scalar::<_, String>(sql).fetch_all(p).await,
        };
        let keys = keys.expect("read the dedup keys");
        keys.iter().filter_map(|k| k.strip_prefix("evt-")?.parse::<usize>().ok()).filter(|&i| i >= first).count()
    }

    async fn distinct_dedup_keys(&self) -> i64 {
        self.scalar("SELECT COUNT(DISTINCT dedup_key) FROM inbox_entry").await
    }

    async fn in_progress(&self) -> i64 {
        self.scalar("SELECT COUNT(*) FROM inbox_entry WHERE status = 'IN_PROGRESS'").await
    }

    async fn without_delivery_attempt(&self) -> i64 {
        self.scalar("SELECT COUNT(*) FROM inbox_entry WHERE delivery_attempt IS NULL OR delivery_attempt < 1").await
    }
}

/// Waits until `n` rows are DONE, printing progress on timeout.
async fn wait_all_done(rows: &Rows, n: i64, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let done = rows.done().await;
        if done >= n {
            return;
        }
        // A timeout says how far it got: stored and not delivered, or never received.
        if tokio::time::Instant::now() >= deadline {
            panic!(
                "timed out after {within:?} waiting for {n} entries DONE: {} rows stored, {done} DONE",
                rows.rows().await
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await; // polling the inbox, as wait_until does
    }
}

/// Waits until `n` rows are DONE, or until what is stored has stopped changing for
/// `quiet` with every stored row DONE: after a kill or a reconnect the emulator may
/// strand messages for good (see [`assert_acked_were_stored`]). Panics at `within`.
async fn wait_settled(rows: &Rows, n: i64, quiet: Duration, within: Duration) -> i64 {
    let deadline = tokio::time::Instant::now() + within;
    let mut last = (-1, -1);
    let mut since = tokio::time::Instant::now();
    loop {
        let now = (rows.rows().await, rows.done().await);
        if now.1 >= n {
            return now.0;
        }
        if now != last {
            (last, since) = (now, tokio::time::Instant::now());
        } else if now.0 == now.1 && since.elapsed() >= quiet {
            return now.0;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not settled within {within:?}: {} rows, {} DONE",
            now.0,
            now.1
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Shows the source working again after a disruption (a stop, a kill, a lost store),
/// with messages published after it. What was outstanding at the disruption cannot
/// show it: the emulator may never dispatch those again (seen in CI: 158 held by a
/// stopped process and 700 nacked during a lock, none back within 300 s; see
/// [`assert_acked_were_stored`]), and it may hand new ones to a stream that is gone.
/// So fresh messages go out in waves of one per key, numbered on from `next` (each
/// key's sequence continues), until the source has stored some of them. A wave's
/// publishes are spread over 10 s: the emulator hands what it holds to whichever
/// stream polls first (every 50 ms each), a dead one included, so a wave sent at once
/// goes whole to one stream, and one spread out gives every message its own chance
/// (a landing run saw all of 6 waves sent at once go nowhere). Returns how many
/// messages the test has published in all.
///
/// `source` reads the source's metrics text (the in-process registry, or a scrape of
/// the process's `/metrics`): a wave that found nothing stored prints the source's
/// counters, so a log tells a source that received nothing from one whose store
/// kept failing.
async fn recovered_with_fresh_messages(
    emulator: &PubSubEmulator,
    rows: &Rows,
    keys: usize,
    next: usize,
    source: impl AsyncFn() -> String,
) -> usize {
    const WAVES: usize = 8;
    const SPREAD: Duration = Duration::from_secs(10);
    const WAVE: Duration = Duration::from_secs(30);
    let mut published = next;
    for wave in 0..WAVES {
        let deadline = tokio::time::Instant::now() + WAVE;
        let publish = publish_spread(emulator, TOPIC, keys, keys, published, SPREAD);
        tokio::pin!(publish);
        let mut sent = false;
        loop {
            tokio::select! {
                _ = &mut publish, if !sent => sent = true,
                _ = tokio::time::sleep(Duration::from_millis(250)) => {} // polling the inbox: each poll reads every dedup key, so slower than wait_until
            }
            let fresh = rows.stored_from(next).await;
            if fresh > 0 {
                if !sent {
                    publish.await;
                }
                published += keys;
                println!("{fresh} of the {} messages published after the disruption stored", published - next);
                return published;
            }
            if sent && tokio::time::Instant::now() >= deadline {
                break;
            }
        }
        published += keys;
        println!(
            "wave {} of {WAVES}: none of the {} fresh messages stored within {WAVE:?}; {} rows in all; the source: {}",
            wave + 1,
            published - next,
            rows.rows().await,
            pubsub_counters(&source().await)
        );
    }
    panic!(
        "none of the {} messages published after the disruption were stored within {WAVES} waves of {WAVE:?}",
        published - next
    );
}

/// The source's own counters in a metrics text, one line: what it received, acked and
/// nacked, its reconnects by reason, whether it is connected.
fn pubsub_counters(text: &str) -> String {
    let counters: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with("inlet_pubsub_") && !l.contains("_bucket") && !l.contains("_sum") && !l.contains("_count")
        })
        .collect();
    counters.join("; ")
}

/// The rule for runs where a streaming-pull client died or reconnected. The emulator
/// strands messages such a client held (killed, stopped or reopened; unordered
/// subscriptions too) and keeps dispatching to dead streams, so whether every
/// published message comes back is luck, and so is a drain check. What Inlet controls
/// is checked exactly instead, from its ack journal: every message it acked has its
/// row, one row per message. `published - stored` is the emulator's stranding,
/// printed. Returns how many messages are stored.
async fn assert_acked_were_stored(rows: &Rows, journal: &Path, published: usize) -> usize {
    let journal = inlet::source::ack_journal::read(journal)
        .unwrap_or_else(|e| panic!("cannot read the ack journal {}: {e}", journal.display()));
    let acked: HashSet<String> = journal.acks.into_iter().map(|(_route, id)| id).collect();
    let stored = rows.message_ids().await;
    let missing: Vec<&String> = acked.difference(&stored).take(20).collect();
    assert!(missing.is_empty(), "acked without a row (of {} acked): {missing:?}", acked.len());
    assert_eq!(rows.rows().await, stored.len() as i64, "one row per message id");
    assert!(acked.len() >= stored.len().min(1), "the journal recorded the acks ({} acked)", acked.len());
    println!(
        "ack journal: {} acked ({} lines cut short by a kill, dropped), {} stored, {} published; {} stranded by the emulator",
        acked.len(),
        journal.torn,
        stored.len(),
        published,
        published - stored.len()
    );
    stored.len()
}

/// Every stored message reached the target (some perhaps twice after a crash),
/// never two of one key at a time. With nothing stranded, that is every message of
/// every key ([`assert_all_delivered`]).
fn assert_stored_were_delivered(camunda: &FakeCamunda, keys: usize, per_key: usize, stored: usize) {
    if stored == keys * per_key {
        return assert_all_delivered(camunda, keys, per_key);
    }
    let delivered: usize = (0..keys)
        .map(|k| {
            let mut seqs = camunda.correlated_seqs(&format!("key-{k}"));
            seqs.sort();
            seqs.dedup();
            seqs.len()
        })
        .sum();
    assert_eq!(delivered, stored, "every stored message delivered");
    assert_eq!(camunda.max_in_flight_per_key(), 1, "two deliveries of one key overlapped");
}

/// Every key's deliveries, with back-to-back repeats of one entry (a redelivery
/// after a crash) folded, must be exactly its messages in publish order.
fn assert_key_order(camunda: &FakeCamunda, keys: usize, per_key: usize) {
    for k in 0..keys {
        let key = format!("key-{k}");
        let mut seqs = camunda.correlated_seqs(&key);
        seqs.dedup();
        let expected: Vec<i64> = (0..per_key as i64).collect();
        assert_eq!(seqs, expected, "deliveries of {key} out of order or missing");
    }
    assert_eq!(camunda.max_in_flight_per_key(), 1, "two deliveries of one key overlapped");
}

/// Inlet in this process on `store_url`, pulling from `emulator`.
async fn start_in_process(dir: &Path, store_url: &str, routes: &str, emulator: &PubSubEmulator) -> Running {
    inlet::telemetry::init_logging();
    let config_path = dir.join("inlet.toml");
    std::fs::write(&config_path, format!("[store]\nurl = \"{store_url}\"\n\n{routes}")).unwrap();
    let config = Config::load(&config_path).unwrap_or_else(|e| panic!("test config is invalid:\n{e}"));
    let options = app::Options {
        poll: Duration::from_millis(20),
        listen: Some("127.0.0.1:0".parse().unwrap()),
        pubsub: Connection::emulator(&emulator.host),
        ack_journal: Some(journal(dir)),
        ..app::Options::default()
    };
    app::start(&config, options).await.expect("inlet starts")
}

/// The ack journal of the Inlet run in `dir`.
fn journal(dir: &Path) -> PathBuf {
    dir.join("acks.journal")
}

/// Waits until `received` (messages taken from the subscription so far) has not
/// moved for longer than the 10 s ack deadline: by then every redelivery the broker
/// had planned (for deliveries whose lease ran out under load) has arrived and been
/// acked as a duplicate, so a stop leaves nothing behind that a later run would see.
async fn wait_quiet<F, Fut>(mut received: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = f64>,
{
    let quiet = Duration::from_secs(12);
    let mut last = received().await;
    let mut since = tokio::time::Instant::now();
    let deadline = since + Duration::from_secs(180);
    let mut ticks = tokio::time::interval(Duration::from_millis(500));
    loop {
        ticks.tick().await;
        let now = received().await;
        if now != last {
            (last, since) = (now, tokio::time::Instant::now());
        } else if since.elapsed() >= quiet {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "the subscription never went quiet ({last} messages so far)");
    }
}

/// Like [`stop_checked`], for a real `inlet` process listening on `port`, stopped with SIGTERM,
/// its acks journalled in `dir`.
async fn stop_process_checked(inlet: &mut InletProcess, port: u16, rows: &Rows, dir: &Path, published: usize) -> usize {
    wait_quiet(|| scrape(port, "inlet_pubsub_messages_total", "orders")).await;
    let status = inlet.sigterm_and_wait(Duration::from_secs(60));
    assert!(status.success(), "inlet exits cleanly on SIGTERM: {status:?}\n{}", inlet.log());
    assert_acked_were_stored(rows, &journal(dir), published).await
}

/// The end of a run whose stream died or reconnected: stop once quiet, then the
/// journal rule instead of a drain check. Returns how many messages are stored.
async fn stop_checked(running: Running, rows: &Rows, dir: &Path, published: usize) -> usize {
    wait_quiet(|| async { metric(&running, "inlet_pubsub_messages_total", "orders") }).await;
    running.stop().await;
    assert_acked_were_stored(rows, &journal(dir), published).await
}

/// Streams of the `orders` route lost after setup (not the ones that found no
/// subscription before setup created it).
fn streams_lost(running: &Running) -> f64 {
    metric(running, "inlet_pubsub_reconnects_total", "orders")
        - metric(running, "inlet_pubsub_reconnects_total", r#"outcome="not_found""#)
}

/// The source's and the ingest's own counts, to say whether messages reached Inlet.
struct PubSubCounts {
    /// Messages taken from the stream and not yet acked or nacked.
    outstanding: f64,
    /// Every `inlet_pubsub*` and `inlet_ingested*` sample, for a failure message.
    lines: Vec<String>,
}

fn pubsub_counts(running: &Running) -> PubSubCounts {
    let text = running.shared.metrics.render();
    PubSubCounts {
        outstanding: sum_samples(&text, "inlet_pubsub_outstanding_messages", "orders"),
        lines: text
            .lines()
            .filter(|l| l.starts_with("inlet_pubsub") || l.starts_with("inlet_ingested"))
            .map(String::from)
            .collect(),
    }
}

/// A metric's value summed over the label sets that contain `labels`.
fn metric(running: &Running, name: &str, labels: &str) -> f64 {
    sum_samples(&running.shared.metrics.render(), name, labels)
}

/// The values of the samples of metric `name` whose labels contain `labels`, summed.
fn sum_samples(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `inlet pubsub setup` of the routing file in `dir`: the steps it reports.
async fn setup_in(dir: &Path, emulator: &PubSubEmulator) -> Vec<String> {
    let config = Config::load(&dir.join("inlet.toml")).unwrap();
    let steps = inlet::pubsub_client::setup(&config, &Connection::emulator(&emulator.host)).await.expect("setup");
    steps.iter().map(|s| s.to_string()).collect()
}

/// What setup reports when it creates the test topic and subscription.
fn created_topic_and_subscription() -> [String; 2] {
    [
        format!("created topic projects/{PROJECT}/topics/{TOPIC}"),
        format!("created subscription projects/{PROJECT}/subscriptions/{SUBSCRIPTION}"),
    ]
}

// ---------------------------------------------------------------------------------------
// 1. Volume and order
// ---------------------------------------------------------------------------------------

async fn ten_thousand_messages(backend: &str) {
    const N: usize = 10_000;
    const KEYS: usize = 200;
    let emulator = PubSubEmulator::start(PROJECT).await;
    let camunda = FakeCamunda::start().await;
    let dir = tempfile::tempdir().unwrap();
    let pg = if backend == "postgres" { Some(TestPg::new().await) } else { None };
    let url = match &pg {
        Some(pg) => pg.url.clone(),
        None => format!("sqlite://{}", dir.path().join("inbox.db").display()),
    };
    let routes = pull_route(&camunda.url(), &setup_fields());
    let mut running = start_in_process(dir.path(), &url, &routes, &emulator).await;
    // The subscription does not exist yet: the source keeps retrying until setup
    // has created it.
    assert_eq!(setup_in(dir.path(), &emulator).await, created_topic_and_subscription());
    let rows = Rows::open(&url).await;

    let report = publish_independent(&emulator, TOPIC, N, KEYS, 0, true).await;
    println!("{backend}: python client published {} messages in {:.2} s", report.published, report.seconds);
    assert_eq!(report.published, N);

    let mut stored = wait_settled(&rows, N as i64, Duration::from_secs(60), Duration::from_secs(300)).await;
    let mut lost = streams_lost(&running);
    let mut restarted = "";
    let counts = pubsub_counts(&running);
    if stored < N as i64 && lost == 0.0 && counts.outstanding == 0.0 {
        // Everything Inlet was given is stored, delivered and acked, it holds nothing,
        // its one stream is open, and nothing more comes: the emulator stopped
        // dispatching to a live stream (seen once, in a clean-clone CI run, after
        // 5,150 of 10,000). This does what an operator would: restart Inlet, which
        // opens a new stream. A stopped client that held nothing strands nothing, so
        // every remaining message must now arrive, and every check below holds as if
        // the stall had not happened. An Inlet that failed to read a live stream
        // would show messages outstanding, or leave them missing after the restart.
        println!(
            "{backend}: the emulator stopped dispatching after {stored} of {N} with the stream open and nothing outstanding; restarting Inlet on a new stream\n{}",
            counts.lines.join("\n")
        );
        running.stop().await;
        running = start_in_process(dir.path(), &url, &routes, &emulator).await;
        restarted = " (counted since the restart)";
        stored = wait_settled(&rows, N as i64, Duration::from_secs(60), Duration::from_secs(300)).await;
        lost = streams_lost(&running);
    }
    if stored < N as i64 {
        // Only a stream that broke mid-run (a store that stayed locked past its busy
        // timeout on a starved machine, say) may leave messages out: the emulator
        // strands what a closed stream held. Then what Inlet controls is checked
        // exactly, by its ack journal, as after a kill.
        // The source's own counts say whether the messages reached Inlet at all.
        assert!(
            lost > 0.0,
            "{stored} of {N} messages stored, all DONE, and no stream was lost: messages went missing\n{}",
            pubsub_counts(&running).lines.join("\n")
        );
        println!("{backend}: {lost} streams lost mid-run; checking by the ack journal");
        let stored = stop_checked(running, &rows, dir.path(), N).await;
        assert_stored_were_delivered(&camunda, KEYS, N / KEYS, stored);
        return;
    }
    rows.assert_once_each(N, "exactly one row per message").await;
    assert_key_order(&camunda, KEYS, N / KEYS);
    assert_eq!(camunda.count(), N, "each entry delivered once");
    wait_quiet(|| async { metric(&running, "inlet_pubsub_messages_total", "orders") }).await;
    println!(
        "{backend}: {:.0} batches; {:.0} deliveries acked, {:.0} of them redeliveries absorbed as duplicates; {lost} streams lost{restarted}",
        metric(&running, "inlet_pubsub_batch_size_count", "orders"),
        metric(&running, "inlet_pubsub_messages_total", "acked"),
        metric(&running, "inlet_ingested_total", "duplicate"),
    );
    running.stop().await;
    if lost == 0.0 {
        assert_drained(&emulator, SUBSCRIPTION, Duration::from_secs(12)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_messages_land_once_and_are_delivered_in_key_order_sqlite() {
    ten_thousand_messages("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_messages_land_once_and_are_delivered_in_key_order_postgres() {
    ten_thousand_messages("postgres").await;
}

/// The unordered test route with a dead-letter topic after 5 attempts.
fn dead_letter_route(target_url: &str) -> String {
    let dead_letter = format!(
        r#"{}, dead_letter_topic = "projects/{PROJECT}/topics/{TOPIC}-dlq", max_delivery_attempts = 5"#,
        setup_fields()
    );
    format!("{}ordering = \"none\"\n", pull_route(target_url, &dead_letter))
}

/// The broker reports delivery attempts only for subscriptions with a dead-letter
/// policy; there every row carries it. (The emulator mishandles dead-letter
/// policies on ordered subscriptions, so this route is unordered.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn setup_creates_a_dead_letter_subscription_and_rows_record_the_delivery_attempt() {
    const N: usize = 200;
    let emulator = PubSubEmulator::start(PROJECT).await;
    let camunda = FakeCamunda::start().await;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("inbox.db").display());
    let routes = dead_letter_route(&camunda.url());
    let running = start_in_process(dir.path(), &url, &routes, &emulator).await;
    // `inlet pubsub setup` creates what the routing file names; a second run finds it.
    let setup = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_inlet"))
            .args(["pubsub", "setup"])
            .arg(dir.path().join("inlet.toml"))
            .env("PUBSUB_EMULATOR_HOST", &emulator.host)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
        stdout.lines().skip(1).map(str::to_string).collect::<Vec<_>>()
    };
    // Five attempts 1s, 2s, 4s and 8s apart: 15s of nacks, far less than an outage
    // the route should ride out.
    let dead_letters_soon = format!(
        "warning: subscription projects/{PROJECT}/subscriptions/{SUBSCRIPTION} dead-letters a message after 5 \
         delivery attempts, which with a redelivery backoff of 1s to 1m is about 15s of nacks: an inbox outage that \
         long sends messages Inlet never stored to the dead-letter topic (raise max_delivery_attempts or \
         redelivery_backoff to ride out 1h; docs/pubsub.md, \"Dead-letter policy\")"
    );
    assert_eq!(
        setup(),
        [
            format!("created topic projects/{PROJECT}/topics/{TOPIC}"),
            format!("created topic projects/{PROJECT}/topics/{TOPIC}-dlq"),
            format!("created subscription projects/{PROJECT}/subscriptions/{SUBSCRIPTION}"),
            dead_letters_soon.clone(),
        ]
    );
    let again = setup();
    assert!(
        again.len() == 4 && again[..3].iter().all(|s| s.ends_with(" exists")) && again[3] == dead_letters_soon,
        "a second setup changes nothing: {again:?}"
    );

    let rows = Rows::open(&url).await;
    publish_independent(&emulator, TOPIC, N, 10, 0, false).await;
    wait_all_done(&rows, N as i64, Duration::from_secs(120)).await;
    assert_eq!(rows.rows().await, N as i64);
    assert_eq!(rows.without_delivery_attempt().await, 0, "the broker's delivery attempt is on every row");
    running.stop().await;
    assert_drained(&emulator, SUBSCRIPTION, Duration::from_secs(12)).await;
}

/// A message that comes having used half or more of its dead-letter policy's attempts
/// (nacked twice by a consumer that could not store it; the third of five attempts) is
/// counted in `inlet_pubsub_near_dead_letter_total`, which `InletNearDeadLetter`
/// watches; one with attempts to spare is not. (Unordered: see the test above.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_near_its_dead_letter_limit_is_counted() {
    let emulator = PubSubEmulator::start(PROJECT).await;
    let camunda = FakeCamunda::start().await;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("inbox.db").display());
    let routes = dead_letter_route(&camunda.url());
    let config = dir.path().join("inlet.toml");
    std::fs::write(&config, format!("[store]\nurl = \"{url}\"\n\n{routes}")).unwrap();
    inlet::pubsub_client::setup(&Config::load(&config).unwrap(), &Connection::emulator(&emulator.host))
        .await
        .expect("setup");
    publish_independent(&emulator, TOPIC, 1, 1, 0, false).await;
    let mut attempts = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while attempts.len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "nacked twice within 60 s: {attempts:?}");
        let nacked = emulator.pull_and_nack(SUBSCRIPTION).await;
        if nacked.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await; // poll interval: the redelivery waits for its backoff
        }
        attempts.extend(nacked);
    }
    assert_eq!(attempts, [1, 2], "the emulator counts each delivery");
    let running = start_in_process(dir.path(), &url, &routes, &emulator).await;
    let rows = Rows::open(&url).await;
    wait_all_done(&rows, 1, Duration::from_secs(60)).await;
    assert_eq!(rows.scalar("SELECT delivery_attempt FROM inbox_entry").await, 3);
    assert_eq!(metric(&running, "inlet_pubsub_near_dead_letter_total", "orders"), 1.0);
    // A second message, on its first attempt, is not near anything.
    publish_independent(&emulator, TOPIC, 1, 1, 1, false).await;
    wait_all_done(&rows, 2, Duration::from_secs(60)).await;
    assert_eq!(metric(&running, "inlet_pubsub_near_dead_letter_total", "orders"), 1.0);
    running.stop().await;
}

/// The ack journal as a FIFO the test reads: while the test holds no read end, every
/// journal write fails (EPIPE) and Inlet nacks the batch it has just stored, keeping
/// its stream open — a nack of stored messages without a reconnect, which the
/// emulator redelivers on the same live stream.
struct JournalPipe {
    path: PathBuf,
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl JournalPipe {
    fn create(dir: &Path) -> JournalPipe {
        let path = journal(dir);
        let made = std::process::Command::new("mkfifo").arg(&path).status().expect("run mkfifo");
        assert!(made.success(), "mkfifo {}", path.display());
        let mut pipe = JournalPipe { path, reader: None };
        pipe.open();
        pipe
    }

    /// Attaches a reader that drains the pipe: journal writes succeed again.
    fn open(&mut self) {
        let mut rx = tokio::net::unix::pipe::OpenOptions::new().open_receiver(&self.path).expect("open the FIFO");
        self.reader = Some(tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            while tokio::io::AsyncReadExt::read(&mut rx, &mut buf).await.is_ok_and(|n| n > 0) {}
        }));
    }

    /// Closes the read end: journal writes fail until [`JournalPipe::open`].
    async fn close(&mut self) {
        if let Some(reader) = self.reader.take() {
            reader.abort();
            let _ = reader.await;
        }
    }
}

/// The redelivery cascade of an ordered subscription, absorbed. On Google's service a
/// nack (or an expired lease) of a key's message brings back that message and every
/// later one of its key, acked or not. Here the consumer nacks messages it has already
/// stored (the journal cannot be written), on its live stream: the emulator redelivers
/// exactly the nacked ones, in order, and each is a duplicate. The emulator does not
/// bring back the acked messages after them (measured: 145 nacked, 55 acked after
/// them on the same keys, 145 redelivered), so that half of the cascade is published
/// again as the events it would bring back, with the same event ids — the route's
/// dedup key — in order on the same ordering keys. Per key the target sees every
/// message once, in publish order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ordered_redelivery_cascade_after_a_nack_is_absorbed_in_publish_order() {
    const N: usize = 200;
    const KEYS: usize = 10;
    let emulator = emulator().await;
    let camunda = FakeCamunda::start().await;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("inbox.db").display());
    let mut pipe = JournalPipe::create(dir.path());
    let running = start_in_process(dir.path(), &url, &pull_route(&camunda.url(), ""), &emulator).await;
    let rows = Rows::open(&url).await;
    let count = |outcome: &'static str| {
        let running = &running;
        move || metric(running, "inlet_pubsub_messages_total", &format!("outcome=\"{outcome}\""))
    };
    let (acked, nacked) = (count("acked"), count("nacked"));
    let duplicates = || metric(&running, "inlet_ingested_total", "outcome=\"duplicate\"");
    publish_independent(&emulator, TOPIC, N, KEYS, 0, true).await;
    wait_all_done(&rows, N as i64, Duration::from_secs(120)).await;

    // The second half: stored, and nacked while the journal cannot be written.
    pipe.close().await;
    publish_independent(&emulator, TOPIC, N, KEYS, N, true).await;
    wait_until("the second half stored and nacked", Duration::from_secs(120), || async {
        rows.rows().await >= 2 * N as i64 && nacked() >= N as f64
    })
    .await;
    pipe.open();
    wait_until("every message acked once the journal takes writes again", Duration::from_secs(180), || async {
        acked() >= 2.0 * N as f64
    })
    .await;
    let redelivered = duplicates();
    println!("{:.0} nacked, {redelivered:.0} redeliveries taken as duplicates", nacked());
    assert!(redelivered >= N as f64, "every nacked message came again and was a duplicate");

    // The rest of the cascade: the events after each key's first nacked message, again.
    publish_independent(&emulator, TOPIC, N / 2, KEYS, N + N / 2, true).await;
    wait_until("the cascade's acked messages taken as duplicates", Duration::from_secs(120), || async {
        duplicates() >= redelivered + (N / 2) as f64
    })
    .await;
    wait_quiet(|| async { metric(&running, "inlet_pubsub_messages_total", "orders") }).await;
    wait_all_done(&rows, 2 * N as i64, Duration::from_secs(120)).await;
    running.stop().await;
    rows.assert_once_each(2 * N, "one entry per message after the redeliveries").await;
    for k in 0..KEYS {
        let seqs = camunda.correlated_seqs(&format!("key-{k}"));
        let expected: Vec<i64> = (0..(2 * N / KEYS) as i64).collect();
        assert_eq!(seqs, expected, "key-{k}: each message once, in publish order");
    }
    assert_eq!(camunda.max_in_flight_per_key(), 1, "two deliveries of one key overlapped");
}

// ---------------------------------------------------------------------------------------
// 2. and 6. A real process killed or stopped mid-run
// ---------------------------------------------------------------------------------------

/// A routing file for a real `inlet` process on an SQLite inbox in `dir`.
fn process_config(dir: &Path, routes: &str) -> (PathBuf, String, u16) {
    let port = free_port();
    let db = dir.join("inbox.db");
    let config = dir.join("inlet.toml");
    std::fs::write(
        &config,
        format!("[store]\nurl = \"sqlite://{}\"\n\n[server]\nlisten = \"127.0.0.1:{port}\"\n\n{routes}", db.display()),
    )
    .unwrap();
    (config, format!("sqlite://{}", db.display()), port)
}

async fn scrape(port: u16, name: &str, labels: &str) -> f64 {
    sum_samples(&scrape_text(port).await, name, labels)
}

async fn scrape_text(port: u16) -> String {
    reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await.unwrap().text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_mid_run_keeps_exactly_one_row_per_message() {
    const N: usize = 10_000;
    const KEYS: usize = 200;
    let emulator = emulator_unordered().await;
    let camunda = FakeCamunda::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (config, url, port) = process_config(dir.path(), &pull_route(&camunda.url(), ""));
    let acks = journal(dir.path()).display().to_string();
    let env = [("PUBSUB_EMULATOR_HOST", emulator.host.as_str()), ("INLET_ACK_JOURNAL", acks.as_str())];
    // Published before Inlet starts, so the kill lands while it works through them.
    let report = publish_independent(&emulator, TOPIC, N, KEYS, 0, false).await;
    assert_eq!(report.published, N);
    let mut first = InletProcess::spawn(&config, &env);
    let rows = Rows::open(&url).await;
    wait_until("a fifth of the messages stored", Duration::from_secs(120), || async {
        rows.rows().await >= (N / 5) as i64
    })
    .await;
    first.sigkill();
    let at_kill = rows.rows().await;
    println!("killed with {at_kill} rows stored");
    assert!(at_kill < N as i64, "the kill must come mid-run (all {N} were stored already)");

    let mut second = InletProcess::spawn(&config, &env);
    let published = recovered_with_fresh_messages(&emulator, &rows, KEYS, N, async || scrape_text(port).await).await;
    // Not necessarily all: the emulator may strand what the killed process held.
    wait_settled(&rows, published as i64, Duration::from_secs(45), Duration::from_secs(300)).await;
    let duplicates = scrape(port, "inlet_ingested_total", "outcome=\"duplicate\"").await;
    println!("redeliveries absorbed by the dedup key after the restart: {duplicates}");
    let stored = stop_process_checked(&mut second, port, &rows, dir.path(), published).await;
    assert!(stored as i64 > at_kill, "the restarted instance stored more ({stored} after {at_kill} at the kill)");
    assert_eq!(rows.done().await, stored as i64, "every stored message delivered and DONE");
    assert_stored_were_delivered(&camunda, KEYS, published / KEYS, stored);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_with_messages_in_flight_acks_only_what_is_stored() {
    const N: usize = 3_000;
    const KEYS: usize = 100;
    let emulator = emulator_unordered().await;
    // A slow target, so deliveries are in flight when the signal comes.
    let camunda = FakeCamunda::start().await.with_delay(Duration::from_millis(100));
    let dir = tempfile::tempdir().unwrap();
    let (config, url, port) = process_config(dir.path(), &pull_route(&camunda.url(), ""));
    let acks = journal(dir.path()).display().to_string();
    let env = [("PUBSUB_EMULATOR_HOST", emulator.host.as_str()), ("INLET_ACK_JOURNAL", acks.as_str())];
    // No drain delay: a pull route has no load balancer to wait for, and the stop
    // must come while the source is still pulling, not after it pulled everything.
    let mut first = InletProcess::spawn_with_args(&config, &["--drain-delay", "0s"], &env);
    let rows = Rows::open(&url).await;

    let report = publish_independent(&emulator, TOPIC, N, KEYS, 0, false).await;
    assert_eq!(report.published, N);
    wait_until("some deliveries under way", Duration::from_secs(120), || async {
        camunda.count() >= 50 && rows.rows().await >= 100
    })
    .await;
    let status = first.sigterm_and_wait(Duration::from_secs(60));
    assert!(status.success(), "inlet exits cleanly on SIGTERM: {status:?}\n{}", first.log());
    let at_stop = rows.rows().await;
    let delivered = camunda.count();
    println!("stopped with {at_stop} rows stored and {delivered} deliveries made");
    assert_eq!(rows.in_progress().await, 0, "in-flight deliveries finish (and settle) within the grace period");
    assert!(rows.done().await < N as i64, "the stop must come mid-run");

    let mut second = InletProcess::spawn(&config, &env);
    // The restarted instance pulls again: it stores messages published after the stop.
    // (What the stopped one held may never come back, and the pull may have stored
    // every message before the signal came, the target being the slow half.)
    let published = recovered_with_fresh_messages(&emulator, &rows, KEYS, N, async || scrape_text(port).await).await;
    wait_settled(&rows, published as i64, Duration::from_secs(45), Duration::from_secs(300)).await;
    let stored = stop_process_checked(&mut second, port, &rows, dir.path(), published).await;
    assert!(stored as i64 > at_stop, "the restarted instance stored more ({stored} after {at_stop} at the stop)");
    assert_eq!(rows.done().await, stored as i64, "every stored message delivered and DONE");
    assert_stored_were_delivered(&camunda, KEYS, published / KEYS, stored);
}

// ---------------------------------------------------------------------------------------
// 3. PostgreSQL goes away
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_outage_mid_run_acks_nothing_without_its_row() {
    const N: usize = 5_000;
    const KEYS: usize = 100;
    let emulator = emulator_unordered().await;
    let camunda = FakeCamunda::start().await;
    let pg = TestPg::new().await;
    let proxy = TcpProxy::start("127.0.0.1:5432").await;
    let through_proxy = pg.url.replace("127.0.0.1:5432", &proxy.addr);
    assert_ne!(through_proxy, pg.url, "the store must go through the proxy");
    let dir = tempfile::tempdir().unwrap();
    let running = start_in_process(dir.path(), &through_proxy, &pull_route(&camunda.url(), ""), &emulator).await;
    // The test reads the database directly, not through the proxy.
    let rows = Rows::open(&pg.url).await;

    let report = publish_independent(&emulator, TOPIC, N, KEYS, 0, false).await;
    assert_eq!(report.published, N);
    wait_until("some messages stored", Duration::from_secs(120), || async { rows.rows().await >= 500 }).await;
    proxy.set_up(false);
    let at_cut = rows.rows().await;
    wait_until("the source to see the store fail", Duration::from_secs(60), || async {
        metric(&running, "inlet_pubsub_reconnects_total", "outcome=\"store\"") >= 1.0
    })
    .await;
    let nacked = metric(&running, "inlet_pubsub_messages_total", "outcome=\"nacked\"");
    println!("store cut at {at_cut} rows; {nacked} messages nacked while it was away");
    assert!(nacked >= 1.0, "messages that could not be stored are nacked");
    assert!(at_cut < N as i64, "the outage must come mid-run");
    proxy.set_up(true);

    let published =
        recovered_with_fresh_messages(&emulator, &rows, KEYS, N, async || running.shared.metrics.render()).await;
    wait_settled(&rows, published as i64, Duration::from_secs(45), Duration::from_secs(300)).await;
    let stored = stop_checked(running, &rows, dir.path(), published).await;
    assert!(stored as i64 > at_cut, "rows were stored once the store was back ({stored} after {at_cut} at the cut)");
    assert_eq!(rows.done().await, stored as i64, "every stored message delivered and DONE");
    assert_stored_were_delivered(&camunda, KEYS, published / KEYS, stored);
}

// ---------------------------------------------------------------------------------------
// 4. The emulator restarts
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn emulator_restart_mid_run_is_survived_by_reconnecting() {
    const N: usize = 1_000;
    const KEYS: usize = 50;
    let mut emulator = emulator().await;
    let camunda = FakeCamunda::start().await;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("inbox.db").display());
    let running = start_in_process(dir.path(), &url, &pull_route(&camunda.url(), ""), &emulator).await;
    let rows = Rows::open(&url).await;

    publish_independent(&emulator, TOPIC, N, KEYS, 0, true).await;
    wait_all_done(&rows, N as i64, Duration::from_secs(120)).await;

    emulator.kill();
    wait_until("the source to notice the emulator is gone", Duration::from_secs(60), || async {
        metric(&running, "inlet_pubsub_reconnects_total", "outcome=\"unreachable\"") >= 1.0
    })
    .await;
    emulator.restart().await;
    // The emulator keeps nothing: the test recreates the topic and subscription.
    create_topology(&emulator).await;
    publish_independent(&emulator, TOPIC, N, KEYS, N, true).await;

    // After a reconnect the emulator may strand messages for good (see
    // `assert_acked_were_stored`; seen in CI: the second half never all arrived), so
    // the second half is held to what Inlet controls: what it stored is delivered,
    // once at a time per key, and it is connected again.
    let settled = wait_settled(&rows, 2 * N as i64, Duration::from_secs(30), Duration::from_secs(240)).await;
    assert!(settled > N as i64, "messages published after the restart were stored ({settled} rows)");
    let reconnects = metric(&running, "inlet_pubsub_reconnects_total", "orders");
    println!("reconnects: {reconnects}; stored {settled} of {}", 2 * N);
    assert_eq!(metric(&running, "inlet_pubsub_connected", "orders"), 1.0, "connected again");
    // (The ack journal cannot be matched here: message ids restart in the new emulator.)
    running.stop().await;
    let stored = rows.rows().await as usize;
    assert_eq!(rows.done().await, stored as i64, "every stored message delivered and DONE");
    // Message ids restart at 1 in a new emulator; the events carry their own id
    // (`eventId`, the plugin's dedup key), so the second half are new entries.
    assert_eq!(rows.distinct_dedup_keys().await, stored as i64);
    assert_stored_were_delivered(&camunda, KEYS, 2 * N / KEYS, stored);
    // The first half, all delivered before the restart, went in publish order.
    for k in 0..KEYS {
        let mut seqs = camunda.correlated_seqs(&format!("key-{k}"));
        seqs.dedup();
        let first: Vec<i64> = seqs.into_iter().take(N / KEYS).collect();
        assert_eq!(first, (0..(N / KEYS) as i64).collect::<Vec<_>>(), "key-{k}'s first half out of order");
    }
}

// ---------------------------------------------------------------------------------------
// The embedded store goes away
// ---------------------------------------------------------------------------------------

/// SQLite cannot be unplugged like a server, but another process can hold its write
/// lock past Inlet's busy timeout (10 s): every batch then fails with SQLITE_BUSY, is
/// nacked, and the source stores again once the lock is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_locked_past_the_busy_timeout_nacks_and_recovers() {
    const N: usize = 2_000;
    const KEYS: usize = 50;
    let emulator = emulator_unordered().await;
    let camunda = FakeCamunda::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("inbox.db");
    let url = format!("sqlite://{}", path.display());
    let running = start_in_process(dir.path(), &url, &pull_route(&camunda.url(), ""), &emulator).await;
    let rows = Rows::open(&url).await;
    publish_independent(&emulator, TOPIC, N, KEYS, 0, false).await;
    wait_until("some messages stored", Duration::from_secs(120), || async { rows.rows().await >= 100 }).await;

    let mut locker = lock_exclusively(&path).await;
    let at_lock = rows.rows().await;
    // More after the lock, so the source has something to store while it holds: on a
    // loaded machine the lock may come only once the first N are all stored.
    publish_independent(&emulator, TOPIC, 2 * KEYS, KEYS, N, false).await;
    wait_until("the source to see the store fail", Duration::from_secs(60), || async {
        metric(&running, "inlet_pubsub_reconnects_total", "outcome=\"store\"") >= 1.0
    })
    .await;
    let nacked = metric(&running, "inlet_pubsub_messages_total", "outcome=\"nacked\"");
    println!("locked at {at_lock} rows; {nacked} messages nacked while locked");
    assert!(nacked >= 1.0, "messages that could not be stored are nacked");
    sqlx::query("ROLLBACK").execute(&mut locker).await.unwrap();
    drop(locker);

    let published =
        recovered_with_fresh_messages(&emulator, &rows, KEYS, N + 2 * KEYS, async || running.shared.metrics.render())
            .await;
    wait_settled(&rows, published as i64, Duration::from_secs(45), Duration::from_secs(300)).await;
    let stored = stop_checked(running, &rows, dir.path(), published).await;
    assert!(stored as i64 > at_lock, "rows were stored once the lock was gone ({stored} after {at_lock} at the lock)");
    assert_eq!(rows.done().await, stored as i64, "every stored message delivered and DONE");
    assert_stored_were_delivered(&camunda, KEYS, published / KEYS, stored);
}

/// Another process's connection to the SQLite file, holding its write lock
/// (`BEGIN EXCLUSIVE`) until `ROLLBACK`.
async fn lock_exclusively(path: &Path) -> sqlx::SqliteConnection {
    use sqlx::Connection as _;
    let mut locker =
        sqlx::SqliteConnection::connect_with(&sqlx::sqlite::SqliteConnectOptions::new().filename(path)).await.unwrap();
    sqlx::query("BEGIN EXCLUSIVE").execute(&mut locker).await.unwrap();
    locker
}

/// Flow control: while the store is stuck, Inlet holds (received, not yet acked or
/// nacked) at most `max_outstanding_messages`, though far more are waiting — it stops
/// reading the stream instead of piling messages up in memory.
///
/// Only the holding back is checked here; recovery is the test above. With a budget
/// this small the emulator took more than 5 minutes to hand the remaining 1,800 over
/// once the store was back (seen here). It ignores the broker-side flow control Inlet
/// asks for and keeps sending; the likely cause is that what waits unread in the
/// connection's buffers is not lease-extended by the client, expires and is sent
/// again. Google's service sends no more than the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_store_holds_the_source_to_its_flow_control_budget() {
    const BUDGET: f64 = 50.0;
    let emulator = emulator_unordered().await;
    let camunda = FakeCamunda::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("inbox.db");
    let url = format!("sqlite://{}", path.display());
    let routes = pull_route(&camunda.url(), ", max_outstanding_messages = 50, batch_size = 10");
    let running = start_in_process(dir.path(), &url, &routes, &emulator).await;
    let rows = Rows::open(&url).await;
    publish_independent(&emulator, TOPIC, 2_000, 50, 0, false).await;
    wait_until("some messages stored", Duration::from_secs(120), || async { rows.rows().await >= 100 }).await;

    let mut locker = lock_exclusively(&path).await;
    // More after the lock, so the source has more than its budget to hold while the
    // store is stuck, however far it had got before the lock.
    publish_independent(&emulator, TOPIC, 200, 50, 2_000, false).await;
    let held = || {
        metric(&running, "inlet_pubsub_received_total", "orders")
            - metric(&running, "inlet_pubsub_messages_total", "orders")
    };
    let mut most_held = 0.0f64;
    wait_until("the source to see the store fail", Duration::from_secs(60), || {
        most_held = most_held.max(held());
        async { metric(&running, "inlet_pubsub_reconnects_total", "outcome=\"store\"") >= 1.0 }
    })
    .await;
    sqlx::query("ROLLBACK").execute(&mut locker).await.unwrap();
    let stored = rows.rows().await;
    println!("at most {most_held} messages held while the store was stuck ({stored} of 2200 stored)");
    assert!(stored < 2_200, "the store must stall mid-run");
    assert!(most_held <= BUDGET, "held {most_held} messages with a budget of {BUDGET}");
    assert_eq!(most_held, BUDGET, "the budget, not the broker, limited what was held");
    running.stop().await;
}

// ---------------------------------------------------------------------------------------
// Acked-message retention and seek: getting back what a restored inbox lacks
// ---------------------------------------------------------------------------------------

/// `inlet ARGS…` against `emulator`: stdout, stderr and whether it exited 0.
fn inlet_cli(emulator: &PubSubEmulator, args: &[&str]) -> (String, String, bool) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inlet"))
        .args(args)
        .env("PUBSUB_EMULATOR_HOST", &emulator.host)
        .env_remove("INLET_CONFIG")
        .output()
        .expect("run inlet");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

/// `inlet pubsub setup CONFIG`: the lines after the connection line; panics if it fails.
fn setup_lines(emulator: &PubSubEmulator, config: &Path) -> Vec<String> {
    let (stdout, stderr, ok) = inlet_cli(emulator, &["pubsub", "setup", &config.display().to_string()]);
    assert!(ok, "inlet pubsub setup failed:\n{stdout}{stderr}");
    stdout.lines().skip(1).map(str::to_string).collect()
}

/// The subscription as the emulator reports it: `retain_acked_messages` and
/// `message_retention_duration` in whole seconds.
async fn retention_of(emulator: &PubSubEmulator, subscription: &str) -> (bool, Option<i64>) {
    let admin = Connection::emulator(&emulator.host).subscription_admin().await.expect("admin client");
    let s = admin
        .get_subscription()
        .set_subscription(emulator.subscription_path(subscription))
        .send()
        .await
        .unwrap_or_else(|e| panic!("get subscription {subscription}: {e}"));
    (s.retain_acked_messages, s.message_retention_duration.map(|d| d.seconds()))
}

/// Setup creates a subscription keeping acked messages as long as the route's
/// `retain_acked` says, sets an existing one's to it when the file changes (and says
/// what changed), leaves alone and reports a retention the route does not ask for;
/// seek refuses a subscription that keeps no acked messages and a time to come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_sets_the_acked_message_retention_and_updates_it_when_the_routing_file_changes() {
    let emulator = PubSubEmulator::start(PROJECT).await;
    // Made outside Inlet, without retention: one for a route without `topic`, which
    // setup must find and update, one that a seek must refuse.
    emulator.create_topic("made-by-hand").await;
    emulator.create_subscription("made-by-hand", "existing", false).await;
    emulator.create_subscription("made-by-hand", "no-retention", false).await;
    let dir = tempfile::tempdir().unwrap();
    let plugin = plugin_path("work_order");
    let write = |orders_retention: &str| {
        let routes = format!(
            r#"[[route]]
name = "orders"
plugin = "{plugin}"
source = {{ kind = "pubsub", subscription = "projects/{PROJECT}/subscriptions/{SUBSCRIPTION}", topic = "projects/{PROJECT}/topics/{TOPIC}"{orders_retention} }}
target = {{ kind = "log" }}

[[route]]
name = "existing"
plugin = "{plugin}"
source = {{ kind = "pubsub", subscription = "projects/{PROJECT}/subscriptions/existing", retain_acked = "30m" }}
target = {{ kind = "log" }}
"#,
            plugin = plugin.display()
        );
        process_config(dir.path(), &routes).0
    };
    let sub = |name: &str| format!("projects/{PROJECT}/subscriptions/{name}");
    let topic = format!("projects/{PROJECT}/topics/{TOPIC}");
    // The subscription made by hand is unordered, its route orders per key: reported
    // every time, never changed (ordering cannot be changed on a subscription).
    let unordered = |name: &str| {
        format!(
            "subscription {} differs from its route, left as it is: message ordering is off, the route's ordering \
             is \"per-key\" (Inlet still delivers in inbox order; Pub/Sub may hand it a key's messages out of order); \
             it has no retry policy (Pub/Sub redelivers a nacked message at once), the routing file's \
             source.redelivery_backoff is 1s to 1m (recreate it, or change the routing file, to make them agree)",
            sub(name)
        )
    };

    let config = write(r#", retain_acked = "1h""#);
    assert_eq!(
        setup_lines(&emulator, &config),
        [
            format!("created topic {topic}"),
            format!("created subscription {}, keeping acked messages for 1h", sub(SUBSCRIPTION)),
            format!(
                "updated subscription {}: retain_acked_messages false → true, message_retention_duration 7d → 30m",
                sub("existing")
            ),
            unordered("existing"),
        ]
    );
    assert_eq!(retention_of(&emulator, SUBSCRIPTION).await, (true, Some(3600)), "as created");
    assert_eq!(retention_of(&emulator, "existing").await, (true, Some(1800)), "as updated");

    let config = write(r#", retain_acked = "2h""#);
    assert_eq!(
        setup_lines(&emulator, &config),
        [
            format!("topic {topic} exists"),
            format!("updated subscription {}: message_retention_duration 1h → 2h", sub(SUBSCRIPTION)),
            format!("subscription {} exists", sub("existing")),
            unordered("existing"),
        ]
    );
    assert_eq!(retention_of(&emulator, SUBSCRIPTION).await, (true, Some(7200)), "updated to the file's");
    assert_eq!(
        setup_lines(&emulator, &config),
        [
            format!("topic {topic} exists"),
            format!("subscription {} exists", sub(SUBSCRIPTION)),
            format!("subscription {} exists", sub("existing")),
            unordered("existing"),
        ],
        "nothing left to change, and the ordering made by hand still reported"
    );

    // Without `retain_acked` the route leaves the retention alone (turning it off is
    // a cost decision setup does not take behind anyone's back), and says so.
    let config = write("");
    assert_eq!(
        setup_lines(&emulator, &config)[1],
        format!(
            "subscription {} exists and keeps acked messages for 2h, which its route does not set (`retain_acked`): left as it is",
            sub(SUBSCRIPTION)
        )
    );
    assert_eq!(retention_of(&emulator, SUBSCRIPTION).await, (true, Some(7200)), "left as it was");
    // The same with --json: one document, each step with its fields and its line.
    let (stdout, stderr, ok) = inlet_cli(&emulator, &["--json", "pubsub", "setup", &config.display().to_string()]);
    assert!(ok, "inlet --json pubsub setup failed:\n{stdout}{stderr}");
    let answer: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let step = &answer["steps"][1];
    assert_eq!(step["step"], "retains_unasked", "{answer}");
    assert_eq!(step["name"], sub(SUBSCRIPTION), "{answer}");
    assert_eq!(step["retain_acked_seconds"], 7200, "{answer}");
    assert_eq!(step["text"], setup_lines(&emulator, &config)[1], "{answer}");
    assert_eq!(answer["steps"][0]["step"], "exists", "{answer}");

    let now = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
    let (stdout, stderr, ok) =
        inlet_cli(&emulator, &["pubsub", "seek", "--subscription", &sub("no-retention"), "--to", &now]);
    assert!(!ok, "a seek back on a subscription without retention is refused:\n{stdout}");
    assert!(stderr.contains("does not retain acked messages"), "{stderr}");
    let later = humantime::format_rfc3339_millis(std::time::SystemTime::now() + Duration::from_secs(3600)).to_string();
    let (stdout, stderr, ok) =
        inlet_cli(&emulator, &["pubsub", "seek", "--subscription", &sub(SUBSCRIPTION), "--to", &later]);
    assert!(!ok, "a seek to a time to come is refused:\n{stdout}");
    assert!(stderr.contains("is in the future"), "{stderr}");
    let (stdout, stderr, ok) =
        inlet_cli(&emulator, &["pubsub", "seek", "--subscription", &sub(SUBSCRIPTION), "--to", "yesterday"]);
    assert!(!ok && stderr.contains("RFC 3339"), "a time that is not RFC 3339 is refused:\n{stdout}{stderr}");
}

/// The restore of RUNBOOK.md end to end: an inbox backed up, messages acked after
/// the backup, the backup restored (it lacks them), the route's subscription sought
/// back with `inlet pubsub seek`, Inlet started. Everything published after the seek
/// time comes again: what the backup lacks is stored, what it holds is recognized as
/// a duplicate (one entry per dedup key), so the inbox ends with each message once.
///
/// The route is unordered: the emulator answers Seek on an ordered subscription
/// with UNIMPLEMENTED (Google's service seeks both). Before the restore the instance
/// pulls the same messages from a second subscription of the topic, while the test
/// acks them on the route's own with unary pulls, as that instance would have: the
/// emulator never learns that a stopped instance's stream is closed and sends what a
/// seek brings back to that dead stream (seen here: 0 of 200 reached the restarted
/// instance in 180 s, docs/pubsub-client-notes.md §8 and §10). So the restarted
/// instance is the first to stream from the route's subscription, as it is after a
/// restart on Google's service.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn seek_after_a_restore_brings_back_what_was_acked_since_the_backup_without_duplicating_entries() {
    const HALF: usize = 100;
    const KEYS: usize = 10;
    let emulator = PubSubEmulator::start(PROJECT).await;
    let camunda = FakeCamunda::start().await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("inbox.db");
    let url = format!("sqlite://{}", db.display());
    let routes = format!(
        "{}ordering = \"none\"\n",
        pull_route(&camunda.url(), &format!(r#"{}, retain_acked = "1h""#, setup_fields()))
    );
    let config = dir.path().join("inlet.toml");
    std::fs::write(&config, format!("[store]\nurl = \"{url}\"\n\n{routes}")).unwrap();
    let steps = inlet::pubsub_client::setup(&Config::load(&config).unwrap(), &Connection::emulator(&emulator.host))
        .await
        .expect("setup");
    assert_eq!(steps.len(), 2, "topic and subscription created: {steps:?}");
    emulator.create_subscription(TOPIC, "before-restore", false).await;
    let before_restore = routes.replace(&format!("subscriptions/{SUBSCRIPTION}\""), "subscriptions/before-restore\"");
    assert_ne!(before_restore, routes);
    let running = start_in_process(dir.path(), &url, &before_restore, &emulator).await;
    let rows = Rows::open(&url).await;
    // What the instance acks, acked on the route's subscription too.
    let ack_on_route_subscription = async |n: usize| {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let mut acked = 0;
        while acked < n {
            assert!(tokio::time::Instant::now() < deadline, "{acked} of {n} acked on the route's subscription in 60 s");
            let pulled = emulator.pull(SUBSCRIPTION).await.len();
            acked += pulled;
            if pulled == 0 {
                tokio::time::sleep(Duration::from_millis(200)).await; // poll interval: nothing there yet
            }
        }
        assert_eq!(acked, n, "the route's subscription held exactly what was published");
    };

    // Before the backup: the first half, stored and acked.
    let first_published_after = std::time::SystemTime::now();
    publish_independent(&emulator, TOPIC, HALF, KEYS, 0, false).await;
    wait_all_done(&rows, HALF as i64, Duration::from_secs(120)).await;
    ack_on_route_subscription(HALF).await;
    wait_quiet(|| async { metric(&running, "inlet_pubsub_messages_total", "orders") }).await;
    let backup = dir.path().join("backup.db");
    let (stdout, stderr, ok) = inlet_cli(
        &emulator,
        &["--config", &config.display().to_string(), "inbox", "backup", &backup.display().to_string()],
    );
    assert!(ok, "inlet inbox backup failed:\n{stdout}{stderr}");
    let backup_time = stdout
        .split("holds everything committed before ")
        .nth(1)
        .map(str::trim)
        .unwrap_or_else(|| panic!("the backup prints its time: {stdout}"))
        .to_string();

    // After the backup: the second half, stored and acked, then the instance stops.
    publish_independent(&emulator, TOPIC, HALF, KEYS, HALF, false).await;
    wait_all_done(&rows, 2 * HALF as i64, Duration::from_secs(120)).await;
    ack_on_route_subscription(HALF).await;
    wait_quiet(|| async { metric(&running, "inlet_pubsub_messages_total", "orders") }).await;
    running.stop().await;
    drop(rows);

    // The restore: the backup in place of the inbox, its WAL files moved aside.
    for suffix in ["", "-wal", "-shm"] {
        let file = PathBuf::from(format!("{}{suffix}", db.display()));
        if file.exists() {
            std::fs::rename(&file, PathBuf::from(format!("{}.lost", file.display()))).unwrap();
        }
    }
    std::fs::copy(&backup, &db).unwrap();

    // Seek back past the backup time to before the first half was published, so the
    // messages the backup holds come again too: the inbox must take them as duplicates.
    // The routing file as it is after the restore: the route on its own subscription.
    std::fs::write(&config, format!("[store]\nurl = \"{url}\"\n\n{routes}")).unwrap();
    let backup_at = inlet::pubsub_client::parse_time(&backup_time).expect("the backup's time is RFC 3339");
    let margin = backup_at.duration_since(first_published_after).unwrap() + Duration::from_secs(1);
    let margin = format!("{}ms", margin.as_millis());
    let (stdout, stderr, ok) = inlet_cli(
        &emulator,
        &[
            "--config",
            &config.display().to_string(),
            "pubsub",
            "seek",
            "--route",
            "orders",
            "--to",
            &backup_time,
            "--margin",
            &margin,
        ],
    );
    assert!(ok, "inlet pubsub seek failed:\n{stdout}{stderr}");
    print!("{stdout}");
    assert!(
        stdout.contains(&format!("seeked subscription projects/{PROJECT}/subscriptions/{SUBSCRIPTION} to ")),
        "{stdout}"
    );

    let restored = Rows::open(&url).await;
    assert_eq!(restored.rows().await, HALF as i64, "the restored inbox holds the first half only");
    drop(restored);
    let running = start_in_process(dir.path(), &url, &routes, &emulator).await;
    let rows = Rows::open(&url).await;
    wait_until(
        "every message stored again and the first half's redeliveries seen",
        Duration::from_secs(180),
        || async {
            rows.rows().await >= 2 * HALF as i64
                && metric(&running, "inlet_ingested_total", "outcome=\"duplicate\"") >= HALF as f64
        },
    )
    .await;
    wait_quiet(|| async { metric(&running, "inlet_pubsub_messages_total", "orders") }).await;
    println!(
        "after the seek: {} rows, {:.0} redeliveries taken as duplicates",
        rows.rows().await,
        metric(&running, "inlet_ingested_total", "outcome=\"duplicate\"")
    );
    rows.assert_once_each(2 * HALF, "one entry per message after the restore and the seek").await;
    assert_eq!(rows.distinct_dedup_keys().await, 2 * HALF as i64);
    wait_all_done(&rows, 2 * HALF as i64, Duration::from_secs(120)).await;
    running.stop().await;
    // Unordered, so deliveries of a key may overlap; each message is delivered (the
    // second half twice: once before the restore, once from the restored inbox).
    for k in 0..KEYS {
        let mut seqs = camunda.correlated_seqs(&format!("key-{k}"));
        seqs.sort();
        seqs.dedup();
        assert_eq!(seqs, (0..(2 * HALF / KEYS) as i64).collect::<Vec<_>>(), "deliveries of key-{k}");
    }
}

// ---------------------------------------------------------------------------------------
// Replay windows: a seek on purpose, taken as new deliveries
// ---------------------------------------------------------------------------------------

/// A team seeks back on purpose after a bug and opens a replay window over the middle
/// of three batches: after the seek, each message of that batch is stored once more
/// as a new entry and delivered again, while the batches before and after it stay
/// duplicates; when the same messages come a third time, nothing more is stored.
///
/// As in [`seek_after_a_restore_brings_back_what_was_acked_since_the_backup_without_duplicating_entries`],
/// the first run streams from a second subscription of the topic while the test acks
/// the route's own with unary pulls, so the run after the seek is the first to stream
/// from it (the emulator sends what a seek brings back to a stopped stream). The third
/// delivery comes from a third subscription made before anything was published: to
/// Inlet a redelivery is the same message id again, whichever subscription brings it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replay_window_takes_the_messages_published_inside_it_as_new_deliveries_once() {
    const BATCH: usize = 20;
    const KEYS: usize = 4;
    let emulator = PubSubEmulator::start(PROJECT).await;
    let camunda = FakeCamunda::start().await;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("inbox.db").display());
    let routes = format!(
        "{}ordering = \"none\"\n",
        pull_route(&camunda.url(), &format!(r#"{}, retain_acked = "1h""#, setup_fields()))
    );
    let config = dir.path().join("inlet.toml");
    std::fs::write(&config, format!("[store]\nurl = \"{url}\"\n\n{routes}")).unwrap();
    inlet::pubsub_client::setup(&Config::load(&config).unwrap(), &Connection::emulator(&emulator.host))
        .await
        .expect("setup");
    emulator.create_subscription(TOPIC, "first-run", false).await;
    emulator.create_subscription(TOPIC, "third-run", false).await;
    let on = |subscription: &str| {
        routes.replace(&format!("subscriptions/{SUBSCRIPTION}\""), &format!("subscriptions/{subscription}\""))
    };

    // Three batches, the middle one alone inside [before, after).
    publish_independent(&emulator, TOPIC, BATCH, KEYS, 0, false).await;
    // Publish times are the emulator's clock in milliseconds: a step apart from the batch before.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = std::time::SystemTime::now();
    publish_independent(&emulator, TOPIC, BATCH, KEYS, BATCH, false).await;
    let after = std::time::SystemTime::now();
    // The same, towards the batch after.
    tokio::time::sleep(Duration::from_millis(50)).await;
    publish_independent(&emulator, TOPIC, BATCH, KEYS, 2 * BATCH, false).await;

    // The first run: every message stored and delivered once.
    let running = start_in_process(dir.path(), &url, &on("first-run"), &emulator).await;
    let rows = Rows::open(&url).await;
    wait_all_done(&rows, 3 * BATCH as i64, Duration::from_secs(120)).await;
    wait_quiet(|| async { metric(&running, "inlet_pubsub_messages_total", "orders") }).await;
    running.stop().await;
    let mut acked = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while acked < 3 * BATCH {
        assert!(tokio::time::Instant::now() < deadline, "{acked} acked on the route's subscription in 60 s");
        let pulled = emulator.pull(SUBSCRIPTION).await.len();
        acked += pulled;
        if pulled == 0 {
            tokio::time::sleep(Duration::from_millis(200)).await; // poll interval: nothing there yet
        }
    }

    // The window, opened from the command line, then the seek back; the routing file
    // as the next run has it (the run above wrote its own).
    std::fs::write(&config, format!("[store]\nurl = \"{url}\"\n\n{routes}")).unwrap();
    let config_arg = config.display().to_string();
    let (from, to) =
        (humantime::format_rfc3339_millis(before).to_string(), humantime::format_rfc3339_millis(after).to_string());
    let replay = |reason: &str| {
        let args =
            ["--config", &config_arg, "route", "replay", "orders", "--from", &from, "--to", &to, "--reason", reason];
        inlet_cli(&emulator, &args)
    };
    let (stdout, stderr, ok) = replay("redo the middle batch after the fix");
    assert!(ok, "inlet route replay failed:\n{stdout}{stderr}");
    assert!(stdout.starts_with("opened replay window 1 on orders"), "{stdout}");
    let (stdout, stderr, ok) = replay("again");
    assert!(
        !ok && stderr.contains("already has replay window 1 open"),
        "an overlapping window is refused:\n{stdout}{stderr}"
    );
    let start = humantime::format_rfc3339_millis(before - Duration::from_secs(60)).to_string();
    let (stdout, stderr, ok) = inlet_cli(
        &emulator,
        &["--json", "--config", &config_arg, "pubsub", "seek", "--route", "orders", "--to", &start],
    );
    assert!(ok, "inlet pubsub seek failed:\n{stdout}{stderr}");
    // With --json, one object per subscription sought, and nothing else.
    let sought: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(sought["subscription"], format!("projects/{PROJECT}/subscriptions/{SUBSCRIPTION}"), "{sought}");
    assert_eq!(sought["retained_since"], serde_json::Value::Null, "{sought}");

    // The second run: all 60 come again; the middle batch is stored anew.
    let running = start_in_process(dir.path(), &url, &on(SUBSCRIPTION), &emulator).await;
    wait_until("the middle batch replayed and the rest seen as duplicates", Duration::from_secs(180), || async {
        rows.rows().await >= 4 * BATCH as i64
            && metric(&running, "inlet_ingested_total", "outcome=\"duplicate\"") >= 2.0 * BATCH as f64
    })
    .await;
    wait_all_done(&rows, 4 * BATCH as i64, Duration::from_secs(120)).await;
    wait_quiet(|| async { metric(&running, "inlet_pubsub_messages_total", "orders") }).await;
    assert_eq!(metric(&running, "inlet_ingested_total", "outcome=\"replayed\""), BATCH as f64);
    running.stop().await;
    assert_eq!(rows.rows().await, 4 * BATCH as i64, "one new entry per message of the window");
    assert_eq!(
        rows.scalar("SELECT COUNT(DISTINCT message_id) FROM inbox_entry WHERE dedup_key LIKE '%#replay-1'").await,
        BATCH as i64
    );

    // The third time: the window is still open, and everything is a duplicate.
    let running = start_in_process(dir.path(), &url, &on("third-run"), &emulator).await;
    wait_until("the third delivery seen", Duration::from_secs(180), || async {
        metric(&running, "inlet_ingested_total", "outcome=\"duplicate\"") >= 3.0 * BATCH as f64
    })
    .await;
    wait_quiet(|| async { metric(&running, "inlet_pubsub_messages_total", "orders") }).await;
    assert_eq!(metric(&running, "inlet_ingested_total", "outcome=\"replayed\""), 0.0);
    running.stop().await;
    assert_eq!(rows.rows().await, 4 * BATCH as i64, "nothing stored the third time");

    // The target saw the middle batch twice and the others once. A message's `seq` is
    // its place among its key's messages: message n is key n % KEYS, seq n / KEYS.
    let mut delivered = std::collections::BTreeMap::<(usize, i64), usize>::new();
    for k in 0..KEYS {
        for seq in camunda.correlated_seqs(&format!("key-{k}")) {
            *delivered.entry((k, seq)).or_default() += 1;
        }
    }
    let per_key = (BATCH / KEYS) as i64;
    let expected: std::collections::BTreeMap<(usize, i64), usize> = (0..KEYS)
        .flat_map(|k| {
            (0..3 * per_key).map(move |seq| ((k, seq), if (per_key..2 * per_key).contains(&seq) { 2 } else { 1 }))
        })
        .collect();
    assert_eq!(delivered, expected, "deliveries per message (key, seq)");

    // Which entries the replay made, and from which.
    let (stdout, stderr, ok) =
        inlet_cli(&emulator, &["--config", &config_arg, "--json", "route", "replays", "orders", "--window", "1"]);
    assert!(ok, "inlet route replays failed:\n{stdout}{stderr}");
    let answer: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(answer["window"]["taken"], BATCH, "{answer}");
    let made = answer["entries"].as_array().expect("entries");
    assert_eq!(made.len(), BATCH, "{answer}");
    assert!(made.iter().all(|m| m["original"].as_i64() < m["entry"].as_i64()), "{answer}");
}

// ---------------------------------------------------------------------------------------
// Several routes on one subscription (content routing)
// ---------------------------------------------------------------------------------------

/// Three routes of one file reading one subscription, each selecting its messages by
/// the `type` attribute (the second two types); `extra` adds routes. The redelivery
/// backoff stops growing at 5 s, so a message nacked many times over comes again soon
/// after a route for it is added.
fn routes_by_type(target_url: &str, extra: &[(&str, &str)]) -> String {
    let plugin = plugin_path("work_order");
    let source = |select: &str| {
        format!(
            r#"{{ kind = "pubsub", subscription = "projects/{PROJECT}/subscriptions/{SUBSCRIPTION}", topic = "projects/{PROJECT}/topics/{TOPIC}", filter = "attributes:type", lease_extension = "10s", redelivery_backoff = ["1s", "5s"], select = {select} }}"#
        )
    };
    let selects = [
        ("orders", r#"{ attribute = "type", equals = "order" }"#),
        ("invoices", r#"{ attribute = "type", in = ["invoice", "credit-note"] }"#),
        ("refunds", r#"{ attribute = "type", equals = "refund" }"#),
    ];
    // A viewer's token, for the route list and the console (the test writes the file).
    let admin = "[[admin.token]]\nname = \"viewer\"\nrole = \"viewer\"\nsecret_file = \"viewer.token\"\n\n".to_string();
    admin
        + &selects
            .iter()
            .chain(extra)
        .map(|(name, select)| {
            format!(
                "[[route]]\nname = \"{name}\"\nplugin = \"{}\"\nsource = {}\ntarget = {{ kind = \"http\", url = \"{target_url}\", timeout = \"2s\" }}\n\n",
                plugin.display(),
                source(select)
            )
        })
        .collect::<String>()
}

/// The admin token of [`routes_by_type`]'s viewer.
const VIEWER: &str = "pubsub-viewer-token-0123456789";

/// `evt-{i}` for i in `range`, sorted as the inbox sorts them.
fn event_ids(range: std::ops::Range<usize>) -> Vec<String> {
    let mut ids: Vec<String> = range.map(|i| format!("evt-{i}")).collect();
    ids.sort();
    ids
}

/// One subscription feeds three routes by attribute: `inlet pubsub setup` creates it
/// once, with its filter; each message becomes an entry of the route that selects it
/// and is delivered there; a message no route selects gets no entry, is counted and
/// nacked (it comes again), and once a reload adds a route for it, that route takes it
/// on the same open stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_subscription_feeds_three_routes_by_attribute_and_an_unrouted_message_waits_for_its_route() {
    let emulator = PubSubEmulator::start(PROJECT).await;
    let camunda = FakeCamunda::start().await;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("inbox.db").display());
    std::fs::write(dir.path().join("viewer.token"), VIEWER).unwrap();
    let running = start_in_process(dir.path(), &url, &routes_by_type(&camunda.url(), &[]), &emulator).await;
    assert_eq!(
        setup_in(dir.path(), &emulator).await,
        created_topic_and_subscription(),
        "three routes, one subscription, set up once"
    );
    assert_eq!(emulator.subscription(SUBSCRIPTION).await["filter"], "attributes:type", "setup gave it its filter");
    // The route list says what each route takes.
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let base = format!("http://{}", running.admin_addr);
    let answer = http.get(format!("{base}/api/routes")).bearer_auth(VIEWER).send().await.unwrap();
    let text = answer.text().await.unwrap();
    let list: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let selects: Vec<(&str, &str)> = list["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["name"].as_str().unwrap(), r["select"].as_str().unwrap_or("none")))
        .collect();
    assert_eq!(
        selects,
        [
            ("invoices", r#"type in ["invoice", "credit-note"]"#),
            ("orders", r#"type = "order""#),
            ("refunds", r#"type = "refund""#)
        ],
        "{list}"
    );
    let signed = http.post(format!("{base}/console/login")).form(&[("token", VIEWER)]).send().await.unwrap();
    let cookie = signed.headers().get("set-cookie").expect("a sign-in sets the session cookie");
    let cookie = cookie.to_str().unwrap().split(';').next().unwrap().to_string();
    let answer = http.get(format!("{base}/console")).header("cookie", cookie).send().await.unwrap();
    let console = answer.text().await.unwrap();
    assert!(
        console.contains("takes messages with type = &quot;order&quot;"),
        "the console shows the select: {console}"
    );

    let rows = Rows::open(&url).await;
    publish_with_attributes(&emulator, TOPIC, 30, 3, 0, &[("type", "order")]).await;
    publish_with_attributes(&emulator, TOPIC, 20, 3, 30, &[("type", "invoice")]).await;
    publish_with_attributes(&emulator, TOPIC, 10, 3, 50, &[("type", "credit-note")]).await;
    publish_with_attributes(&emulator, TOPIC, 20, 3, 60, &[("type", "refund")]).await;
    publish_with_attributes(&emulator, TOPIC, 1, 1, 80, &[("type", "gift-card")]).await;

    wait_all_done(&rows, 80, Duration::from_secs(60)).await;
    assert_eq!(rows.done_dedup_keys("orders").await, event_ids(0..30));
    assert_eq!(rows.done_dedup_keys("invoices").await, event_ids(30..60));
    assert_eq!(rows.done_dedup_keys("refunds").await, event_ids(60..80));
    // The gift card: no route takes it, so no entry; counted (under the subscription's
    // first route by name, invoices) and nacked, so it comes again.
    wait_until("the gift card counted as unrouted twice", Duration::from_secs(60), || async {
        metric(&running, "inlet_pubsub_unrouted_total", "") >= 2.0
    })
    .await;
    assert_eq!(rows.rows().await, 80, "the unrouted message has no entry");
    assert_eq!(camunda.count(), 80, "each routed message delivered once");

    // A route for it: the next delivery of the gift card is its entry.
    let routes = routes_by_type(&camunda.url(), &[("gift-cards", r#"{ attribute = "type", equals = "gift-card" }"#)]);
    std::fs::write(dir.path().join("inlet.toml"), format!("[store]\nurl = \"{url}\"\n\n{routes}")).unwrap();
    let reloaded = inlet::reload::reload_now(&running.shared).await;
    assert_eq!(reloaded["routing_file"]["added"], serde_json::json!(["gift-cards"]), "{reloaded}");
    wait_all_done(&rows, 81, Duration::from_secs(90)).await;
    assert_eq!(rows.done_dedup_keys("gift-cards").await, event_ids(80..81));
    assert_eq!(camunda.count(), 81);
    assert!(metric(&running, "inlet_pubsub_unrouted_total", r#"route="invoices""#) >= 2.0);
    wait_quiet(|| async { metric(&running, "inlet_pubsub_messages_total", "") }).await;
    running.stop().await;
    assert_drained(&emulator, SUBSCRIPTION, Duration::from_secs(12)).await;
}
