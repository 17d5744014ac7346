//! Output rules and poison messages: a plugin answer that breaks a rule, or
//! a row the database refuses for what it holds, parks that one entry with a reason
//! naming the rule (or the database's error) and never stalls the route — on SQLite
//! and PostgreSQL alike, through push and through the pull source against the real
//! emulator. The answers come from the real compiled `unruly` plugin, chosen by the
//! payload; the target is a real HTTP server that records every request it sees.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use inlet::app::{self, Running};
use inlet::config::Config;
use inlet::inbox::{Entry, ListFilter, Status, Store};
use inlet::ingest::Incoming;
use inlet_testkit::emulator::PubSubEmulator;
use inlet_testkit::paths::plugin_path;
use inlet_testkit::pg::TestPg;
use inlet_testkit::push::{post_push, push_envelope};
use inlet_testkit::py_pubsub::assert_drained;
use inlet_testkit::wait::{wait_for, wait_until};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);
const KIB_64: usize = 64 * 1024;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Backend {
    Sqlite,
    Postgres,
}

// ---------------------------------------------------------------------------------------
// The target: records every request, whatever its method or path
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Seen {
    method: String,
    /// Path and query as received.
    uri: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// A real HTTP server on 127.0.0.1 that answers 204 to anything and remembers it.
struct Recorder {
    addr: std::net::SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    server: tokio::task::JoinHandle<()>,
}

impl Recorder {
    async fn start() -> Recorder {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let record = Arc::clone(&seen);
        let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
            let record = Arc::clone(&record);
            async move {
                let (parts, body) = req.into_parts();
                let body = axum::body::to_bytes(body, usize::MAX).await.map(|b| b.to_vec()).unwrap_or_default();
                let headers = parts
                    .headers
                    .iter()
                    .map(|(k, v)| (k.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
                    .collect();
                record.lock().unwrap().push(Seen {
                    method: parts.method.to_string(),
                    uri: parts.uri.to_string(),
                    headers,
                    body,
                });
                axum::http::StatusCode::NO_CONTENT
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the recorder");
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, app).await.expect("recorder server") });
        Recorder { addr, seen, server }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.server.abort();
    }
}

// ---------------------------------------------------------------------------------------
// Inlet on a store
// ---------------------------------------------------------------------------------------

struct Inlet {
    running: Option<Running>,
    base: String,
    store: Arc<dyn Store>,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
    _pg: Option<TestPg>,
}

/// A `[[route]]` for the unruly plugin; `source` and `target` are inline tables,
/// `extra` more lines of the route.
fn route(name: &str, source: &str, target: &str, extra: &str) -> String {
    format!(
        "[[route]]\nname = \"{name}\"\nplugin = \"{}\"\nsource = {source}\ntarget = {target}\n{extra}\n",
        plugin_path("unruly").display()
    )
}

fn push_route(name: &str, target_url: &str, extra: &str) -> String {
    route(
        name,
        "{ kind = \"push\" }",
        &format!("{{ kind = \"http\", url = \"{target_url}\", timeout = \"2s\" }}"),
        extra,
    )
}

impl Inlet {
    async fn start(backend: Backend, routes: &str, emulator: Option<&PubSubEmulator>) -> Inlet {
        inlet::telemetry::init_logging();
        let dir = tempfile::tempdir().expect("tempdir");
        let (url, pg) = match backend {
            Backend::Sqlite => (format!("sqlite://{}", dir.path().join("inbox.db").display()), None),
            Backend::Postgres => {
                let pg = TestPg::new().await;
                (pg.url.clone(), Some(pg))
            }
        };
        let config_path = dir.path().join("inlet.toml");
        std::fs::write(&config_path, format!("[store]\nurl = \"{url}\"\n\n{routes}")).unwrap();
        let config = Config::load(&config_path).unwrap_or_else(|e| panic!("test config is invalid:\n{e}"));
        let mut options = app::Options {
            poll: Duration::from_millis(20),
            listen: Some("127.0.0.1:0".parse().unwrap()),
            ..app::Options::default()
        };
        if let Some(emulator) = emulator {
            options.pubsub = inlet::pubsub_client::Connection::emulator(&emulator.host);
        }
        let running = app::start(&config, options).await.expect("inlet starts");
        Inlet {
            base: format!("http://{}", running.addr),
            store: Arc::clone(&running.shared.store),
            running: Some(running),
            http: reqwest::Client::new(),
            _dir: dir,
            _pg: pg,
        }
    }

    fn running(&self) -> &Running {
        self.running.as_ref().expect("running")
    }

    async fn push(&self, route: &str, payload: &serde_json::Value, message_id: &str) -> u16 {
        self.push_envelope(route, &push_envelope(payload.to_string().as_bytes(), &[], message_id)).await
    }

    async fn push_envelope(&self, route: &str, envelope: &serde_json::Value) -> u16 {
        post_push(&self.http, &self.base, route, envelope).await
    }

    async fn entries(&self, route: &str) -> Vec<Entry> {
        self.store.list(&ListFilter { route: Some(route.into()), limit: 10_000, ..Default::default() }).await.unwrap()
    }

    /// The one entry of a broker message, once it exists and is settled (not OPEN or
    /// IN_PROGRESS).
    async fn settled(&self, route: &str, message_id: &str) -> Entry {
        wait_for(&format!("the entry of message {message_id} to be settled"), WAIT, || async move {
            let entries = self.entries(route).await;
            let mine: Vec<Entry> = entries.into_iter().filter(|e| e.message_id == message_id).collect();
            assert!(mine.len() <= 1, "message {message_id} stored more than once: {mine:?}");
            mine.into_iter().next().filter(|e| !matches!(e.status, Status::Open | Status::InProgress))
        })
        .await
    }

    fn metrics(&self) -> String {
        self.running().shared.metrics.render()
    }

    async fn stop(mut self) {
        if let Some(r) = self.running.take() {
            r.stop().await;
        }
    }
}

/// The value of one metric sample (name and labels as printed), 0 if absent.
fn sample(metrics: &str, name: &str, labels: &[&str]) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Asserts a message ended PARKED with its raw payload, no decoded event, the message
/// id as dedup key, and a last error that names `rule`.
fn assert_parked_by(entry: &Entry, payload: &[u8], rule: &str) {
    let error = entry.last_error.as_deref().unwrap_or_default();
    assert_eq!(entry.status, Status::Parked, "{rule}: {error}");
    assert!(error.contains(rule), "the reason names `{rule}`: {error}");
    assert_eq!(entry.raw_data, payload, "{rule}: the raw payload is kept");
    assert_eq!(entry.correlation_key, None, "{rule}: no key is stored");
    assert!(entry.decoded().is_none(), "{rule}: no decoded event is stored");
    assert!(entry.dedup_key.len() <= 1024, "{rule}: the dedup key falls back to the message id");
}

// ---------------------------------------------------------------------------------------
// Decode answers: push, both stores
// ---------------------------------------------------------------------------------------

/// Decode answers that break a rule, each with the rule it breaks.
fn bad_decodes() -> Vec<(serde_json::Value, &'static str)> {
    vec![
        (json!({ "key": "k", "key_bytes": KIB_64 }), "correlation-key.max-bytes"),
        (json!({ "key": "k-dedup", "dedup": "d", "dedup_bytes": KIB_64 }), "dedup-key.max-bytes"),
        (json!({ "key": "a\u{0}b" }), "correlation-key.control-char"),
        (json!({ "key": "k-nul", "dedup": "d\u{0}" }), "dedup-key.control-char"),
        (json!({ "key": "" }), "correlation-key.empty"),
        (json!({ "key": "k-type", "event_type": "t".repeat(300) }), "event-type.max-bytes"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_answers_that_break_a_rule_are_parked_naming_it_sqlite() {
    decode_answers_that_break_a_rule_are_parked_naming_it(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_answers_that_break_a_rule_are_parked_naming_it_postgres() {
    decode_answers_that_break_a_rule_are_parked_naming_it(Backend::Postgres).await;
}

async fn decode_answers_that_break_a_rule_are_parked_naming_it(backend: Backend) {
    let target = Recorder::start().await;
    let inlet = Inlet::start(backend, &push_route("unruly", &target.url(), ""), None).await;
    for (i, (payload, rule)) in bad_decodes().iter().enumerate() {
        let id = format!("bad-{i}");
        assert_eq!(inlet.push("unruly", payload, &id).await, 200, "{rule}: the push is acked");
        let entry = inlet.settled("unruly", &id).await;
        assert_parked_by(&entry, payload.to_string().as_bytes(), rule);
        assert_eq!(entry.dedup_key, id, "{rule}");
        // The broker redelivers: the same row, acked again.
        assert_eq!(inlet.push("unruly", payload, &id).await, 200, "{rule}: a redelivery is acked");
    }
    // The route goes on: a good message behind them is delivered.
    let good = json!({ "key": "k", "dedup": "good-1" });
    assert_eq!(inlet.push("unruly", &good, "good").await, 200);
    let entry = inlet.settled("unruly", "good").await;
    assert_eq!((entry.status, entry.dedup_key.as_str()), (Status::Done, "good-1"));
    assert_eq!(target.seen().len(), 1, "only the good message reached the target: {:?}", target.seen());
    assert_eq!(inlet.entries("unruly").await.len(), bad_decodes().len() + 1, "one row per message");

    let metrics = inlet.metrics();
    for (_, rule) in bad_decodes() {
        let n =
            sample(&metrics, "inlet_plugin_output_refused_total", &["call=\"decode\"", &format!("rule=\"{rule}\"")]);
        assert!(n >= 1.0, "{rule} is counted:\n{metrics}");
    }
    inlet.stop().await;
}

/// An empty correlation key is legitimate on an unordered route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_key_is_accepted_on_an_unordered_route() {
    let target = Recorder::start().await;
    let inlet = Inlet::start(Backend::Sqlite, &push_route("loose", &target.url(), "ordering = \"none\""), None).await;
    assert_eq!(inlet.push("loose", &json!({ "key": "" }), "m-1").await, 200);
    let entry = inlet.settled("loose", "m-1").await;
    assert_eq!((entry.status, entry.correlation_key.as_deref()), (Status::Done, Some("")));
    inlet.stop().await;
}

// ---------------------------------------------------------------------------------------
// Render answers: both stores
// ---------------------------------------------------------------------------------------

/// Rendered requests that break a rule (for the step given), each with the rule.
fn bad_renders() -> Vec<(serde_json::Value, &'static str)> {
    vec![
        (json!({ "headers": [["x-note", "a\r\nx-injected: 1"]] }), "request.header-value"),
        (json!({ "headers": [["x-note\r\nx-injected", "1"]] }), "request.header-name"),
        (json!({ "headers": [["Host", "team-b.example"]] }), "request.header-reserved"),
        (json!({ "headers": [["Idempotency-Key", "another"]] }), "request.header-reserved"),
        (json!({ "headers": [["authorization", "Bearer stolen"]] }), "request.header-reserved"),
        (json!({ "headers": [["Transfer-Encoding", "chunked"]] }), "request.header-reserved"),
        (json!({ "method": "TRACE" }), "request.method"),
        (json!({ "method": "post" }), "request.method"),
        (json!({ "path": "/../team-b/events" }), "request.path.dot-segment"),
        (json!({ "path": "/%2e%2e/team-b/events" }), "request.path.dot-segment"),
        (json!({ "path": "/%2E%2e%2Fteam-b" }), "request.path.dot-segment"),
        (json!({ "path": "/..\\team-b" }), "request.path.backslash"),
        // Path parameters and dot segments as the servers behind Camunda read them:
        // `..;` is `..` to Tomcat and Spring.
        (json!({ "path": "/b/..;/admin/x" }), "request.path.dot-segment"),
        (json!({ "path": "/..;/team-b/events" }), "request.path.dot-segment"),
        (json!({ "path": "/%2e%2e;/team-b" }), "request.path.dot-segment"),
        (json!({ "path": "/%2E%2e%3b/team-b" }), "request.path.dot-segment"),
        (json!({ "path": "/.%2e/team-b" }), "request.path.dot-segment"),
        (json!({ "path": "/%252e%252e%253b/team-b" }), "request.path.dot-segment"),
        (json!({ "path": "/./team-b" }), "request.path.dot-segment"),
        (json!({ "path": "/events/.." }), "request.path.dot-segment"),
        (json!({ "path": "/b%5c..%5cteam-b" }), "request.path.dot-segment"),
        (json!({ "path": "/events;jsessionid=1" }), "request.path.parameter"),
        (json!({ "path": "/events%3b" }), "request.path.parameter"),
        (json!({ "path": "//evil.example/x" }), "request.path.authority"),
        (json!({ "path": "http://evil.example/x" }), "request.path.relative"),
        (json!({ "path": "/a\nb" }), "request.path.bytes"),
        // A multi-step exchange: the first request is fine, the next one is not.
        (json!({ "next": { "path": "/../team-b/trigger" } }), "request.path.dot-segment"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn render_answers_that_break_a_rule_are_parked_and_never_sent_sqlite() {
    render_answers_that_break_a_rule_are_parked_and_never_sent(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn render_answers_that_break_a_rule_are_parked_and_never_sent_postgres() {
    render_answers_that_break_a_rule_are_parked_and_never_sent(Backend::Postgres).await;
}

async fn render_answers_that_break_a_rule_are_parked_and_never_sent(backend: Backend) {
    let target = Recorder::start().await;
    // A base path the plugin must not leave, and a configured header it must not replace.
    let url = format!("{}/team-a", target.url());
    let http = format!(
        "{{ kind = \"http\", url = \"{url}\", timeout = \"2s\", headers = {{ Authorization = \"Bearer s3cret\" }} }}"
    );
    let inlet = Inlet::start(backend, &route("unruly", "{ kind = \"push\" }", &http, ""), None).await;
    let cases = bad_renders();
    for (i, (orders, _)) in cases.iter().enumerate() {
        // Each case on a key of its own, so a parked entry holds back nothing else.
        let mut payload = orders.clone();
        payload["key"] = json!(format!("k-{i}"));
        assert_eq!(inlet.push("unruly", &payload, &format!("bad-{i}")).await, 200);
    }
    assert_eq!(inlet.push("unruly", &json!({ "key": "good" }), "good").await, 200);
    for (i, (_, rule)) in cases.iter().enumerate() {
        let entry = inlet.settled("unruly", &format!("bad-{i}")).await;
        let error = entry.last_error.as_deref().unwrap_or_default();
        assert_eq!(entry.status, Status::Parked, "case {i} ({rule}): {error}");
        assert!(error.contains(rule) && error.contains("the request was not sent"), "case {i} names `{rule}`: {error}");
        assert_eq!(entry.attempts, 1, "case {i} ({rule}): parked at once, never retried");
    }
    assert!(
        inlet.entries("unruly").await.iter().any(|e| e.last_error.as_deref().unwrap_or("").contains("step 2")),
        "the refused next step is named"
    );
    assert_eq!(inlet.settled("unruly", "good").await.status, Status::Done);

    // The target saw the good request and the first step of the exchange, nothing else.
    let seen = target.seen();
    assert_eq!(seen.len(), 2, "only valid requests reached the target: {seen:#?}");
    for s in &seen {
        assert_eq!((s.method.as_str(), s.uri.as_str()), ("POST", "/team-a/events"), "{s:?}");
        let header =
            |name: &str| s.headers.iter().filter(|(k, _)| k == name).map(|(_, v)| v.as_str()).collect::<Vec<_>>();
        assert_eq!(header("authorization"), ["Bearer s3cret"], "{s:?}");
        assert_eq!(header("idempotency-key").len(), 1, "{s:?}");
        assert!(header("x-injected").is_empty() && header("x-note").is_empty(), "{s:?}");
        assert!(!s.body.is_empty());
    }
    let metrics = inlet.metrics();
    assert!(sample(&metrics, "inlet_plugin_output_refused_total", &["call=\"render\""]) >= 15.0, "{metrics}");
    assert_eq!(sample(&metrics, "inlet_plugin_output_refused_total", &["call=\"classify\""]), 1.0, "{metrics}");
    inlet.stop().await;
}

// ---------------------------------------------------------------------------------------
// The store's own refusal (PostgreSQL), with the rules' key limit raised
// ---------------------------------------------------------------------------------------

/// Limits so high that a 64 KiB key passes the rules and reaches the database.
const RAISED: &str = "limits = { max_key_bytes = 1048576 }";

/// PostgreSQL cannot index a 64 KiB key (SQLSTATE 54000) and cannot hold a NUL in
/// text (22021): each such message is parked with the database's error and acked,
/// and the route goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_postgres_refuses_are_parked_with_the_database_error() {
    let target = Recorder::start().await;
    let inlet = Inlet::start(Backend::Postgres, &push_route("raised", &target.url(), RAISED), None).await;
    let long_key = json!({ "key": "k", "key_bytes": KIB_64 });
    let long_dedup = json!({ "key": "k-dedup", "dedup": "d", "dedup_bytes": KIB_64 });
    for (payload, id) in [(&long_key, "long-key"), (&long_dedup, "long-dedup")] {
        assert_eq!(inlet.push("raised", payload, id).await, 200, "{id}: acked, not 503");
        let entry = inlet.settled("raised", id).await;
        assert_parked_by(&entry, payload.to_string().as_bytes(), "54000");
        assert!(entry.last_error.as_deref().unwrap().contains("the inbox refused the message"), "{entry:?}");
        assert_eq!(entry.dedup_key, id);
        assert_eq!(inlet.push("raised", payload, id).await, 200, "{id}: a redelivery is acked too");
    }
    // A requeue decodes the parked message again; the database refuses that outcome
    // too, and the entry is parked again at once instead of retried forever.
    let parked = inlet.settled("raised", "long-key").await;
    let now = inlet.running().shared.clock.now();
    assert!(inlet.store.requeue(parked.id, now).await.unwrap(), "requeued");
    let again = wait_for("the requeued entry parked again", WAIT, || async {
        let e = inlet.store.get(parked.id).await.unwrap().expect("the entry");
        (e.status == Status::Parked && e.last_error.as_deref().unwrap_or("").contains("outcome")).then_some(e)
    })
    .await;
    let error = again.last_error.as_deref().unwrap();
    assert!(error.contains("the inbox refused the outcome") && error.contains("54000"), "{error}");
    assert_eq!(again.correlation_key, None, "the long key was not stored");
    // A message id with a NUL (a push sender may send anything): PostgreSQL refuses
    // the text; the row is kept with the id escaped and a digest as dedup key.
    let odd = json!({ "key": "k-odd" });
    let envelope = push_envelope(odd.to_string().as_bytes(), &[], "m\u{0}1");
    assert_eq!(inlet.push_envelope("raised", &envelope).await, 200);
    let entry = inlet.settled("raised", "m\\u{0}1").await;
    assert_parked_by(&entry, odd.to_string().as_bytes(), "22021");
    assert!(entry.dedup_key.starts_with("message-id-sha256:"), "{entry:?}");

    assert_eq!(inlet.push("raised", &json!({ "key": "k-good" }), "good").await, 200);
    assert_eq!(inlet.settled("raised", "good").await.status, Status::Done);
    assert_eq!(target.seen().len(), 1, "only the good message was delivered");
    let metrics = inlet.metrics();
    // Three messages refused; a redelivery may be refused again or (long correlation
    // key) be absorbed by the dedup key before the database looks at the long key.
    let refused = sample(&metrics, "inlet_store_refused_total", &["route=\"raised\""]);
    assert!((3.0..=5.0).contains(&refused), "{refused}:\n{metrics}");
    assert_eq!(sample(&metrics, "inlet_ingest_failures_total", &[]), 0.0, "nothing was nacked:\n{metrics}");
    inlet.stop().await;
}

fn incoming(payload: &serde_json::Value, message_id: &str) -> Incoming {
    Incoming {
        data: payload.to_string().into_bytes(),
        attributes: vec![],
        message_id: message_id.to_string(),
        publish_time: None,
        delivery_attempt: None,
    }
}

/// One batch with poison messages among good ones: the database refuses the
/// transaction, the batch is split until the bad rows are alone, and every message
/// is stored — good ones OPEN (then delivered), bad ones PARKED — in batch order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_poison_messages_stores_the_rest_in_order() {
    let target = Recorder::start().await;
    let inlet = Inlet::start(Backend::Postgres, &push_route("raised", &target.url(), RAISED), None).await;
    let shared = &inlet.running().shared;
    let routes = shared.routes();
    let route = routes.get("raised").expect("the route");
    let good = |i: usize| json!({ "key": format!("k-{i}"), "dedup": format!("good-{i}") });
    let batch = vec![
        incoming(&good(0), "m-0"),
        incoming(&json!({ "key": "k", "key_bytes": KIB_64 }), "m-1"),
        incoming(&good(2), "m-2"),
        incoming(&good(3), "m-3"),
        incoming(&json!({ "key": "k-5", "dedup": "d", "dedup_bytes": KIB_64 }), "m-4"),
        incoming(&good(5), "m-5"),
        incoming(&good(6), "m-6"),
    ];
    let outcomes = shared.ingest.accept_batch(route, batch).await.expect("the batch is stored, not nacked");
    let ids: Vec<i64> = outcomes.iter().map(|o| o.id()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "rows are in batch order: {ids:?}");
    for (i, id) in ids.iter().enumerate() {
        let entry = shared.store.get(*id).await.unwrap().expect("stored");
        assert_eq!(entry.message_id, format!("m-{i}"));
        if i == 1 || i == 4 {
            assert_parked_by(&entry, &entry.raw_data.clone(), "54000");
        } else {
            assert_eq!(entry.dedup_key, format!("good-{i}"));
        }
    }
    for i in [0, 2, 3, 5, 6] {
        assert_eq!(inlet.settled("raised", &format!("m-{i}")).await.status, Status::Done);
    }
    assert_eq!(target.seen().len(), 5, "each good message delivered once");
    // The same batch again (a redelivery): every message a duplicate, nothing new.
    let again = vec![incoming(&good(0), "m-0"), incoming(&json!({ "key": "k", "key_bytes": KIB_64 }), "m-1")];
    let outcomes = shared.ingest.accept_batch(route, again).await.expect("a redelivery is stored");
    assert_eq!(outcomes.iter().map(|o| o.id()).collect::<Vec<_>>(), ids[..2]);
    assert_eq!(inlet.entries("raised").await.len(), 7);
    inlet.stop().await;
}

// ---------------------------------------------------------------------------------------
// The pull source against the emulator
// ---------------------------------------------------------------------------------------

const PROJECT: &str = "inlet-test";
const TOPIC: &str = "unruly";
const SUBSCRIPTION: &str = "inlet";

/// Publishes `payloads` in ONE publish request through the emulator's REST API, so
/// they arrive together and are stored as one batch (or a few).
async fn publish_together(emulator: &PubSubEmulator, payloads: &[serde_json::Value]) {
    let messages: Vec<serde_json::Value> = payloads
        .iter()
        .map(|p| json!({ "data": base64::engine::general_purpose::STANDARD.encode(p.to_string()) }))
        .collect();
    let r = reqwest::Client::new()
        .post(format!("{}/topics/{TOPIC}:publish", emulator.url()))
        .header("content-type", "application/json")
        .body(json!({ "messages": messages }).to_string())
        .send()
        .await
        .expect("publish");
    let status = r.status();
    assert!(status.is_success(), "publish answered {status}: {}", r.text().await.unwrap_or_default());
}

/// Good messages interleaved with every bad decode answer, through the pull source:
/// the bad ones parked naming their rule (or, with the key limit raised on
/// PostgreSQL, the database's error), the good ones stored once and delivered, all
/// acked, nothing nacked, the subscription drained.
async fn pull_batch_with_poison(backend: Backend, limits: &str) {
    let emulator = PubSubEmulator::start(PROJECT).await;
    emulator.create_topic(TOPIC).await;
    emulator.create_subscription(TOPIC, SUBSCRIPTION, false).await;
    let target = Recorder::start().await;
    let source = format!(
        "{{ kind = \"pubsub\", subscription = \"projects/{PROJECT}/subscriptions/{SUBSCRIPTION}\", batch_wait = \"200ms\" }}"
    );
    let http = format!("{{ kind = \"http\", url = \"{}\", timeout = \"2s\" }}", target.url());
    let inlet = Inlet::start(backend, &route("unruly", &source, &http, limits), Some(&emulator)).await;

    let raised = !limits.is_empty();
    let bad: Vec<(serde_json::Value, &str)> = if raised {
        vec![
            (json!({ "key": "k", "key_bytes": KIB_64 }), "54000"),
            (json!({ "key": "k-dedup", "dedup": "d", "dedup_bytes": KIB_64 }), "54000"),
        ]
    } else {
        bad_decodes()
    };
    let mut payloads = Vec::new();
    for (i, (payload, _)) in bad.iter().enumerate() {
        payloads.push(json!({ "key": format!("good-{i}"), "dedup": format!("good-{i}") }));
        payloads.push(payload.clone());
    }
    payloads.push(json!({ "key": "good-last", "dedup": "good-last" }));
    publish_together(&emulator, &payloads).await;

    let total = payloads.len();
    let entries = wait_for(&format!("{total} settled rows"), WAIT, || async {
        let entries = inlet.entries("unruly").await;
        let settled = entries.iter().filter(|e| !matches!(e.status, Status::Open | Status::InProgress)).count();
        (settled == total).then_some(entries)
    })
    .await;
    for (payload, rule) in &bad {
        let raw = payload.to_string().into_bytes();
        let entry = entries.iter().find(|e| e.raw_data == raw).unwrap_or_else(|| panic!("{rule}: stored"));
        assert_parked_by(entry, &raw, rule);
        assert_eq!(entry.dedup_key, entry.message_id, "{rule}");
    }
    let done: Vec<&Entry> = entries.iter().filter(|e| e.status == Status::Done).collect();
    assert_eq!(done.len(), bad.len() + 1, "every good message stored once and delivered: {entries:#?}");
    assert!(done.iter().all(|e| e.dedup_key.starts_with("good-")));
    assert_eq!(target.seen().len(), bad.len() + 1, "each good message delivered once");

    let running = inlet.running();
    wait_until("every message acked", WAIT, || async {
        sample(&running.shared.metrics.render(), "inlet_pubsub_messages_total", &["outcome=\"acked\""]) >= total as f64
    })
    .await;
    let metrics = inlet.metrics();
    assert_eq!(sample(&metrics, "inlet_pubsub_messages_total", &["outcome=\"nacked\""]), 0.0, "{metrics}");
    assert_eq!(sample(&metrics, "inlet_ingest_failures_total", &[]), 0.0, "{metrics}");
    println!(
        "{backend:?}{}: {total} messages in {} batch(es)",
        if raised { " (key limit raised)" } else { "" },
        sample(&metrics, "inlet_pubsub_batch_size_count", &[])
    );
    let mut message_ids: Vec<&str> = entries.iter().map(|e| e.message_id.as_str()).collect();
    message_ids.sort();
    message_ids.dedup();
    assert_eq!(message_ids.len(), total, "one row per message");
    inlet.stop().await;
    // Nothing the broker would still deliver: every message was acked.
    assert_drained(&emulator, SUBSCRIPTION, Duration::from_secs(12)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pull_batch_with_poison_messages_parks_them_and_acks_all_sqlite() {
    pull_batch_with_poison(Backend::Sqlite, "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pull_batch_with_poison_messages_parks_them_and_acks_all_postgres() {
    pull_batch_with_poison(Backend::Postgres, "").await;
}

/// The same with the key limit raised: the 64 KiB keys reach PostgreSQL inside the
/// pull source's batch transaction, which the database refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pull_batch_refused_by_postgres_is_split_and_acked_postgres() {
    pull_batch_with_poison(Backend::Postgres, RAISED).await;
}
