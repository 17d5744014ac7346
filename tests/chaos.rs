//! The chaos harness: real parts, real faults, and afterwards every
//! invariant Inlet promises, checked exactly where Inlet controls the outcome.
//!
//! Parts: a PostgreSQL cluster of the test's own ([`PgCluster`], so it can be
//! crashed), the real Pub/Sub emulator (restartable), Google's Python client as the
//! publisher (several at once, over the same keys), a retrying pusher (push envelopes
//! re-sent until answered 200, several at once over the same keys), two `inlet run`
//! processes on the one database, each with `--ack-journal` into one shared file, and a
//! recording, idempotent HTTP target ([`RecordingTarget`]) behind a
//! [`TcpProxy`].
//!
//! Faults, on a seeded schedule (the seed is printed): SIGKILLs of a random instance at
//! random moments, each restarted at once; one PostgreSQL crash (`pg_ctl stop -m
//! immediate`) and restart; one emulator restart (topic and subscription recreated; its
//! message ids start at 1 again, so the journal check is split at the restart and rows
//! are told apart by the event's own id); the target unreachable, then slow; some
//! messages refused by the target with a permanent 422 at first, so they park by design
//! and are requeued through the admin API while claims run.
//!
//! The end: every expected row DONE, or every stored row settled and nothing changed
//! for 45 s — or, from 90 s after the faults, every stored row settled (the emulator
//! hands stranded messages back in bursts for many minutes, so quiet may never come);
//! the emulator is then stopped with every stream session, and what they stored is
//! worked off before the checks.
//!
//! Checks: every acked message id (journal) has exactly one row (*acked ⊆ stored*, per
//! emulator run); every pushed message exactly one row; every row DONE; per key at the
//! target never two requests in flight and entry ids never going back (no entry
//! delivered before an older entry of its key settled); each idempotency key took
//! effect once, in entry order, for exactly the key's rows. The emulator strands
//! messages a killed streaming-pull client held (docs/pubsub-client-notes.md §8), so
//! *published = stored* is never asserted on the pull path: `published − stored` is
//! printed as the emulator's stranding (compare with `scripts/chaos-control`, Google's
//! client alone under the same kills).
//!
//! Modes (environment):
//!
//! | variable | meaning |
//! |---|---|
//! | `INLET_CHAOS` | `short` (default, what CI runs: 12 kills, 5,000 messages, a few minutes), `medium` (30 kills, 20,000), `long` (100 kills, 100,000; about half an hour) |
//! | `INLET_CHAOS_SEED` | the schedule's seed (default: from the clock; printed either way) |
//! | `INLET_CHAOS_KILLS` | SIGKILLs, overriding the mode's (at least 1) |
//! | `INLET_CHAOS_MESSAGES` | messages in all, overriding the mode's (at least 200): 80 % published to the emulator, 20 % pushed |
//!
//! ```sh
//! export INLET_PUBSUB_PYTHON=$(scripts/ensure-py-pubsub | tail -n 1)
//! cargo test --test chaos -- --nocapture                                  # short
//! INLET_CHAOS=long cargo test --test chaos -- --nocapture                 # long
//! INLET_CHAOS_SEED=7 INLET_CHAOS_KILLS=20 cargo test --test chaos -- --nocapture
//! ```
//!
//! Needs the plugins built (`scripts/build-plugins`), `initdb`/`pg_ctl` (run as the
//! `postgres` user when the test runs as root), `gcloud` with the Pub/Sub emulator,
//! and `INLET_PUBSUB_PYTHON`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inlet_testkit::emulator::PubSubEmulator;
use inlet_testkit::paths::plugin_path;
use inlet_testkit::pg_cluster::PgCluster;
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use inlet_testkit::proxy::TcpProxy;
use inlet_testkit::push::push_envelope;
use inlet_testkit::py_pubsub::publish_independent;
use inlet_testkit::recording_target::RecordingTarget;
use inlet_testkit::wait::{wait_for, wait_until};

const PROJECT: &str = "inlet-chaos";
const TOPIC: &str = "orders";
const SUBSCRIPTION: &str = "inlet";
const PULL_ROUTE: &str = "pulled";
const PUSH_ROUTE: &str = "pushed";
const INSTANCES: usize = 2;
const PUBLISHERS: usize = 3;
const PUSHERS: usize = 4;
/// The admin token the test requeues with (an operator; SECURITY.md, Tokens).
const TOKEN: &str = "chaos-operator-token-0123456789";
/// One message in this many is refused (422) by the target at first.
const POISON_ONE_IN: u64 = 40;
/// From this long after the faults, the end needs no quiet period (see the end).
const LAST_CALL: Duration = Duration::from_secs(90);
/// How long the target takes to answer, outside its slow phase: uniform in this range.
const BASE_DELAY: (Duration, Duration) = (Duration::from_millis(10), Duration::from_millis(120));
/// The end: every expected row DONE, or nothing changed for this long with every
/// stored row settled (the emulator stranded the rest).
const QUIET: Duration = Duration::from_secs(45);

