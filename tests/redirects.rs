//! Targets never follow redirects: a 3xx is the target's answer,
//! handed to `classify` like any status. Followed, it would carry the method, the
//! body, the idempotency key, plugin-set headers and the route's secret headers to
//! wherever `Location` points, and store that host's answer in `last_error`.
//!
//! A real `unruly` plugin (its `classify` parks anything not 2xx or 5xx with "target
//! answered STATUS") sends requests to a real local server answering each redirect
//! status, pointing at a second real local server whose answer carries a marker.
//!
//! Also here: a transport error stored in `last_error` names the target by its origin
//! only, so a secret in the target URL's path (a webhook's) is not shown to whoever
//! reads the entry.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::IntoResponse;
use inlet::inbox::{Entry, ListFilter, Status};
use inlet_testkit::in_process::start_on_sqlite;
use inlet_testkit::paths::plugin_path;
use inlet_testkit::push::{post_push, push_envelope};
use inlet_testkit::wait::wait_for;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);
/// What the second server answers: no byte of it may be stored.
const MARKER: &str = "SECOND-SERVER-ANSWER-c0ffee";
const ROUTE_SECRET: &str = "route-secret-x-api-key-value";
const REDIRECTS: [u16; 5] = [301, 302, 303, 307, 308];

/// One request a server received.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    uri: String,
}

