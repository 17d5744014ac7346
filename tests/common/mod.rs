//! Support code shared by the integration tests (`mod common;`).
//!
//! Real services, really started: [`TestPg`] gives every test its own fresh PostgreSQL
//! database, [`FakeCamunda`] is a real HTTP server playing Camunda 7's message
//! correlation endpoint, [`plugin_path`] points at the real compiled plugins. A test that
//! needs a service it cannot reach fails loudly; nothing is skipped.
//!
//! Waiting is done only through [`wait_until`] / [`wait_for`] ([`poll_blocking`] where
//! awaiting is impossible): poll with a deadline, never a fixed sleep.

#![allow(dead_code)]

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use sqlx::Connection as _;

// ---------------------------------------------------------------------------------------
// PostgreSQL
// ---------------------------------------------------------------------------------------

/// Admin connection used to create and drop the per-test databases. Trust auth as the
/// `postgres` superuser on the local cluster (see `scripts/ensure-postgres`).
pub const DEFAULT_PG_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// Prefix of every database made by [`TestPg`]; the full name is
/// `inlet_t_<pid>_<counter>_<random>`.
const TEST_DB_PREFIX: &str = "inlet_t_";

/// How long to wait for the admin connection before declaring PostgreSQL unreachable.
const PG_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The admin URL: `INLET_TEST_PG_ADMIN_URL` if set, else [`DEFAULT_PG_ADMIN_URL`].
pub fn pg_admin_url() -> String {
    std::env::var("INLET_TEST_PG_ADMIN_URL")
        .ok()
        .filter(|url| !url.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_PG_ADMIN_URL.to_owned())
}

/// A fresh, empty PostgreSQL database for one test, dropped (with `FORCE`) when this
/// value is dropped. Set `INLET_TEST_KEEP_DB=1` to keep it for inspection.
pub struct TestPg {
    /// Connection URL of the fresh database.
    pub url: String,
    name: String,
    admin_url: String,
}

impl TestPg {
    /// Creates a fresh database on the cluster named by [`pg_admin_url`].
    ///
    /// Panics with a loud message if PostgreSQL cannot be reached.
    pub async fn new() -> TestPg {
        Self::with_admin_url(&pg_admin_url()).await
    }

    /// Creates a fresh database through the given admin (superuser) URL.
    pub async fn with_admin_url(admin_url: &str) -> TestPg {
        let mut admin = connect_admin(admin_url).await;
        sweep_stale_databases(&mut admin).await;

        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "{TEST_DB_PREFIX}{}_{}_{:08x}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
            fastrand::u32(..)
        );
        let create = format!("CREATE DATABASE \"{name}\"");
        // Concurrent CREATE DATABASE can briefly collide on the template database
        // (SQLSTATE 55006, object_in_use): retry a few times.
        let mut tries = 0;
        let mut backoff = tokio::time::interval(Duration::from_millis(20));
        loop {
            match sqlx::raw_sql(&create).execute(&mut admin).await {
                Ok(_) => break,
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55006") && tries < 50 => {
                    tries += 1;
                    backoff.tick().await;
                }
                Err(e) => panic!("TestPg: cannot create database {name} via {admin_url}: {e}"),
            }
        }
        let _ = admin.close().await;

        let url = url_with_database(admin_url, &name);
        TestPg { url, name, admin_url: admin_url.to_owned() }
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Opens a plain connection to the test database.
    pub async fn connect(&self) -> sqlx::PgConnection {
        sqlx::PgConnection::connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("TestPg: cannot connect to {}: {e}", self.url))
    }
}

impl Drop for TestPg {
    fn drop(&mut self) {
        if std::env::var_os("INLET_TEST_KEEP_DB").is_some_and(|v| !v.is_empty() && v != "0") {
            eprintln!("TestPg: keeping database {} (INLET_TEST_KEEP_DB is set)", self.url);
            return;
        }
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        // Drop may run inside a tokio runtime (where block_on is forbidden) or outside
        // one: a thread with its own small runtime works in both cases.
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(async move {
                let mut admin = tokio::time::timeout(PG_CONNECT_TIMEOUT, sqlx::PgConnection::connect(&admin_url))
                    .await
                    .map_err(|_| std::io::Error::other("timed out connecting"))?
                    .map_err(std::io::Error::other)?;
                sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                    .execute(&mut admin)
                    .await
                    .map_err(std::io::Error::other)?;
                let _ = admin.close().await;
                Ok::<(), std::io::Error>(())
            })
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("TestPg: could not drop database {}: {e}", self.name),
            Err(_) => eprintln!("TestPg: dropping database {} panicked", self.name),
        }
    }
}

async fn connect_admin(admin_url: &str) -> sqlx::PgConnection {
    let unreachable = |why: String| -> ! {
        panic!(
            "\n\n*** PostgreSQL is NOT reachable at {admin_url}: {why}\n\
             *** The integration tests need a real PostgreSQL server (trust auth, superuser).\n\
             *** Start it with `scripts/ensure-postgres`, or point INLET_TEST_PG_ADMIN_URL\n\
             *** at a cluster you own. Tests are never skipped for a missing service.\n\n"
        )
    };
    match tokio::time::timeout(PG_CONNECT_TIMEOUT, sqlx::PgConnection::connect(admin_url)).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => unreachable(e.to_string()),
        Err(_) => unreachable(format!("no connection after {PG_CONNECT_TIMEOUT:?}")),
    }
}

/// Once per test process: drop databases left behind by test processes that no longer
/// exist (killed runs never reach `Drop`). No `FORCE`: a database still in use is kept.
async fn sweep_stale_databases(admin: &mut sqlx::PgConnection) {
    static SWEPT: AtomicBool = AtomicBool::new(false);
    if SWEPT.swap(true, Ordering::SeqCst) {
        return;
    }
    let names: Vec<String> =
        match sqlx::query_scalar("SELECT datname FROM pg_database WHERE datname LIKE 'inlet\\_t\\_%'")
            .fetch_all(&mut *admin)
            .await
        {
            Ok(names) => names,
            Err(_) => return,
        };
    for name in names {
        let Some(pid) = name
            .strip_prefix(TEST_DB_PREFIX)
            .and_then(|rest| rest.split('_').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let _ = sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS \"{name}\"")).execute(&mut *admin).await;
    }
}

/// Replaces the database in a `postgres://user@host:port/db?params` URL.
fn url_with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let authority_end = base[scheme_end..].find('/').map(|i| scheme_end + i).unwrap_or(base.len());
    let mut out = format!("{}/{database}", &base[..authority_end]);
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}

// ---------------------------------------------------------------------------------------
// Plugins, ports, envelopes
// ---------------------------------------------------------------------------------------

/// Path of a compiled guest plugin, `plugins/dist/<name>.wasm` (cargo's file name: the
/// crate name with `_`, e.g. `work_order`). Panics if it has not been built.
pub fn plugin_path(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("plugins").join("dist").join(format!("{name}.wasm"));
    if !path.is_file() {
        panic!("plugin {name} not built: run scripts/build-plugins (looked for {})", path.display());
    }
    path
}

/// A TCP port that was free a moment ago on 127.0.0.1 (bind to :0, read, release).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("bind 127.0.0.1:0").port()
}