/// What a run does; from the environment (see the module doc).
#[derive(Clone, Debug)]
struct Plan {
    mode: String,
    seed: u64,
    kills: usize,
    pull: usize,
    push: usize,
    pull_keys: usize,
    push_keys: usize,
    /// Time between two kills: uniform in this range (ms).
    kill_gap_ms: (u64, u64),
}

impl Plan {
    fn from_env() -> Plan {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let number = |name: &str, min: u64| -> Option<u64> {
            let text = var(name)?;
            let n: u64 = text.trim().parse().unwrap_or_else(|_| panic!("{name}={text:?} is not a whole number"));
            assert!(n >= min, "{name}={n} is below the least that makes sense ({min})");
            Some(n)
        };
        let mode = var("INLET_CHAOS").unwrap_or_else(|| "short".into());
        let (kills, messages, pull_keys, push_keys) = match mode.as_str() {
            "short" => (12, 5_000, 100, 50),
            "medium" => (30, 20_000, 150, 50),
            "long" => (100, 100_000, 200, 100),
            other => panic!("INLET_CHAOS={other:?}: expected short, medium or long"),
        };
        let seed = number("INLET_CHAOS_SEED", 0).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
        });
        let kills = number("INLET_CHAOS_KILLS", 1).map_or(kills, |n| n as usize);
        let messages = number("INLET_CHAOS_MESSAGES", 200).map_or(messages, |n| n as usize);
        let push = messages / 5;
        Plan { mode, seed, kills, pull: messages - push, push, pull_keys, push_keys, kill_gap_ms: (2_500, 6_000) }
    }

    /// Pull messages published before the emulator restart (the rest after it).
    fn first_run(&self) -> usize {
        self.pull * 3 / 5
    }

    /// Roughly how long the kills take: loads are spread over it.
    fn fault_window(&self) -> Duration {
        Duration::from_millis(self.kills as u64 * (self.kill_gap_ms.0 + self.kill_gap_ms.1) / 2)
    }

    /// How many times the target refuses the message with this idempotency key
    /// before it may take effect (0 for most).
    fn refusals(&self, idempotency_key: &str) -> usize {
        let h = idempotency_key
            .bytes()
            .fold(self.seed ^ 0x9e37_79b9_7f4a_7c15, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
        if h % POISON_ONE_IN == 0 { 1 + (h / POISON_ONE_IN % 2) as usize } else { 0 }
    }
}

fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

/// The routing file every instance runs: the pull route and the push route, both to
/// the recording target through the proxy, one key at a time, retries kept short so
/// the outages end in minutes, an operator token for requeues.
fn routing_file(store: &str, target: &str, emulator_project: &str) -> String {
    let plugin = toml_str(&plugin_path("work_order").display().to_string());
    let target = toml_str(&format!("http://{target}"));
    let common = format!(
        r#"plugin      = {plugin}
target      = {{ kind = "http", url = {target}, timeout = "4s" }}
ordering    = "per-key"
parked      = "block-key"
concurrency = 16
max_steps   = 1
retry       = {{ initial = "200ms", max = "2s", max_attempts = 1000 }}"#
    );
    format!(
        r#"[store]
url = {store}

[admin]
auth = "token"

[[admin.token]]
name   = "chaos"
role   = "operator"
secret = "${{INLET_CHAOS_TOKEN}}"

[[route]]
name   = "{PULL_ROUTE}"
source = {{ kind = "pubsub", subscription = "projects/{emulator_project}/subscriptions/{SUBSCRIPTION}", lease_extension = "10s" }}
{common}

[[route]]
name   = "{PUSH_ROUTE}"
source = {{ kind = "push" }}
{common}
"#,
        store = toml_str(store),
    )
}

/// Seeded randomness. The fault schedule has a stream of its own, so what the
/// pushers and the requeuer draw (which depends on timing) does not move it.
#[derive(Clone)]
struct Dice(Arc<Mutex<fastrand::Rng>>);

impl Dice {
    /// Stream `n` of the run's seed.
    fn new(seed: u64, n: u64) -> Dice {
        Dice(Arc::new(Mutex::new(fastrand::Rng::with_seed(seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)))))
    }
    fn range(&self, (min, max): (u64, u64)) -> u64 {
        self.0.lock().unwrap().u64(min..=max)
    }
    fn index(&self, n: usize) -> usize {
        self.0.lock().unwrap().usize(..n)
    }
}

/// Runs blocking work (pg_ctl, a kill and its reaping) without stalling the runtime
/// that serves the target and the proxy.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

// ---------------------------------------------------------------------------------------
// The instances
// ---------------------------------------------------------------------------------------

/// The `inlet` processes: one slot per instance, each on a fixed port (a restarted
/// instance comes back where the pushers and the requeuer look for it), each
/// incarnation named `SLOT-N` (its lease owner).
struct Fleet {
    config: PathBuf,
    journal: PathBuf,
    emulator_host: String,
    ports: Vec<u16>,
    slots: Vec<InletProcess>,
    incarnations: usize,
}