/// A real HTTP server on 127.0.0.1 recording every request and answering as `answer`
/// says from the request's path.
struct Server {
    addr: std::net::SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start(answer: impl Fn(&str) -> axum::response::Response + Clone + Send + Sync + 'static) -> Server {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let record = Arc::clone(&seen);
        let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
            let (record, answer) = (Arc::clone(&record), answer.clone());
            async move {
                let uri = req.uri().to_string();
                record.lock().unwrap().push(Seen { method: req.method().to_string(), uri: uri.clone() });
                answer(req.uri().path())
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind a server");
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move { axum::serve(listener, app).await.expect("server") });
        Server { addr, seen, task }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_is_an_answer_for_classify_and_is_never_followed() {
    // The second server: where every redirect points. It must hear nothing.
    let elsewhere = Server::start(|_| (StatusCode::OK, MARKER).into_response()).await;
    let location = format!("{}/stolen", elsewhere.url());
    // The target: `/team-a/r/CODE` answers CODE with `Location` set to the second server.
    let target = Server::start(move |path: &str| {
        let code = path.rsplit('/').next().and_then(|c| c.parse::<u16>().ok()).unwrap_or(500);
        let mut response =
            (StatusCode::from_u16(code).unwrap(), format!("moved, see the other server ({code})")).into_response();
        response.headers_mut().insert(header::LOCATION, HeaderValue::from_str(&location).unwrap());
        response
    })
    .await;

    let routes = format!(
        "[[route]]\nname = \"redirected\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\n\
         target = {{ kind = \"http\", url = \"{}/team-a\", timeout = \"5s\", headers = {{ x-api-key = \"{ROUTE_SECRET}\" }} }}\n",
        plugin_path("unruly").display(),
        target.url()
    );
    let instance = start_on_sqlite(&routes, |_| {}).await;
    let http = reqwest::Client::new();
    for code in REDIRECTS {
        // A plugin-set header of the kind a metadata server asks for, and a body: all
        // of it would travel on a followed 307/308.
        let orders = json!({
            "key": format!("k-{code}"),
            "path": format!("/r/{code}"),
            "headers": [["Metadata-Flavor", "Google"]],
        });
        let envelope = push_envelope(orders.to_string().as_bytes(), &[], &format!("m-{code}"));
        assert_eq!(post_push(&http, &instance.base(), "redirected", &envelope).await, 200, "{code}");
    }

    let store = &instance.running.shared.store;
    let settled: Vec<Entry> = wait_for("every redirected entry to be settled", WAIT, || async {
        let filter = ListFilter { route: Some("redirected".into()), limit: 100, ..Default::default() };
        let entries = store.list(&filter).await.unwrap();
        let done = entries.len() == REDIRECTS.len()
            && entries.iter().all(|e| !matches!(e.status, Status::Open | Status::InProgress));
        done.then_some(entries)
    })
    .await;

    for code in REDIRECTS {
        let entry = settled.iter().find(|e| e.message_id == format!("m-{code}")).expect("an entry per message");
        let error = entry.last_error.as_deref().unwrap_or_default();
        // The plugin's own park reason: `classify` was handed the 3xx itself.
        assert_eq!(entry.status, Status::Parked, "{code}: {error}");
        assert!(error.contains(&format!("target answered {code}")), "{code}: classify saw the {code}: {error}");
        let attempts = store.attempts(entry.id).await.unwrap();
        assert_eq!(attempts.len(), 1, "{code}: {attempts:?}");
        let requests = &attempts[0].requests;
        assert_eq!(requests.len(), 1, "{code}: one request, no hop: {requests:?}");
        assert_eq!(requests[0].status, Some(code), "{code}: the attempt records the 3xx: {requests:?}");
        let stored = format!("{}{}", serde_json::to_string(entry).unwrap(), serde_json::to_string(&attempts).unwrap());
        assert!(!stored.contains(MARKER), "{code}: the second server's answer is stored: {stored}");
    }

    // The target saw each request once; the second server saw nothing at all.
    let seen = target.seen();
    assert_eq!(seen.len(), REDIRECTS.len(), "{seen:#?}");
    for code in REDIRECTS {
        let uri = format!("/team-a/r/{code}");
        assert_eq!(seen.iter().filter(|s| s.method == "POST" && s.uri == uri).count(), 1, "{uri}: {seen:#?}");
    }
    assert!(elsewhere.seen().is_empty(), "a redirect was followed: {:#?}", elsewhere.seen());

    // Nowhere in the store either: not a byte of the marker in the database files.
    instance.running.stop().await;
    assert!(instance.dir.path().join("inbox.db").is_file());
    for entry in std::fs::read_dir(instance.dir.path()).unwrap() {
        let path = entry.unwrap().path();
        // The store's `-wal` and `-shm` files may go as its last connection closes.
        let Ok(bytes) = std::fs::read(&path) else { continue };
        assert!(!bytes.windows(MARKER.len()).any(|w| w == MARKER.as_bytes()), "{} holds the marker", path.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transport_error_names_the_target_by_its_origin_only() {
    const PATH_SECRET: &str = "B0000SECRETPATHxyz";
    const QUERY_SECRET: &str = "QUERYSECRETxyz";
    // A port nobody listens on: every attempt is a connect error.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let routes = format!(
        "[[route]]\nname = \"hook\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\n\
         target = {{ kind = \"http\", url = \"http://hook-user:pw@{closed}/hooks/T000/{PATH_SECRET}\", timeout = \"2s\" }}\n",
        plugin_path("unruly").display()
    );
    let instance = start_on_sqlite(&routes, |_| {}).await;
    let orders = json!({ "key": "k", "path": format!("/events?token={QUERY_SECRET}") });
    let envelope = push_envelope(orders.to_string().as_bytes(), &[], "m-1");
    assert_eq!(post_push(&reqwest::Client::new(), &instance.base(), "hook", &envelope).await, 200);

    let store = &instance.running.shared.store;
    let entry = wait_for("a failed attempt", WAIT, || async {
        let filter = ListFilter { route: Some("hook".into()), limit: 10, ..Default::default() };
        store.list(&filter).await.unwrap().into_iter().find(|e| e.attempts >= 1 && e.last_error.is_some())
    })
    .await;
    let error = entry.last_error.clone().unwrap();
    assert!(error.contains(&format!("http://{closed}")), "the target's origin is named: {error}");
    let attempts = store.attempts(entry.id).await.unwrap();
    let stored = format!("{}{}", serde_json::to_string(&entry).unwrap(), serde_json::to_string(&attempts).unwrap());
    for secret in [PATH_SECRET, QUERY_SECRET, "hook-user", "/hooks/"] {
        assert!(!stored.contains(secret), "`{secret}` is stored: {stored}");
    }
    instance.running.stop().await;
}