/// A TCP port that was free a moment ago on 127.0.0.1 and lies below the kernel's
/// ephemeral range, for a service that is restarted on the same port (an emulator, a
/// PostgreSQL cluster, a killed `inlet`): while it is down, no client connection can
/// be given that port as its own and keep it from listening again. Falls back to
/// [`free_port`] if no such port binds.
pub fn free_restartable_port() -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    if low > 12_000 {
        for _ in 0..100 {
            let port = fastrand::u16(10_000..low);
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    free_port()
}

/// A Google Pub/Sub push envelope, as POSTed by a push subscription. Both the camelCase
/// and the snake_case spellings of the message fields are present, as Google sends them.
pub fn push_envelope(data: &[u8], attributes: &[(&str, &str)], message_id: &str) -> serde_json::Value {
    let attributes: serde_json::Map<String, serde_json::Value> =
        attributes.iter().map(|(k, v)| ((*k).to_owned(), serde_json::Value::String((*v).to_owned()))).collect();
    let publish_time = rfc3339_now();
    serde_json::json!({
        "message": {
            "data": base64::engine::general_purpose::STANDARD.encode(data),
            "attributes": attributes,
            "messageId": message_id,
            "message_id": message_id,
            "publishTime": publish_time,
            "publish_time": publish_time,
        },
        "subscription": "projects/test/subscriptions/test",
    })
}

/// POSTs a push envelope to `BASE/push/ROUTE`, as a push subscription does; the answer.
pub async fn send_push(
    http: &reqwest::Client,
    base: &str,
    route: &str,
    envelope: &serde_json::Value,
) -> reqwest::Response {
    http.post(format!("{base}/push/{route}"))
        .header("content-type", "application/json")
        .body(envelope.to_string())
        .send()
        .await
        .unwrap_or_else(|e| panic!("push to route {route}: {e}"))
}

/// [`send_push`], for its status alone.
pub async fn post_push(http: &reqwest::Client, base: &str, route: &str, envelope: &serde_json::Value) -> u16 {
    send_push(http, base, route, envelope).await.status().as_u16()
}

/// Pushes work order `key`'s event number `seq` (the work-order plugin's event, message
/// id `ROUTE-KEY-SEQ`) to `BASE/push/ROUTE`; the status and the answer's text.
pub async fn push_work_order(http: &reqwest::Client, base: &str, route: &str, key: &str, seq: u32) -> (u16, String) {
    let data = format!(r#"{{"workOrderId":"{key}","completedItems":{seq},"completionTimestamp":"t"}}"#);
    let envelope = push_envelope(data.as_bytes(), &[], &format!("{route}-{key}-{seq}"));
    let response = send_push(http, base, route, &envelope).await;
    (response.status().as_u16(), response.text().await.unwrap())
}

/// Current UTC time as RFC 3339 with milliseconds, e.g. `2025-01-31T12:34:56.789Z`.
fn rfc3339_now() -> String {
    let t = utc_now();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year,
        t.month,
        t.day,
        t.hour,
        t.minute,
        t.second,
        t.nanos / 1_000_000
    )
}

/// The current UTC time as civil fields, for the names and stamps tests write.
pub struct UtcNow {
    pub year: i64,
    pub month: i64,
    pub day: i64,
    pub hour: i64,
    pub minute: i64,
    pub second: i64,
    pub nanos: u32,
}

pub fn utc_now() -> UtcNow {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970");
    let secs = now.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    UtcNow {
        year,
        month,
        day,
        hour: rem / 3_600,
        minute: rem % 3_600 / 60,
        second: rem % 60,
        nanos: now.subsec_nanos(),
    }
}

// ---------------------------------------------------------------------------------------
// Waiting
// ---------------------------------------------------------------------------------------

/// How often [`wait_until`] and [`wait_for`] poll.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Polls `f` (at once, then every 20 ms) until it returns true; panics naming `what` if
/// that has not happened within `timeout`. The only way tests wait for things.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_for(what, timeout, || {
        let fut = f();
        async move { fut.await.then_some(()) }
    })
    .await
}

/// Like [`wait_until`], for a condition that yields a value: polls until `f` returns
/// `Some` and returns the value.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut ticks = tokio::time::interval(POLL_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if let Some(value) = f().await {
            return value;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
    }
}

/// The blocking twin of [`wait_for`], for code that cannot await (`Drop`, a kill):
/// polls `f` (at once, then every 20 ms) until it returns `Some`; `None` if that has
/// not happened within `timeout`. Blocks the calling thread.
pub fn poll_blocking<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = f() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

// ---------------------------------------------------------------------------------------
// Fake Camunda 7
// ---------------------------------------------------------------------------------------

/// What [`FakeCamunda`] answers to one `POST /engine-rest/message`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// 204 No Content: correlated.
    Ok,
    /// 400: no process definition or execution matches (not there yet, or finished).
    NoMatch,
    /// 400: more than one execution matches the correlation keys.
    SeveralMatch,
    /// Any status with a small JSON error body (e.g. 500, 503).
    Status(u16),
}

impl Reply {
    /// The HTTP status this reply is sent with.
    pub fn status(&self) -> u16 {
        match self {
            Reply::Ok => 204,
            Reply::NoMatch | Reply::SeveralMatch => 400,
            Reply::Status(code) => *code,
        }
    }

    fn into_response(self, message_name: &str) -> Response {
        let json = |status: u16, body: serde_json::Value| {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
        };
        match self {
            Reply::Ok => StatusCode::NO_CONTENT.into_response(),
            Reply::NoMatch => json(
                400,
                serde_json::json!({
                    "type": "RestException",
                    "message": format!(
                        "Cannot correlate message '{message_name}': No process definition or execution matches the parameters"
                    ),
                }),
            ),
            Reply::SeveralMatch => json(
                400,
                serde_json::json!({
                    "type": "RestException",
                    "message": format!(
                        "Cannot correlate a message with name '{message_name}' to a single execution. 2 executions match the correlation keys: CorrelationSet [businessKey=null, processInstanceId=null, processDefinitionId=null, correlationKeys=null, localCorrelationKeys=null, tenantId=null, isTenantIdSet=false, isExecutionsOnly=false]"
                    ),
                }),
            ),
            Reply::Status(code) => json(
                code,
                serde_json::json!({
                    "type": "ProcessEngineException",
                    "message": format!("fake camunda: scripted failure with status {code}"),
                }),
            ),
        }
    }
}

/// Decides the reply from the correlation key and the 1-based attempt number for that key.
pub type Behaviour = Arc<dyn Fn(&str, usize) -> Reply + Send + Sync>;

/// One request received by [`FakeCamunda`].
#[derive(Clone, Debug)]
pub struct Delivery {
    /// The correlation key: the value of the single entry of `correlationKeys` (strings
    /// as-is, other JSON values printed); several entries are joined as sorted
    /// `name=value` pairs with `&`; empty if there is none.
    pub key: String,
    /// `processVariables.completedItems.value`, or -1 if absent.
    pub seq: i64,
    /// The `Idempotency-Key` header.
    pub idempotency_key: Option<String>,
    /// When the request arrived.
    pub at: Instant,
    /// The request body (`Value::String` of the raw text if it was not JSON).
    pub body: serde_json::Value,
    /// 1-based attempt number for this key (what the behaviour was called with).
    pub attempt: usize,
    /// The status code it was answered with (0 for the instant while the behaviour is
    /// still deciding).
    pub status: u16,
    /// Request headers, names lowercased.
    pub headers: HashMap<String, String>,
}