impl Fleet {
    async fn start(config: PathBuf, journal: PathBuf, emulator_host: String) -> Fleet {
        let ports: Vec<u16> = (0..INSTANCES).map(|_| free_port()).collect();
        let mut fleet = Fleet { config, journal, emulator_host, ports, slots: Vec::new(), incarnations: 0 };
        for slot in 0..INSTANCES {
            let process = fleet.spawn(slot);
            fleet.slots.push(process);
        }
        for p in &mut fleet.slots {
            p.wait_healthy(Duration::from_secs(120)).await;
        }
        fleet
    }

    fn bases(&self) -> Vec<String> {
        self.ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect()
    }

    fn spawn(&mut self, slot: usize) -> InletProcess {
        self.incarnations += 1;
        let name = format!("{}-{}", (b'a' + slot as u8) as char, self.incarnations);
        let listen = format!("127.0.0.1:{}", self.ports[slot]);
        let journal = self.journal.display().to_string();
        InletProcess::spawn_with_args(
            &self.config,
            &["--listen", &listen, "--poll", "100ms", "--ack-journal", &journal],
            &[
                ("INLET_INSTANCE", name.as_str()),
                ("PUBSUB_EMULATOR_HOST", self.emulator_host.as_str()),
                ("INLET_CHAOS_TOKEN", TOKEN),
                ("RUST_LOG", "inlet=info"),
            ],
        )
    }

    /// SIGKILLs the instance in `slot` (and reaps it); its name and the moment.
    fn kill(&mut self, slot: usize) -> (String, Instant) {
        blocking(|| self.slots[slot].sigkill());
        (self.slots[slot].name.clone(), Instant::now())
    }

    /// Starts the next incarnation in `slot` and waits until it answers.
    async fn restart(&mut self, slot: usize) {
        let mut next = self.spawn(slot);
        next.wait_healthy(Duration::from_secs(120)).await;
        // The killed incarnation's log goes with it (kept only if the test fails).
        drop(std::mem::replace(&mut self.slots[slot], next));
    }

    /// Sum of a metric over the live instances, each scraped: `None` if one of them
    /// does not answer.
    async fn metric(&self, http: &reqwest::Client, name: &str, labels: &str) -> Option<Vec<f64>> {
        let mut values = Vec::new();
        for base in self.bases() {
            let text = http.get(format!("{base}/metrics")).send().await.ok()?.text().await.ok()?;
            values.push(sum_samples(&text, name, labels));
        }
        Some(values)
    }
}