struct CamundaState {
    behaviour: Behaviour,
    delay: Option<Duration>,
    deliveries: Vec<Delivery>,
    attempts: HashMap<String, usize>,
    keys: KeysInFlight,
}

impl HasKeysInFlight for CamundaState {
    fn keys(&mut self) -> &mut KeysInFlight {
        &mut self.keys
    }
}

type Shared = Arc<Mutex<CamundaState>>;

/// A real HTTP server on 127.0.0.1 playing Camunda 7's `POST /engine-rest/message`.
///
/// Records every request in arrival order, answers as scripted by a [`Behaviour`], and
/// watches per-key concurrency: two requests for one key in flight at once is recorded
/// (see [`FakeCamunda::max_in_flight_per_key`]). The server stops when this is dropped.
pub struct FakeCamunda {
    addr: std::net::SocketAddr,
    state: Shared,
    server: tokio::task::JoinHandle<()>,
}

impl FakeCamunda {
    /// Starts a fake that correlates everything (`Reply::Ok`).
    pub async fn start() -> FakeCamunda {
        Self::with_behaviour(|_, _| Reply::Ok).await
    }

    /// Starts a fake answering as `behaviour(key, attempt)` says.
    pub async fn with_behaviour<F>(behaviour: F) -> FakeCamunda
    where
        F: Fn(&str, usize) -> Reply + Send + Sync + 'static,
    {
        let state: Shared = Arc::new(Mutex::new(CamundaState {
            behaviour: Arc::new(behaviour),
            delay: None,
            deliveries: Vec::new(),
            attempts: HashMap::new(),
            keys: KeysInFlight::default(),
        }));
        let app =
            axum::Router::new().route("/engine-rest/message", axum::routing::post(correlate)).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind fake camunda");
        let addr = listener.local_addr().expect("fake camunda address");
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("fake camunda server");
        });
        FakeCamunda { addr, state, server }
    }

    /// Delays every response by `delay` (after recording), to make overlaps likely.
    pub fn with_delay(self, delay: Duration) -> FakeCamunda {
        self.set_delay(Some(delay));
        self
    }

    /// Changes the response delay from now on.
    pub fn set_delay(&self, delay: Option<Duration>) {
        self.lock().delay = delay;
    }

    /// Replaces the behaviour from now on (attempt counters are kept).
    pub fn set_behaviour<F>(&self, behaviour: F)
    where
        F: Fn(&str, usize) -> Reply + Send + Sync + 'static,
    {
        self.lock().behaviour = Arc::new(behaviour);
    }

    /// Base URL, e.g. `http://127.0.0.1:PORT` (Camunda's REST API is under `/engine-rest`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Full URL of the message endpoint.
    pub fn message_url(&self) -> String {
        format!("{}/engine-rest/message", self.url())
    }

    /// Every request so far, in arrival order.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.lock().deliveries.clone()
    }

    /// The requests for one correlation key, in arrival order.
    pub fn deliveries_for(&self, key: &str) -> Vec<Delivery> {
        self.lock().deliveries.iter().filter(|d| d.key == key).cloned().collect()
    }

    /// Number of requests so far.
    pub fn count(&self) -> usize {
        self.lock().deliveries.len()
    }

    /// The `seq` (completedItems) of the requests for `key` that were answered 2xx, in
    /// arrival order.
    pub fn correlated_seqs(&self, key: &str) -> Vec<i64> {
        self.lock()
            .deliveries
            .iter()
            .filter(|d| d.key == key && (200..300).contains(&d.status))
            .map(|d| d.seq)
            .collect()
    }

    /// The most requests ever in flight at once for one key (1 means per-key order held;
    /// 0 means no request yet).
    pub fn max_in_flight_per_key(&self) -> usize {
        self.lock().keys.max
    }

    /// Keys that had a second request arrive while one was in flight (one per overlap).
    pub fn overlaps(&self) -> Vec<String> {
        self.lock().keys.overlaps.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CamundaState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for FakeCamunda {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Requests in flight per key at a fake, and what that showed: shared by
/// [`FakeCamunda`] and [`RecordingTarget`].
#[derive(Default)]
struct KeysInFlight {
    now: HashMap<String, usize>,
    /// The most ever in flight at once for one key.
    max: usize,
    /// Keys that had a second request arrive while one was in flight (one per overlap).
    overlaps: Vec<String>,
}

/// A fake's state that holds a [`KeysInFlight`].
trait HasKeysInFlight: Send + 'static {
    fn keys(&mut self) -> &mut KeysInFlight;
}

/// Marks a request in flight for its key until dropped (also when the client goes away
/// and the handler is cancelled).
struct InFlight<S: HasKeysInFlight> {
    state: Arc<Mutex<S>>,
    key: String,
}

impl<S: HasKeysInFlight> InFlight<S> {
    /// Counts a request for `key` in, with `st` the locked `state`.
    fn enter(state: &Arc<Mutex<S>>, st: &mut S, key: &str) -> InFlight<S> {
        let keys = st.keys();
        let n = keys.now.entry(key.to_owned()).or_insert(0);
        *n += 1;
        let n = *n;
        if n > 1 {
            keys.overlaps.push(key.to_owned());
        }
        keys.max = keys.max.max(n);
        InFlight { state: Arc::clone(state), key: key.to_owned() }
    }
}

impl<S: HasKeysInFlight> Drop for InFlight<S> {
    fn drop(&mut self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let keys = st.keys();
        if let Some(n) = keys.now.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                keys.now.remove(&self.key);
            }
        }
    }
}

async fn correlate(State(state): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let at = Instant::now();
    let body: serde_json::Value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&body).into_owned()));
    let key = correlation_key(&body);
    let seq = body
        .pointer("/processVariables/completedItems/value")
        .and_then(|v| v.as_i64().or_else(|| v.as_str().and_then(|s| s.parse().ok())))
        .unwrap_or(-1);
    let message_name = body.get("messageName").and_then(|v| v.as_str()).unwrap_or("").to_owned();
    let header_map: HashMap<String, String> = headers
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let idempotency_key = header_map.get("idempotency-key").cloned();
    let json_content = header_map
        .get("content-type")
        .is_some_and(|ct| ct.trim_start().to_ascii_lowercase().starts_with("application/json"));

    let (reply, delay, index, _guard) = {
        let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
        let guard = InFlight::enter(&state, &mut st, &key);

        let attempt = {
            let n = st.attempts.entry(key.clone()).or_insert(0);
            *n += 1;
            *n
        };
        // Camunda rejects anything but JSON (415) and bodies without a message name (400)
        // before correlating; those do not reach the behaviour.
        let reply = if !json_content {
            Err((415, "fake camunda: Content-Type must be application/json"))
        } else if message_name.is_empty() {
            Err((400, "fake camunda: body is not a JSON object with a messageName"))
        } else {
            Ok((st.behaviour.clone(), attempt))
        };
        let status = match &reply {
            Err((code, _)) => *code,
            Ok(_) => 0, // filled in below, outside the lock
        };
        let index = st.deliveries.len();
        st.deliveries.push(Delivery {
            key: key.clone(),
            seq,
            idempotency_key,
            at,
            body: body.clone(),
            attempt,
            status,
            headers: header_map,
        });
        (reply, st.delay, index, guard)
    };

    let response = match reply {
        Err((code, message)) => {
            let status = StatusCode::from_u16(code).expect("valid status");
            let body = serde_json::json!({ "type": "InvalidRequestException", "message": message });
            (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
        }
        Ok((behaviour, attempt)) => {
            // Call the behaviour outside the lock: it may itself inspect the fake.
            let reply = behaviour(&key, attempt);
            {
                let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
                st.deliveries[index].status = reply.status();
            }
            reply.into_response(&message_name)
        }
    };
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    response
}

fn correlation_key(body: &serde_json::Value) -> String {
    let Some(keys) = body.get("correlationKeys").and_then(|v| v.as_object()) else {
        return String::new();
    };
    let value_text = |v: &serde_json::Value| {
        let v = v.get("value").unwrap_or(v);
        match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        }
    };
    if keys.len() == 1 {
        let (_, v) = keys.iter().next().expect("one key");
        return value_text(v);
    }
    let mut pairs: Vec<String> = keys.iter().map(|(k, v)| format!("{k}={}", value_text(v))).collect();
    pairs.sort();
    pairs.join("&")
}

// ---------------------------------------------------------------------------------------
// Google Pub/Sub emulator
// ---------------------------------------------------------------------------------------

/// How long the emulator (a JVM) may take to answer after a start or restart.
const EMULATOR_START_TIMEOUT: Duration = Duration::from_secs(90);

/// The real Pub/Sub emulator (`gcloud beta emulators pubsub start`), in its own process
/// group on a free port, stopped — the whole group, Java server included — on drop.
/// Spoken to through its REST API.
///
/// It keeps all state in memory: after [`PubSubEmulator::restart`] topics and
/// subscriptions are gone (the caller recreates them) and message ids start at 1 again.
pub struct PubSubEmulator {
    /// `127.0.0.1:PORT`, as `PUBSUB_EMULATOR_HOST` wants it.
    pub host: String,
    pub project: String,
    /// The running `gcloud` wrapper; `None` between [`PubSubEmulator::kill`] and
    /// [`PubSubEmulator::restart`].
    child: Option<std::process::Child>,
    /// stdout and stderr of every run on this host:port, appended.
    log: PathBuf,
    http: reqwest::Client,
}

impl PubSubEmulator {
    /// Starts an emulator for `project` on a free port and waits until it answers.
    pub async fn start(project: &str) -> PubSubEmulator {
        let port = free_restartable_port();
        let log = std::env::temp_dir().join(format!("inlet-pubsub-emulator-{port}.log"));
        // A fresh log: the port may have served an earlier run.
        std::fs::File::create(&log).unwrap_or_else(|e| panic!("emulator log file {}: {e}", log.display()));
        let mut emulator = PubSubEmulator {
            host: format!("127.0.0.1:{port}"),
            project: project.to_owned(),
            child: None,
            log,
            http: reqwest::Client::new(),
        };
        emulator.spawn_and_wait().await;
        emulator
    }

    /// A handle to an emulator that another value runs on `host` (for a task that only
    /// publishes or pulls): it owns no process, so dropping it stops nothing.
    pub fn attach(host: &str, project: &str) -> PubSubEmulator {
        PubSubEmulator {
            host: host.to_owned(),
            project: project.to_owned(),
            child: None,
            log: PathBuf::new(),
            http: reqwest::Client::new(),
        }
    }

    /// Kills the emulator (the whole process group, SIGKILL: it keeps nothing worth a
    /// graceful stop) and waits until its port refuses connections. Idempotent.
    pub fn kill(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        kill_group(&mut child);
        // The Java server is not our child, so it cannot be waited for: its listening
        // socket closing is the sign it is gone (even while it is an unreaped zombie).
        let addr: std::net::SocketAddr = self.host.parse().expect("the emulator host is an address");
        let gone = poll_blocking(Duration::from_secs(10), || {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err().then_some(())
        });
        assert!(gone.is_some(), "the Pub/Sub emulator on {} still accepts connections 10 s after SIGKILL", self.host);
    }

    /// Starts the emulator again on the same host:port and project (killing it first if
    /// it runs) and waits until it answers. It comes back empty: recreate topics and
    /// subscriptions.
    pub async fn restart(&mut self) {
        self.kill();
        use std::io::Write as _;
        let mut log = std::fs::OpenOptions::new().append(true).open(&self.log).expect("emulator log file");
        let _ = writeln!(log, "\n----- inlet tests: emulator restarted -----\n");
        self.spawn_and_wait().await;
    }

    /// Path of the emulator's log (every run on this port).
    pub fn log_path(&self) -> &std::path::Path {
        &self.log
    }

    /// The spawn and the readiness wait shared by [`start`](Self::start) and
    /// [`restart`](Self::restart).
    async fn spawn_and_wait(&mut self) {
        use std::os::unix::process::CommandExt as _;
        let out = std::fs::OpenOptions::new().append(true).open(&self.log).expect("emulator log file");
        let child = std::process::Command::new("gcloud")
            .args([
                "beta",
                "emulators",
                "pubsub",
                "start",
                &format!("--host-port={}", self.host),
                &format!("--project={}", self.project),
            ])
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().expect("emulator log file"))
            .stderr(out)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the Pub/Sub emulator (gcloud beta emulators pubsub start): {e}"));
        self.child = Some(child);