fn sum_samples(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

// ---------------------------------------------------------------------------------------
// Loads
// ---------------------------------------------------------------------------------------

/// One publisher of Google's client for `range` of the pull messages, in chunks
/// spread over `over` (each chunk its own `publish.py` run).
async fn publish_spread(emulator_host: String, range: std::ops::Range<usize>, keys: usize, over: Duration) {
    let chunk = (range.len() / 6).clamp(100, 2_000);
    let chunks = range.len().div_ceil(chunk).max(1);
    let gap = over / chunks as u32;
    let emulator = PubSubEmulator::attach(&emulator_host, PROJECT);
    let mut start = range.start;
    while start < range.end {
        let count = chunk.min(range.end - start);
        let began = tokio::time::Instant::now();
        publish_independent(&emulator, TOPIC, count, keys, start, false).await;
        start += count;
        tokio::time::sleep_until(began + gap).await;
    }
}

/// What the pushers saw.
#[derive(Default)]
struct PushTally {
    /// Answers 200 `duplicate`: a push re-sent after its first 200 was lost.
    duplicates: AtomicUsize,
    /// Refusals and broken connections, each retried.
    retries: AtomicUsize,
}

/// Pusher `p`: messages `j ≡ p (mod PUSHERS)` of the push route, key `pkey-{j %
/// keys}`, each POSTed to a random instance and re-sent (to another random one) until
/// it is answered 200, as a push subscription does; spread over `over`.
async fn push_spread(p: usize, plan: Plan, bases: Vec<String>, dice: Dice, tally: Arc<PushTally>, over: Duration) {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let mine: Vec<usize> = (p..plan.push).step_by(PUSHERS).collect();
    let gap = over / mine.len().max(1) as u32;
    for j in mine {
        let began = tokio::time::Instant::now();
        let key = format!("pkey-{}", j % plan.push_keys);
        let data = format!(
            r#"{{"workOrderId":"{key}","completedItems":{},"completionTimestamp":"2026-08-01T10:00:00Z"}}"#,
            j / plan.push_keys
        );
        let envelope = push_envelope(data.as_bytes(), &[("eventId", &push_id(j))], &format!("push-msg-{j}"));
        let body = envelope.to_string();
        let mut tries = 0;
        loop {
            let base = &bases[dice.index(bases.len())];
            let sent = http
                .post(format!("{base}/push/{PUSH_ROUTE}"))
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await;
            if let Ok(r) = sent
                && r.status().as_u16() == 200
            {
                let answer: serde_json::Value =
                    serde_json::from_str(&r.text().await.unwrap_or_default()).unwrap_or_default();
                match answer["outcome"].as_str() {
                    Some("inserted") => {}
                    Some("duplicate") => {
                        tally.duplicates.fetch_add(1, Ordering::Relaxed);
                    }
                    other => panic!("push {j} answered 200 with outcome {other:?}: {answer}"),
                }
                break;
            }
            tries += 1;
            tally.retries.fetch_add(1, Ordering::Relaxed);
            assert!(tries < 2_000, "push {j} was never answered 200 (tried {tries} times)");
            // A push subscription's backoff, short: the instance may be restarting.
            tokio::time::sleep(Duration::from_millis(50 + dice.range((0, 200)))).await;
        }
        tokio::time::sleep_until(began + gap).await;
    }
}

fn push_id(j: usize) -> String {
    format!("push-{j}")
}

fn pull_id(i: usize) -> String {
    format!("evt-{i}")
}

/// What the requeuer did.
#[derive(Default)]
struct Requeues {
    done: AtomicUsize,
    /// Requeues answered 409, 500 or 503, or not answered.
    refused: AtomicUsize,
    /// Every PARKED row seen (id → its reason), at the moment it was seen.
    parked: Mutex<BTreeMap<i64, String>>,
}

/// Until `stop`: every ~second, requeue each PARKED entry through the admin API of a
/// random live instance (claims go on meanwhile). A 409 means it moved on already.
async fn requeue_loop(pool: sqlx::PgPool, bases: Vec<String>, dice: Dice, stop: Arc<AtomicBool>, out: Arc<Requeues>) {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    while !stop.load(Ordering::SeqCst) {
        let parked: Vec<(i64, Option<String>)> =
            sqlx::query_as("SELECT id, last_error FROM inbox_entry WHERE status = 'PARKED' ORDER BY id")
                .fetch_all(&pool)
                .await
                .unwrap_or_default(); // the database may be down (the crash): try again
        for (id, reason) in parked {
            out.parked.lock().unwrap().insert(id, reason.unwrap_or_default());
            let base = &bases[dice.index(bases.len())];
            let answer = http.post(format!("{base}/api/entries/{id}/requeue")).bearer_auth(TOKEN).send().await;
            match answer.map(|r| r.status().as_u16()) {
                Ok(200) => {
                    out.done.fetch_add(1, Ordering::Relaxed);
                }
                // Moved on already, the store down or in recovery (the crash), or the
                // instance restarting: the next round tries again.
                Ok(409) | Ok(500) | Ok(503) | Err(_) => {
                    out.refused.fetch_add(1, Ordering::Relaxed);
                }
                Ok(other) => panic!("requeue of entry {id} through {base} answered {other}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(500 + dice.range((0, 1_000)))).await;
    }
}

// ---------------------------------------------------------------------------------------
// Reading the inbox and the journal
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Row {
    id: i64,
    route: String,
    dedup_key: String,
    correlation_key: Option<String>,
    message_id: String,
    status: String,
    last_error: Option<String>,
}

type RowTuple = (i64, String, String, Option<String>, String, String, Option<String>);

async fn all_rows(pool: &sqlx::PgPool) -> Vec<Row> {
    let rows: Vec<RowTuple> = sqlx::query_as(
        "SELECT id, route, dedup_key, correlation_key, message_id, status, last_error FROM inbox_entry ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .expect("read the inbox");
    rows.into_iter()
        .map(|(id, route, dedup_key, correlation_key, message_id, status, last_error)| Row {
            id,
            route,
            dedup_key,
            correlation_key,
            message_id,
            status,
            last_error,
        })
        .collect()
}

/// The route of an idempotency key (= dedup key) the target saw.
fn route_of(idempotency_key: &str) -> &'static str {
    if idempotency_key.starts_with("push-") { PUSH_ROUTE } else { PULL_ROUTE }
}

/// The row behind an idempotency key the target saw; panics if there is none.
fn entry_of<'a>(by_dedup: &HashMap<(&str, &str), &'a Row>, idempotency_key: &str) -> &'a Row {
    by_dedup
        .get(&(route_of(idempotency_key), idempotency_key))
        .copied()
        .unwrap_or_else(|| panic!("the target got idempotency key {idempotency_key:?}, which has no row"))
}

/// (rows, DONE rows); `None` while the database does not answer.
async fn progress(pool: &sqlx::PgPool) -> Option<(i64, i64)> {
    sqlx::query_as("SELECT COUNT(*), COUNT(*) FILTER (WHERE status = 'DONE') FROM inbox_entry")
        .fetch_one(pool)
        .await
        .ok()
}

async fn pulled_rows(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM inbox_entry WHERE route = $1")
        .bind(PULL_ROUTE)
        .fetch_one(pool)
        .await
        .unwrap_or(0)
}

/// The pull route's message ids in the journal, in order. Several processes append to
/// it and any may be killed mid-write: a torn fragment left without its newline is then
/// glued to the front of the next process's line, and each line's check tells such a
/// line from a whole one (`ack_journal::parse`). Returns the ids and how many torn
/// lines were dropped.
fn journal_ids(text: &str) -> (Vec<String>, usize) {
    let journal = inlet::source::ack_journal::parse(text);
    let ids = journal.acks.into_iter().filter(|(route, _)| route == PULL_ROUTE).map(|(_, id)| id).collect();
    (ids, journal.torn)
}

/// Length of the journal's complete lines now.
fn journal_complete_len(path: &Path) -> usize {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.rfind('\n').map_or(0, |end| end + 1)
}

/// Number of the message behind a pull dedup key (`evt-{i}`).
fn pull_number(dedup_key: &str) -> usize {
    dedup_key
        .strip_prefix("evt-")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a pulled row with a dedup key that was never published: {dedup_key:?}"))
}

// ---------------------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------------------

/// A kill, for the lease-recovery figure: when, and which entries the killed
/// incarnation held.
struct Kill {
    at: Instant,
    held: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_keeps_every_invariant() {
    let started = Instant::now();
    let plan = Plan::from_env();
    println!(
        "chaos: mode {} seed {} ({} kills, {} messages pulled + {} pushed, {} + {} keys); rerun with \
         INLET_CHAOS={} INLET_CHAOS_SEED={} INLET_CHAOS_KILLS={} INLET_CHAOS_MESSAGES={}",
        plan.mode,
        plan.seed,
        plan.kills,
        plan.pull,
        plan.push,
        plan.pull_keys,
        plan.push_keys,
        plan.mode,
        plan.seed,
        plan.kills,
        plan.pull + plan.push
    );
    let dice = Dice::new(plan.seed, 0);

    let cluster = blocking(PgCluster::init);
    cluster.create_database("chaos").await;
    let store = cluster.url("chaos");
    let mut emulator = PubSubEmulator::start(PROJECT).await;
    create_topology(&emulator).await;
    let target = Arc::new(RecordingTarget::start().await);
    // An engine takes a moment to act: deliveries are in flight long enough for the
    // kills to catch some.
    target.set_delay(BASE_DELAY.0, BASE_DELAY.1);
    let proxy = Arc::new(TcpProxy::start(&target.addr()).await);

    let mut poison = HashMap::new();
    for key in (0..plan.pull).map(pull_id).chain((0..plan.push).map(push_id)) {
        let n = plan.refusals(&key);
        if n > 0 {
            target.refuse(&key, n);
            poison.insert(key, n);
        }
    }

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("inlet.toml");
    std::fs::write(&config, routing_file(&store, &proxy.addr, PROJECT)).unwrap();
    let journal = dir.path().join("acks.journal");
    let mut fleet = Fleet::start(config, journal.clone(), emulator.host.clone()).await;
    let bases = fleet.bases();
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(4).connect(&store).await.expect("connect");
    println!("chaos: {INSTANCES} instances healthy after {:.1?}", started.elapsed());

    let window = plan.fault_window();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();

    // Loads: publishers of the emulator's first run, pushers, the requeuer.
    let first = plan.first_run();
    let mut publishers = tokio::task::JoinSet::new();
    for p in 0..PUBLISHERS {
        let range = (first * p / PUBLISHERS)..(first * (p + 1) / PUBLISHERS);
        publishers.spawn(publish_spread(emulator.host.clone(), range, plan.pull_keys, window / 3));
    }
    let tally = Arc::new(PushTally::default());
    let mut pushers = tokio::task::JoinSet::new();
    for p in 0..PUSHERS {
        let dice = Dice::new(plan.seed, 1 + p as u64);
        pushers.spawn(push_spread(p, plan.clone(), bases.clone(), dice, Arc::clone(&tally), window));
    }
    let stop_requeues = Arc::new(AtomicBool::new(false));
    let requeues = Arc::new(Requeues::default());
    let requeuer = tokio::spawn(requeue_loop(
        pool.clone(),
        bases.clone(),
        Dice::new(plan.seed, 100),
        Arc::clone(&stop_requeues),
        Arc::clone(&requeues),
    ));

    // The fault schedule: kills at random moments, the other faults between them.
    let mut kills: Vec<Kill> = Vec::new();
    let mut outage_task = None;
    let mut split_at = None;
    let mut second_publishers = tokio::task::JoinSet::new();
    let (target_at, pg_at, emulator_at) = (plan.kills / 6, plan.kills / 3, plan.kills / 2);
    for k in 0..plan.kills {
        if k == target_at {
            // Down for a while, then slow (at most 1.5 s, well below the 4 s timeout),
            // then well again; kills go on meanwhile. The margin matters: a request
            // the target is still answering when Inlet's timeout gives up on it stays
            // in flight at the target, and the retry 200 ms later would count as a
            // second delivery in flight for the key. On a loaded machine the test's
            // own runtime can answer a 1.5 s request more than half a second late.
            let (down, slow) = (dice.range((4_000, 7_000)), dice.range((6_000, 10_000)));
            let (proxy, target) = (Arc::clone(&proxy), Arc::clone(&target));
            outage_task = Some(tokio::spawn(async move {
                proxy.set_up(false);
                tokio::time::sleep(Duration::from_millis(down)).await;
                proxy.set_up(true);
                target.set_delay(Duration::from_millis(100), Duration::from_millis(1_500));
                tokio::time::sleep(Duration::from_millis(slow)).await;
                target.set_delay(BASE_DELAY.0, BASE_DELAY.1);
                (down, slow)
            }));
            println!("chaos: target down for {down} ms, then slow for {slow} ms");
        }
        if k == pg_at {
            let down = dice.range((3_000, 6_000));
            println!("chaos: PostgreSQL crashed (stop -m immediate) for {down} ms");
            blocking(|| cluster.crash());
            tokio::time::sleep(Duration::from_millis(down)).await;
            blocking(|| cluster.start());
            wait_until("PostgreSQL back after the crash", Duration::from_secs(120), || async {
                progress(&pool).await.is_some()
            })
            .await;
        }
        if k == emulator_at {
            split_at =
                Some(restart_emulator(&mut emulator, &mut publishers, &fleet, &http, &pool, &journal, first).await);
            println!("chaos: emulator restarted after {:.1?}", started.elapsed());
            let rest = plan.pull - first;
            for p in 0..PUBLISHERS - 1 {
                let range = (first + rest * p / (PUBLISHERS - 1))..(first + rest * (p + 1) / (PUBLISHERS - 1));
                second_publishers.spawn(publish_spread(emulator.host.clone(), range, plan.pull_keys, window / 3));
            }
        }
        tokio::time::sleep(Duration::from_millis(dice.range(plan.kill_gap_ms))).await;
        let slot = dice.index(INSTANCES);
        let (name, at) = fleet.kill(slot);
        // What it held stays IN_PROGRESS under its name until the lease runs out.
        let held: Vec<String> =
            sqlx::query_scalar("SELECT dedup_key FROM inbox_entry WHERE status = 'IN_PROGRESS' AND lease_owner = $1")
                .bind(&name)
                .fetch_all(&pool)
                .await
                .expect("read the killed instance's leases");
        fleet.restart(slot).await;
        println!(
            "chaos: kill {} of {}: {name} at {:.1?}, holding {}",
            k + 1,
            plan.kills,
            started.elapsed(),
            held.len()
        );
        kills.push(Kill { at, held });
    }
    if split_at.is_none() {
        // Fewer kills than the schedule needs to reach the restart: do it now.
        split_at = Some(restart_emulator(&mut emulator, &mut publishers, &fleet, &http, &pool, &journal, first).await);
        let range = first..plan.pull;
        second_publishers.spawn(publish_spread(emulator.host.clone(), range, plan.pull_keys, Duration::ZERO));
    }
    let split_at = split_at.expect("the emulator was restarted");
    join_all(&mut publishers).await;
    join_all(&mut second_publishers).await;
    join_all(&mut pushers).await;
    let (down, slow) = outage_task.expect("the target outage ran").await.expect("the outage task");
    let published = plan.pull;
    let expected = (published + plan.push) as i64;
    println!("chaos: faults over after {:.1?}; waiting for the inbox to settle", started.elapsed());

    // The end: every expected row DONE, or every stored row settled and nothing
    // changed for QUIET. The emulator hands stranded messages back in bursts, some
    // every few tens of seconds for many minutes (seen here), so quiet may never come:
    // from LAST_CALL after the faults, every stored row settled is enough. The
    // emulator is then stopped, with every stream session, so nothing more arrives,
    // and what those sessions stored is worked off. Generous deadlines: a long run on
    // two loaded cores works off a large backlog here.
    let deadline = Instant::now() + Duration::from_secs(600) + Duration::from_millis(20) * expected as u32;
    let last_call = Instant::now() + LAST_CALL;
    let (mut last, mut since) = ((-1, -1), Instant::now());
    loop {
        if let Some(now) = progress(&pool).await {
            if now.1 >= expected {
                break;
            }
            if now != last {
                (last, since) = (now, Instant::now());
            } else if now.0 == now.1 && (since.elapsed() >= QUIET || Instant::now() >= last_call) {
                break;
            }
        }
        assert!(Instant::now() < deadline, "the inbox never settled: {last:?} (rows, DONE) of {expected} expected");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    end_sessions(&mut emulator, &fleet, &http).await;
    wait_until("every stored row DONE once the emulator is gone", Duration::from_secs(600), || async {
        progress(&pool).await.is_some_and(|(rows, done)| rows == done)
    })
    .await;
    stop_requeues.store(true, Ordering::SeqCst);
    requeuer.await.expect("the requeuer");

    // ---- Checks ----
    let rows = all_rows(&pool).await;
    let by_dedup: HashMap<(&str, &str), &Row> =
        rows.iter().map(|r| ((r.route.as_str(), r.dedup_key.as_str()), r)).collect();
    let pushed: Vec<&Row> = rows.iter().filter(|r| r.route == PUSH_ROUTE).collect();
    let pulled: Vec<&Row> = rows.iter().filter(|r| r.route == PULL_ROUTE).collect();
    assert_eq!(pushed.len() + pulled.len(), rows.len(), "rows of a route nobody configured");

    // Every pushed message exactly one row (pushes are retried until answered 200).
    let push_keys: HashSet<&str> = pushed.iter().map(|r| r.dedup_key.as_str()).collect();
    let missing: Vec<String> =
        (0..plan.push).map(push_id).filter(|k| !push_keys.contains(k.as_str())).take(20).collect();
    assert!(missing.is_empty(), "pushed messages answered 200 without a row: {missing:?}");
    assert_eq!(pushed.len(), plan.push, "one row per pushed message (more rows than pushes)");
    let push_messages: HashSet<&str> = pushed.iter().map(|r| r.message_id.as_str()).collect();
    assert_eq!(push_messages.len(), plan.push, "one row per push message id");

    // Every acked message id exactly one row, per emulator run.
    let text = std::fs::read_to_string(&journal).expect("read the ack journal");
    let (before, torn_before) = journal_ids(&text[..split_at]);
    let (after, torn_after) = journal_ids(&text[split_at..]);
    let mut stored_ids: [HashMap<&str, usize>; 2] = Default::default();
    for r in &pulled {
        let i = pull_number(&r.dedup_key);
        assert!(i < published, "a pulled row for message {i}, never published");
        let run = usize::from(i >= first);
        *stored_ids[run].entry(r.message_id.as_str()).or_default() += 1;
    }
    for (run, acked) in [&before, &after].into_iter().enumerate() {
        let missing: Vec<&String> =
            acked.iter().filter(|id| !stored_ids[run].contains_key(id.as_str())).take(20).collect();
        assert!(
            missing.is_empty(),
            "emulator run {}: message ids acked without a row (of {} acks): {missing:?}",
            run + 1,
            acked.len()
        );
        let twice: Vec<(&&str, &usize)> = stored_ids[run].iter().filter(|(_, n)| **n > 1).take(20).collect();
        assert!(twice.is_empty(), "emulator run {}: message ids with more than one row: {twice:?}", run + 1);
    }
    assert!(
        !before.is_empty() && !after.is_empty(),
        "acks journalled in both emulator runs ({} and {})",
        before.len(),
        after.len()
    );
    let stored = [stored_ids[0].len(), stored_ids[1].len()];
    assert!(stored[1] > 0, "nothing was stored after the emulator restart: the pull source did not reconnect");

    // Every row DONE.
    let unsettled: Vec<String> = rows
        .iter()
        .filter(|r| r.status != "DONE")
        .take(20)
        .map(|r| format!("{} {} {}: {} ({:?})", r.id, r.route, r.dedup_key, r.status, r.last_error))
        .collect();
    assert!(unsettled.is_empty(), "rows not DONE at the end: {unsettled:?}");
    // Parked rows were the scenario's, each with its reason.
    let parked = requeues.parked.lock().unwrap().clone();
    let reasonless: Vec<&i64> =
        parked.iter().filter(|(_, reason)| reason.trim().is_empty()).map(|(id, _)| id).collect();
    assert!(reasonless.is_empty(), "entries parked without a reason: {reasonless:?}");
    assert!(
        !parked.is_empty() && requeues.done.load(Ordering::Relaxed) > 0,
        "the scenario parked and requeued entries"
    );

    // At the target: per key one at a time, entry ids never going back, each
    // idempotency key taking effect once, for exactly the key's rows in entry order.
    assert_eq!(target.overlaps(), Vec::<String>::new(), "keys with two deliveries in flight at once");
    assert_eq!(target.max_in_flight_per_key(), 1, "at most one delivery in flight per key");
    let requests = target.requests();
    let mut last_id: HashMap<&str, i64> = HashMap::new();
    let mut refused: HashMap<&str, usize> = HashMap::new();
    for req in &requests {
        let row = entry_of(&by_dedup, &req.idempotency_key);
        assert_eq!(row.correlation_key.as_deref(), Some(req.key.as_str()), "the target's key is the row's key");
        let prev = last_id.entry(req.key.as_str()).or_insert(row.id);
        assert!(
            row.id >= *prev,
            "key {}: entry {} ({}) delivered after entry {} — an entry delivered before an older one of its key settled",
            req.key,
            row.id,
            row.dedup_key,
            prev
        );
        *prev = row.id;
        if req.status == 422 {
            *refused.entry(req.idempotency_key.as_str()).or_default() += 1;
        }
    }
    let mut rows_per_key: HashMap<&str, Vec<i64>> = HashMap::new();
    for r in &rows {
        rows_per_key.entry(r.correlation_key.as_deref().unwrap_or("")).or_default().push(r.id);
    }
    let effects = target.effects();
    for (key, ids) in &rows_per_key {
        let took: Vec<i64> =
            effects.get(*key).map(|e| e.iter().map(|k| entry_of(&by_dedup, k).id).collect()).unwrap_or_default();
        assert_eq!(
            &took, ids,
            "key {key}: the effects at the target (as entry ids, in effect order) are not the key's rows in order, once each"
        );
    }
    assert_eq!(effects.len(), rows_per_key.len(), "effects for keys without rows");
    for (key, n) in &poison {
        if by_dedup.contains_key(&(route_of(key), key.as_str())) {
            assert_eq!(
                refused.get(key.as_str()).copied().unwrap_or(0),
                *n,
                "{key}: refusals answered before it took effect"
            );
        }
    }

    // ---- Figures ----
    let replays = requests.iter().filter(|r| r.status == 200).count();
    let mut recovery = Duration::ZERO;
    let mut recovered = 0;
    for kill in &kills {
        for key in &kill.held {
            if let Some(first_after) = requests.iter().find(|r| &r.idempotency_key == key && r.arrived > kill.at) {
                recovery = recovery.max(first_after.arrived - kill.at);
                recovered += 1;
            }
        }
    }
    let acked_distinct = [before.iter().collect::<HashSet<_>>().len(), after.iter().collect::<HashSet<_>>().len()];
    println!("chaos figures (mode {}, seed {}):", plan.mode, plan.seed);
    println!("  published to the emulator: {published} ({first} before its restart, {} after)", published - first);
    println!(
        "  pushed: {} (re-sent {} times; {} answered duplicate)",
        plan.push,
        tally.retries.load(Ordering::Relaxed),
        tally.duplicates.load(Ordering::Relaxed)
    );
    println!(
        "  stored: {} pulled ({} + {}), {} pushed; stranded by the emulator: {} ({} + {})",
        pulled.len(),
        stored[0],
        stored[1],
        pushed.len(),
        published - pulled.len(),
        first - stored[0],
        published - first - stored[1]
    );
    println!(
        "  acks journalled: {} ({} distinct; redeliveries absorbed as duplicates: {}); torn journal fragments: {}",
        before.len() + after.len(),
        acked_distinct[0] + acked_distinct[1],
        before.len() + after.len() - acked_distinct[0] - acked_distinct[1],
        torn_before + torn_after
    );
    println!(
        "  target: {} requests, {} effects, {} replays (redelivered after the effect), {} refusals",
        requests.len(),
        effects.values().map(Vec::len).sum::<usize>(),
        replays,
        refused.values().sum::<usize>()
    );
    println!(
        "  kills: {}; max lease recovery (kill → a held entry delivered again): {:.1?} over {recovered} held entries",
        kills.len(),
        recovery
    );
    println!("  PostgreSQL crash: 1; emulator restart: 1; target down {down} ms then slow {slow} ms");
    println!(
        "  parked (seen): {}; requeues through the API: {} (and {} refused or unanswered, retried)",
        parked.len(),
        requeues.done.load(Ordering::Relaxed),
        requeues.refused.load(Ordering::Relaxed)
    );
    println!("  duration: {:.1?}", started.elapsed());
    drop(fleet);
}

async fn create_topology(emulator: &PubSubEmulator) {
    emulator.create_topic(TOPIC).await;
    // Unordered: an ordered subscription strands far more (pubsub-client-notes §8).
    emulator.create_subscription(TOPIC, SUBSCRIPTION, false).await;
}

async fn join_all(set: &mut tokio::task::JoinSet<()>) {
    while let Some(joined) = set.join_next().await {
        if let Err(e) = joined {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

/// Kills the emulator and waits until every live instance's stream session has ended
/// (its reconnect counter moved: the session's writer has stored, journalled and
/// acked or nacked all it held). From then on no pulled row can appear and no line of
/// that emulator run can be added to the journal.
async fn end_sessions(emulator: &mut PubSubEmulator, fleet: &Fleet, http: &reqwest::Client) {
    blocking(|| emulator.kill());
    let reconnects =
        |http: reqwest::Client| async move { fleet.metric(&http, "inlet_pubsub_reconnects_total", PULL_ROUTE).await };
    let base = wait_for("the reconnect counters", Duration::from_secs(60), || reconnects(http.clone())).await;
    wait_until("every instance's stream session to end", Duration::from_secs(180), || async {
        reconnects(http.clone()).await.is_some_and(|now| now.iter().zip(&base).all(|(n, b)| n > b))
    })
    .await;
}

/// The emulator restart: the first run's publishers finish, the inbox gets a chance to
/// take what was published, the emulator is killed, and every live instance's stream
/// session ends (its reconnect counter moves: the session's writer has stored and
/// journalled all it held), so no line of the first run can follow in the journal.
/// Then it starts again, empty, and the topology is recreated. Returns where the
/// second run's journal begins.
async fn restart_emulator(
    emulator: &mut PubSubEmulator,
    publishers: &mut tokio::task::JoinSet<()>,
    fleet: &Fleet,
    http: &reqwest::Client,
    pool: &sqlx::PgPool,
    journal: &Path,
    first_run: usize,
) -> usize {
    join_all(publishers).await;
    // Let the pull route catch up (not to the last message: some are stranded).
    let (mut last, mut since) = (-1, Instant::now());
    let deadline = Instant::now() + Duration::from_secs(180) + Duration::from_millis(5) * first_run as u32;
    loop {
        let now = pulled_rows(pool).await;
        if now != last {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() > Duration::from_secs(5) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    end_sessions(emulator, fleet, http).await;
    let split = journal_complete_len(journal);
    emulator.restart().await;
    create_topology(emulator).await;
    split
}