        let probe = format!("{}/topics", self.url());
        let started = Instant::now();
        let mut ticks = tokio::time::interval(POLL_INTERVAL * 5);
        loop {
            ticks.tick().await;
            if let Ok(r) = self.http.get(&probe).send().await
                && r.status().is_success()
            {
                return;
            }
            // An emulator that exits (e.g. the port was taken) will never answer.
            let exited = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() || started.elapsed() > EMULATOR_START_TIMEOUT {
                let why = match exited {
                    Some(status) => format!("exited with {status}"),
                    None => format!("did not answer within {EMULATOR_START_TIMEOUT:?}"),
                };
                let tail = std::fs::read_to_string(&self.log).unwrap_or_default();
                panic!("the Pub/Sub emulator on {} {why}; its log ({}):\n{tail}", self.host, self.log.display());
            }
        }
    }

    /// `http://HOST/v1/projects/PROJECT`, the base of the REST API.
    pub fn url(&self) -> String {
        format!("http://{}/v1/projects/{}", self.host, self.project)
    }

    /// `projects/PROJECT/topics/TOPIC`, the name clients use.
    pub fn topic_path(&self, topic: &str) -> String {
        format!("projects/{}/topics/{topic}", self.project)
    }

    /// `projects/PROJECT/subscriptions/SUBSCRIPTION`, the name clients use.
    pub fn subscription_path(&self, subscription: &str) -> String {
        format!("projects/{}/subscriptions/{subscription}", self.project)
    }

    pub async fn create_topic(&self, topic: &str) {
        let r = self.http.put(format!("{}/topics/{topic}", self.url())).send().await.unwrap();
        assert!(r.status().is_success(), "create topic {topic}: {}", r.text().await.unwrap());
    }

    /// A subscription with a 10 s ack deadline.
    pub async fn create_subscription(&self, topic: &str, subscription: &str, ordered: bool) {
        self.create_subscription_with(topic, subscription, ordered, 10).await;
    }

    /// A subscription with the given ack deadline (the emulator accepts 10 to 600 s):
    /// how long a message leased to a consumer that went away waits before redelivery.
    pub async fn create_subscription_with(
        &self,
        topic: &str,
        subscription: &str,
        ordered: bool,
        ack_deadline_seconds: u32,
    ) {
        let body = serde_json::json!({
            "topic": self.topic_path(topic),
            "ackDeadlineSeconds": ack_deadline_seconds,
            "enableMessageOrdering": ordered,
        });
        let r = self
            .http
            .put(format!("{}/subscriptions/{subscription}", self.url()))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "create subscription {subscription}: {}", r.text().await.unwrap());
    }

    /// Pulls what is there now (up to 1,000) and acks it.
    pub async fn pull(&self, subscription: &str) -> Vec<serde_json::Value> {
        let received = self.pull_now(subscription).await;
        if !received.is_empty() {
            let ack_ids: Vec<_> = received.iter().map(|m| m["ackId"].clone()).collect();
            let body = serde_json::json!({ "ackIds": ack_ids }).to_string();
            let r = self
                .http
                .post(format!("{}/subscriptions/{subscription}:acknowledge", self.url()))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "acknowledge on {subscription}: {}", r.text().await.unwrap());
        }
        received.into_iter().map(|m| m["message"].clone()).collect()
    }

    /// One pull with `returnImmediately` (up to 1,000), not acked: the received
    /// messages, `{ackId, message, …}` each.
    async fn pull_now(&self, subscription: &str) -> Vec<serde_json::Value> {
        let body = serde_json::json!({ "maxMessages": 1000, "returnImmediately": true }).to_string();
        let r = self
            .http
            .post(format!("{}/subscriptions/{subscription}:pull", self.url()))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("pull on {subscription}: {e}"));
        let status = r.status();
        let text = r.text().await.unwrap();
        assert!(status.is_success(), "pull on {subscription} answered {status}: {text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["receivedMessages"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for PubSubEmulator {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_group(&mut child);
        }
    }
}

/// SIGKILLs the process group `child` leads and reaps `child`. The gcloud wrapper
/// leaves its Java child running if only the wrapper dies, hence the group.
fn kill_group(child: &mut std::process::Child) {
    let group = format!("-{}", child.id());
    let _ = std::process::Command::new("kill").args(["-KILL", "--", &group]).status();
    let _ = child.wait();
}

/// The python with Google's Pub/Sub client (`scripts/ensure-py-pubsub`).
fn pubsub_python() -> std::ffi::OsString {
    std::env::var_os("INLET_PUBSUB_PYTHON").filter(|p| !p.is_empty()).unwrap_or_else(|| {
        panic!(
            "\n\n*** INLET_PUBSUB_PYTHON is not set: the Pub/Sub tests use Google's Python client.\n\
             *** Run the tests through scripts/test, or set it to the python that\n\
             *** scripts/ensure-py-pubsub prints: export INLET_PUBSUB_PYTHON=$(scripts/ensure-py-pubsub)\n\
             *** Tests are never skipped for a missing tool.\n\n"
        )
    })
}

/// What `tests/pubsub/publish.py` reports.
#[derive(Clone, Copy, Debug, serde::Deserialize)]
pub struct PublishReport {
    pub published: usize,
    /// From the first publish until every publish was confirmed.
    pub seconds: f64,
    /// Messages per second.
    pub rate: f64,
}

/// Publishes `count` work-order events to `topic` (a name as given to `create_topic`)
/// with Google's Python client, not Inlet's code (`tests/pubsub/publish.py`, run by
/// `$INLET_PUBSUB_PYTHON`, which `scripts/test` sets). Message `i` (`start` ≤ i <
/// `start + count`) is for correlation key `key-{i % keys}` with per-key sequence number
/// `i / keys` (its `completedItems`, what [`FakeCamunda::correlated_seqs`] returns), has
/// the attributes `seq` = i, `key` and `eventId` = `evt-{i}` (the plugin's dedup key),
/// and, if `ordered`, the key as its ordering key. Returns once every publish is
/// confirmed; panics with the publisher's errors if any failed.
pub async fn publish_independent(
    emulator: &PubSubEmulator,
    topic: &str,
    count: usize,
    keys: usize,
    start: usize,
    ordered: bool,
) -> PublishReport {
    let mut cmd = publisher(emulator, topic, count, keys, start);
    if ordered {
        cmd.arg("--ordered");
    }
    run_publisher(cmd, count).await
}

/// Publishes one message, number `start` in [`publish_independent`]'s numbering (key
/// `key-0`, attributes `seq`, `key`, `eventId` = `evt-{start}`), whose data is the
/// bytes of `data_file`, with Google's Python client: for large messages.
pub async fn publish_file(emulator: &PubSubEmulator, topic: &str, data_file: &std::path::Path, start: usize) {
    let mut cmd = publisher(emulator, topic, 1, 1, start);
    cmd.arg("--data-file").arg(data_file);
    run_publisher(cmd, 1).await;
}

/// `tests/pubsub/publish.py` with the arguments every publish takes.
fn publisher(emulator: &PubSubEmulator, topic: &str, count: usize, keys: usize, start: usize) -> std::process::Command {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("pubsub").join("publish.py");
    let mut cmd = std::process::Command::new(pubsub_python());
    cmd.arg(&script)
        .args(["--topic", &emulator.topic_path(topic)])
        .args(["--count", &count.to_string(), "--keys", &keys.to_string(), "--start", &start.to_string()])
        .env("PUBSUB_EMULATOR_HOST", &emulator.host)
        .stdin(std::process::Stdio::null());
    cmd
}

/// Runs the publisher, panics with its errors if it failed, returns its report.
async fn run_publisher(mut cmd: std::process::Command, count: usize) -> PublishReport {
    let described = format!("{cmd:?}");
    // A blocking wait on its own thread: the test's runtime keeps serving (fakes, Inlet).
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("the publisher's thread panicked")
        .unwrap_or_else(|e| panic!("cannot run the independent publisher {described}: {e}"));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        panic!("the independent publisher failed ({}): {described}\nstderr:\n{stderr}\nstdout:\n{stdout}", out.status);
    }
    let report: PublishReport =
        stdout.lines().last().and_then(|line| serde_json::from_str(line).ok()).unwrap_or_else(|| {
            panic!("the independent publisher printed no report: {described}\nstdout:\n{stdout}\nstderr:\n{stderr}")
        });
    assert_eq!(report.published, count, "the independent publisher's report: {stdout}");
    report
}

/// Asserts that `subscription` holds nothing: listens with Google's Python client
/// (a streaming pull, nacking whatever comes) for `quiet_for` and panics listing any
/// message that arrives, since a message there was never acked.
///
/// A streaming pull and not the REST pull: the emulator's unary pull answers 500 (a
/// NullPointerException in its OrderedMessageBacklog) on an ordered subscription that
/// a streaming pull has consumed. Call it once the consumers are stopped, with
/// `quiet_for` longer than the ack deadline, so that messages leased to a consumer
/// that went away have had time to come back.
pub async fn assert_drained(emulator: &PubSubEmulator, subscription: &str, quiet_for: Duration) {
    let mut cmd = std::process::Command::new(pubsub_python());
    cmd.arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/pubsub/drained.py"))
        .args(["--subscription", &emulator.subscription_path(subscription)])
        .args(["--quiet", &quiet_for.as_secs_f64().to_string()])
        .env("PUBSUB_EMULATOR_HOST", &emulator.host)
        .stdin(std::process::Stdio::null());
    let described = format!("{cmd:?}");
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("the drain check's thread panicked")
        .unwrap_or_else(|e| panic!("cannot run the drain check {described}: {e}"));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value =
        stdout.lines().last().and_then(|l| serde_json::from_str(l).ok()).unwrap_or_else(|| {
            panic!("the drain check printed no report: {described}\nstdout:\n{stdout}\nstderr:\n{stderr}")
        });
    assert!(out.status.success(), "the drain check failed: {report}\nstderr:\n{stderr}");
    assert_eq!(
        report["received"].as_u64(),
        Some(0),
        "subscription {subscription} is not drained: messages arrived that nobody acked: {report}"
    );
}

// ---------------------------------------------------------------------------------------
// Inlet in-process
// ---------------------------------------------------------------------------------------

/// An Inlet instance started in this process on a fresh SQLite inbox in a folder of
/// its own, listening on a free port, polling every 20 ms.
pub struct Instance {
    pub running: inlet::app::Running,
    /// The routing file; `dir` holds it and the inbox.
    pub config: PathBuf,
    pub dir: tempfile::TempDir,
}

impl Instance {
    /// `http://127.0.0.1:PORT`
    pub fn base(&self) -> String {
        format!("http://{}", self.running.addr)
    }
}

/// Starts Inlet with the given `[[route]]` tables; `tune` adjusts the options (a
/// manual clock, reload timing, …) before the start.
pub async fn start_on_sqlite(routes: &str, tune: impl FnOnce(&mut inlet::app::Options)) -> Instance {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("inlet.toml");
    std::fs::write(&config, format!("[store]\nurl = \"sqlite://inbox.db\"\n\n{routes}"))
        .expect("write the routing file");
    let loaded = inlet::config::Config::load(&config).unwrap_or_else(|e| panic!("test routing file is invalid:\n{e}"));
    let mut options = inlet::app::Options {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        poll: Duration::from_millis(20),
        ..inlet::app::Options::default()
    };
    tune(&mut options);
    let running = inlet::app::start(&loaded, options).await.expect("inlet starts");
    Instance { running, config, dir }
}

// ---------------------------------------------------------------------------------------
// Inlet as a process
// ---------------------------------------------------------------------------------------

/// Lines of a process log printed when a test fails.
const LOG_TAIL_LINES: usize = 40;

/// A real `inlet run CONFIG` process, stdout and stderr in one log file in a temp dir
/// of its own, `RUST_LOG=inlet=debug`. Dropping it kills it (SIGKILL) and waits; if the
/// test is panicking, the tail of the log is printed and the log kept.
pub struct InletProcess {
    /// `INLET_INSTANCE` if `spawn` was given one (then it is also the lease owner),
    /// else `pid N`.
    pub name: String,
    /// `http://LISTEN`: push endpoint, admin API, health. LISTEN is `--listen` if given,
    /// else the routing file's `[server] listen` (default `127.0.0.1:8080`).
    pub base: String,
    child: std::process::Child,
    /// Set once the child has been reaped: from then on its pid may be someone else's.
    exited: Option<std::process::ExitStatus>,
    /// A panic of ours already showed the log's tail: `Drop` need not repeat it.
    tail_shown: std::cell::Cell<bool>,
    log: PathBuf,
    dir: Option<tempfile::TempDir>,
}

impl InletProcess {
    /// The process id (for /proc readings).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts `inlet run config`. `envs` are set after the defaults (`RUST_LOG`,
    /// `NO_COLOR=1`), so they may override them; `INLET_INSTANCE` is not inherited from
    /// the test's environment, only taken from `envs`.
    pub fn spawn(config: &std::path::Path, envs: &[(&str, &str)]) -> InletProcess {
        Self::spawn_with_args(config, &[], envs)
    }

    /// Like [`spawn`](Self::spawn), with more arguments after `run CONFIG` (`--listen`,
    /// `--poll`, …).
    pub fn spawn_with_args(config: &std::path::Path, args: &[&str], envs: &[(&str, &str)]) -> InletProcess {
        let dir = tempfile::Builder::new().prefix("inlet-process-").tempdir().expect("tempdir for an inlet log");
        let log = dir.path().join("inlet.log");
        let out = std::fs::File::create(&log).expect("create the inlet log");
        let listen = match args.iter().position(|a| *a == "--listen") {
            Some(i) => args.get(i + 1).expect("--listen needs a value").to_string(),
            None => configured_listen(config),
        };
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_inlet"))
            .arg("run")
            .arg(config)
            .args(args)
            .env("RUST_LOG", "inlet=debug")
            .env("NO_COLOR", "1")
            .env_remove("INLET_INSTANCE")
            .envs(envs.iter().copied())
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().expect("inlet log file"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start inlet run {}: {e}", config.display()));
        let name = envs
            .iter()
            .find(|(k, _)| *k == "INLET_INSTANCE")
            .map(|(_, v)| (*v).to_owned())
            .unwrap_or_else(|| format!("pid {}", child.id()));
        InletProcess {
            name,
            base: format!("http://{listen}"),
            child,
            exited: None,
            tail_shown: Default::default(),
            log,
            dir: Some(dir),
        }
    }

    /// Waits until `GET /healthz` answers 2xx; panics (with the log) if the process
    /// exits or `within` passes first.
    pub async fn wait_healthy(&mut self, within: Duration) {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().expect("http client");
        let url = format!("{}/healthz", self.base);
        let what = format!("inlet {} to answer GET {url}", self.name);
        wait_until(&what, within, || {
            self.assert_running();
            let (http, url) = (http.clone(), url.clone());
            async move { http.get(&url).send().await.is_ok_and(|r| r.status().is_success()) }
        })
        .await;
    }

    /// Panics, with the tail of the log, if the process has exited.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.try_exited() {
            panic!("inlet {} exited early with {status}\n{}", self.name, self.log_tail());
        }
    }

    /// Kills the process with SIGKILL (a crash: nothing is flushed, acked or handed
    /// back) and waits for it. Idempotent.
    pub fn sigkill(&mut self) {
        if self.exited.is_none() {
            let _ = self.child.kill();
            self.exited = Some(self.child.wait().unwrap_or_else(|e| panic!("wait for inlet {}: {e}", self.name)));
        }
    }

    /// Sends SIGTERM (a graceful stop) and waits for the exit; panics with the log if
    /// the process had already exited, or is still running after `within` (it is then
    /// killed).
    ///
    /// On a multi-thread runtime the wait leaves this worker's tasks to the others
    /// (`block_in_place`), so fakes in this process keep answering the deliveries Inlet
    /// finishes while it stops; on a current-thread runtime they would stall.
    pub fn sigterm_and_wait(&mut self, within: Duration) -> std::process::ExitStatus {
        self.signal("TERM");
        self.wait_exit(within)
    }

    /// Sends a signal (`TERM`, `INT`, as `kill -NAME` spells it) and returns at once;
    /// panics with the log if the process had already exited.
    pub fn signal(&mut self, name: &str) {
        if let Some(status) = self.try_exited() {
            panic!("inlet {} had already exited with {status} before SIG{name}\n{}", self.name, self.log_tail());
        }
        let pid = self.child.id().to_string();
        let sent = std::process::Command::new("kill").args([&format!("-{name}"), &pid]).status();
        assert!(sent.as_ref().is_ok_and(|s| s.success()), "kill -{name} {pid} (inlet {}): {sent:?}", self.name);
    }

    /// Waits for the process to exit (after a [`signal`](Self::signal)); panics with
    /// the log if it is still running after `within` (it is then killed). Leaves this
    /// worker's tasks to the others while it waits, as [`sigterm_and_wait`](Self::sigterm_and_wait).
    pub fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let multi_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        let mut wait = || poll_blocking(within, || self.try_exited());
        let exited = if multi_thread { tokio::task::block_in_place(wait) } else { wait() };
        exited.unwrap_or_else(|| {
            self.sigkill();
            panic!("inlet {} did not exit within {within:?} (killed)\n{}", self.name, self.log_tail());
        })
    }

    /// The whole log so far (stdout and stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_else(|e| panic!("read {}: {e}", self.log.display()))
    }

    /// The exit status, if the process has exited (reaping it).
    fn try_exited(&mut self) -> Option<std::process::ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().unwrap_or_else(|e| panic!("wait for inlet {}: {e}", self.name));
        }
        self.exited
    }

    /// The last lines of the log, headed by where the whole log is.
    fn log_tail(&self) -> String {
        self.tail_shown.set(true);
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(LOG_TAIL_LINES);
        format!(
            "----- inlet {} log (last {} of {} lines, {}) -----\n{}",
            self.name,
            lines.len() - from,
            lines.len(),
            self.log.display(),
            lines[from..].join("\n")
        )
    }
}

impl Drop for InletProcess {
    fn drop(&mut self) {
        self.sigkill();
        if std::thread::panicking() {
            if !self.tail_shown.get() {
                eprintln!("{}", self.log_tail());
            }
            // Keep the whole log for a look after the failed test.
            if let Some(dir) = self.dir.take() {
                eprintln!("----- inlet {} log kept at {} -----", self.name, dir.keep().join("inlet.log").display());
            }
        }
    }
}

/// `[server] listen` of a routing file, or Inlet's default; only to know where the
/// process will listen (the process itself reads the file).
fn configured_listen(config: &std::path::Path) -> String {
    let text = std::fs::read_to_string(config).unwrap_or_else(|e| panic!("read {}: {e}", config.display()));
    let file: toml::Table = toml::from_str(&text).unwrap_or_else(|e| panic!("{} is not TOML: {e}", config.display()));
    file.get("server").and_then(|s| s.get("listen")).and_then(|l| l.as_str()).unwrap_or("127.0.0.1:8080").to_owned()
}

// ---------------------------------------------------------------------------------------
// Cutting connections
// ---------------------------------------------------------------------------------------

/// A TCP proxy that can be switched off: a service "goes away" for the process under
/// test (which is pointed at `addr`) while the test still reaches it directly. Off, it
/// closes new connections at once and cuts the open ones.
pub struct TcpProxy {
    /// `127.0.0.1:PORT` to use instead of the upstream.
    pub addr: String,
    up: Arc<AtomicBool>,
    generation: Arc<tokio::sync::watch::Sender<u64>>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    /// Starts a proxy to `upstream` (`HOST:PORT`), switched on.
    pub async fn start(upstream: &str) -> TcpProxy {
        let upstream: Arc<str> = Arc::from(upstream);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let up = Arc::new(AtomicBool::new(true));
        let generation = Arc::new(tokio::sync::watch::channel(0u64).0);
        let (up2, generation2) = (Arc::clone(&up), Arc::clone(&generation));
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else { return };
                if !up2.load(Ordering::SeqCst) {
                    continue; // dropped: connection refused from the client's view
                }
                let mut cut = generation2.subscribe();
                let upstream = Arc::clone(&upstream);
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&*upstream).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        TcpProxy { addr, up, generation, task }
    }

    /// Switches the proxy on or off; off also cuts every open connection.
    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::SeqCst);
        if !up {
            self.generation.send_modify(|g| *g += 1);
        }
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------------------
// A private PostgreSQL cluster (for crashing it)
// ---------------------------------------------------------------------------------------

/// How long `pg_ctl start` may take (crash recovery included) before the test fails.
const PG_CLUSTER_START_TIMEOUT: Duration = Duration::from_secs(120);

/// A PostgreSQL cluster of the test's own: `initdb` into a temp dir, `pg_ctl` on a free
/// port of 127.0.0.1 (trust auth, superuser `postgres`), so a test can crash it
/// ([`PgCluster::crash`]: `pg_ctl stop -m immediate`, the postmaster and every backend
/// killed without a checkpoint) and bring it back on the same port and data
/// ([`PgCluster::start`], which runs crash recovery). Run as root, the tools run as the
/// `postgres` user (`runuser`), since PostgreSQL refuses to run as root. The binaries
/// come from `INLET_PG_BIN` if set, else the newest `/usr/lib/postgresql/*/bin`, else
/// `PATH`. Stopped (immediately) and removed on drop.
///
/// `fsync` is off: a crash here is a process crash, not a power cut, so what was
/// written to the kernel survives it (and the test stays fast on a loaded machine).
pub struct PgCluster {
    pub port: u16,
    bin: PathBuf,
    dir: tempfile::TempDir,
}

impl PgCluster {
    /// `initdb` and a first start; panics loudly (with the server log) if either fails.
    pub fn init() -> PgCluster {
        let bin = pg_bin_dir();
        let dir = tempfile::Builder::new().prefix("inlet-pg-cluster-").tempdir().expect("tempdir for a cluster");
        if running_as_root() {
            let status = std::process::Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .expect("run chown");
            assert!(status.success(), "chown {} to postgres: {status}", dir.path().display());
        }
        let cluster = PgCluster { port: free_restartable_port(), bin, dir };
        let out = cluster
            .tool("initdb")
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-instructions", "-D"])
            .arg(cluster.data())
            .output()
            .unwrap_or_else(|e| panic!("cannot run initdb: {e}"));
        assert!(
            out.status.success(),
            "initdb failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.start();
        cluster
    }

    /// `postgres://postgres@127.0.0.1:PORT/DATABASE`
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates a database (call while the cluster runs).
    pub async fn create_database(&self, name: &str) {
        let mut admin = connect_admin(&self.url("postgres")).await;
        sqlx::raw_sql(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut admin)
            .await
            .unwrap_or_else(|e| panic!("create database {name} on the private cluster: {e}"));
        let _ = admin.close().await;
    }

    /// Starts the cluster (again) on its port and data and waits until it accepts
    /// connections; after a [`crash`](Self::crash) that includes crash recovery.
    pub fn start(&self) {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=off -c full_page_writes=off -c max_connections=300",
            self.port,
            self.dir.path().display()
        );
        let out = self
            .tool("pg_ctl")
            .args(["start", "-w", "-t", &PG_CLUSTER_START_TIMEOUT.as_secs().to_string(), "-D"])
            .arg(self.data())
            .arg("-l")
            .arg(self.log_path())
            .args(["-o", &options])
            .output()
            .unwrap_or_else(|e| panic!("cannot run pg_ctl start: {e}"));
        assert!(
            out.status.success(),
            "pg_ctl start failed ({}): {}{}\n--- server log ---\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(self.log_path()).unwrap_or_default()
        );
    }

    /// Crashes the cluster: `pg_ctl stop -m immediate` (every server process gets
    /// SIGQUIT and exits without a checkpoint; open connections break). Returns once
    /// it is down.
    pub fn crash(&self) {
        let out = self
            .tool("pg_ctl")
            .args(["stop", "-m", "immediate", "-w", "-D"])
            .arg(self.data())
            .output()
            .unwrap_or_else(|e| panic!("cannot run pg_ctl stop: {e}"));
        assert!(
            out.status.success(),
            "pg_ctl stop -m immediate failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The server log (every start appends to it).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A command for one of the cluster's tools, as `postgres` when we are root.
    fn tool(&self, name: &str) -> std::process::Command {
        let path = self.bin.join(name);
        let mut cmd = if running_as_root() {
            let mut cmd = std::process::Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(path);
            cmd
        } else {
            std::process::Command::new(path)
        };
        cmd.stdin(std::process::Stdio::null());
        cmd
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = self.tool("pg_ctl").args(["stop", "-m", "immediate", "-D"]).arg(self.data()).output();
    }
}

fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
}

/// Where `initdb` and `pg_ctl` are: `INLET_PG_BIN`, else the newest
/// `/usr/lib/postgresql/*/bin`, else whatever `PATH` finds (an empty path).
fn pg_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("INLET_PG_BIN").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin)| bin.join("initdb").is_file())
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// A recording, idempotent HTTP target
// ---------------------------------------------------------------------------------------

/// One request received by [`RecordingTarget`].
#[derive(Clone, Debug)]
pub struct TargetRequest {
    /// The correlation key of the body (as [`Delivery::key`]).
    pub key: String,
    /// The request's path, as the plugin rendered it.
    pub path: String,
    /// The `Idempotency-Key` header (empty if there was none).
    pub idempotency_key: String,
    pub arrived: Instant,
    /// What it was answered: 204 took effect, 200 a replay of an effect already taken,
    /// 422 a scripted refusal.
    pub status: u16,
}

#[derive(Default)]
struct TargetState {
    requests: Vec<TargetRequest>,
    /// Idempotency keys whose effect was taken, per correlation key, in effect order.
    effects: HashMap<String, Vec<String>>,
    taken: std::collections::HashSet<String>,
    /// Idempotency key → refusals (422) still to answer before it may take effect.
    refusals: HashMap<String, usize>,
    keys: KeysInFlight,
    /// Response delay: uniform in [min, max] ms, after the effect is taken.
    delay_ms: (u64, u64),
}

/// A real HTTP server on 127.0.0.1 that plays an idempotent engine for the chaos test:
/// every `POST` (any path) with a JSON body naming a correlation key (Camunda's
/// `correlationKeys` shape, as the work-order plugin renders it) is recorded; the first
/// request of an `Idempotency-Key` takes effect (204) and later ones are replays (200,
/// no effect), so *each key took effect once* is what the recording shows, and the
/// effect order per correlation key is the order the engine acted in. Keys given to
/// [`refuse`](Self::refuse) are answered 422 (a permanent refusal: the plugin parks)
/// that many times first. Watches per-key concurrency like [`FakeCamunda`]. It can be
/// made slow ([`set_delay`](Self::set_delay)); to make it unreachable, put a
/// [`TcpProxy`] in front.
pub struct RecordingTarget {
    addr: std::net::SocketAddr,
    state: Arc<Mutex<TargetState>>,
    server: tokio::task::JoinHandle<()>,
}

impl RecordingTarget {
    pub async fn start() -> RecordingTarget {
        let state: Arc<Mutex<TargetState>> = Arc::default();
        let app = axum::Router::new().fallback(axum::routing::post(record)).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the recording target");
        let addr = listener.local_addr().expect("recording target address");
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("recording target server");
        });
        RecordingTarget { addr, state, server }
    }

    /// `127.0.0.1:PORT`
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// Answer `idempotency_key` with 422 the next `times` times it arrives.
    pub fn refuse(&self, idempotency_key: &str, times: usize) {
        self.lock().refusals.insert(idempotency_key.to_owned(), times);
    }

    /// Delays every answer by a uniform random time in `[min, max]` from now on
    /// (`ZERO, ZERO` for none).
    pub fn set_delay(&self, min: Duration, max: Duration) {
        self.lock().delay_ms = (min.as_millis() as u64, max.as_millis().max(min.as_millis()) as u64);
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<TargetRequest> {
        self.lock().requests.clone()
    }

    /// Idempotency keys that took effect, per correlation key, in effect order.
    pub fn effects(&self) -> HashMap<String, Vec<String>> {
        self.lock().effects.clone()
    }

    /// The most requests ever in flight at once for one correlation key.
    pub fn max_in_flight_per_key(&self) -> usize {
        self.lock().keys.max
    }

    /// Correlation keys that had a second request arrive while one was in flight.
    pub fn overlaps(&self) -> Vec<String> {
        self.lock().keys.overlaps.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TargetState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for RecordingTarget {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl HasKeysInFlight for TargetState {
    fn keys(&mut self) -> &mut KeysInFlight {
        &mut self.keys
    }
}

async fn record(
    State(state): State<Arc<Mutex<TargetState>>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    let key = correlation_key(&body);
    let idempotency_key =
        headers.get("idempotency-key").map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()).unwrap_or_default();
    let (status, delay, _guard) = {
        let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
        let guard = InFlight::enter(&state, &mut st, &key);
        let refused = st.refusals.get_mut(&idempotency_key).is_some_and(|left| {
            let refuse = *left > 0;
            *left = left.saturating_sub(1);
            refuse
        });
        let status = if refused {
            422
        } else if st.taken.contains(&idempotency_key) {
            200
        } else {
            st.taken.insert(idempotency_key.clone());
            st.effects.entry(key.clone()).or_default().push(idempotency_key.clone());
            204
        };
        let path = uri.path().to_string();
        st.requests.push(TargetRequest { key, path, idempotency_key, arrived: Instant::now(), status });
        let (min, max) = st.delay_ms;
        let delay = if max > 0 { Duration::from_millis(fastrand::u64(min..=max)) } else { Duration::ZERO };
        (status, delay, guard)
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    match status {
        422 => (
            StatusCode::UNPROCESSABLE_ENTITY,
            [(header::CONTENT_TYPE, "application/json")],
            r#"{"type":"RestException","message":"recording target: refused on purpose (chaos scenario)"}"#,
        )
            .into_response(),
        code => StatusCode::from_u16(code).expect("valid status").into_response(),
    }
}
