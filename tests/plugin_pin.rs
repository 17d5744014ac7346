//! Pin what runs: a route names its plugin's SHA-256 (`plugin = { path, sha256 }`), so
//! what serves is exactly the build the team tested. A file with another digest is
//! refused — while running, the pinned version keeps delivering; at start, the route
//! stays out alone — and the log, `GET /api/routes` and a metric say why. A new pin
//! takes the new build; the pinned build put back brings a refused route up.
//!
//! A real `inlet run` process on SQLite, delivering over HTTP to a target in the test
//! that records which plugin rendered each request (the work-order plugin posts to
//! `/engine-rest/message`, the hostile one to `/hostile`), with the real compiled
//! plugins of plugins/dist.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use inlet_testkit::paths::plugin_path;
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use inlet_testkit::push::push_work_order;
use inlet_testkit::wait::{wait_for, wait_until};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);
const ADMIN: &str = "pin-test-admin-token-0001";
const VIEWER: &str = "pin-test-viewer-token-0001";
const TOKENS: [(&str, &str); 2] = [("PIN_ADMIN", ADMIN), ("PIN_VIEWER", VIEWER)];

/// `[store]` and two tokens: an admin, who reads why a route is refused, and a viewer,
/// who only learns that it is.
const SHARED: &str = "[store]\nurl = \"sqlite://inbox.db\"\n\n\
    [[admin.token]]\nname = \"ops\"\nrole = \"admin\"\nsecret = \"${PIN_ADMIN}\"\n\
    [[admin.token]]\nname = \"team\"\nrole = \"viewer\"\nsecret = \"${PIN_VIEWER}\"\n\n";

/// One request the target received: the path the plugin rendered and the body.
#[derive(Clone, Debug)]
struct Received {
    path: String,
    body: String,
}

/// An HTTP target that answers every POST 204 and records it.
struct Target {
    addr: std::net::SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
    server: tokio::task::JoinHandle<()>,
}

impl Target {
    async fn start() -> Target {
        let received: Arc<Mutex<Vec<Received>>> = Arc::default();
        let log = Arc::clone(&received);
        let app = axum::Router::new().fallback(axum::routing::post(move |uri: axum::http::Uri, body: String| {
            let log = Arc::clone(&log);
            async move {
                log.lock().unwrap().push(Received { path: uri.path().to_string(), body });
                axum::http::StatusCode::NO_CONTENT
            }
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Target { addr, received, server }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The requests whose body names work order `key`.
    fn for_key(&self, key: &str) -> Vec<Received> {
        let needle = format!("\"{key}\"");
        self.received.lock().unwrap().iter().filter(|r| r.body.contains(&needle)).cloned().collect()
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn route(name: &str, plugin: &str, target: &Target) -> String {
    format!(
        "[[route]]\nname = \"{name}\"\nplugin = {plugin}\nsource = {{ kind = \"push\" }}\n\
         target = {{ kind = \"http\", url = \"{}\", timeout = \"5s\" }}\n\n",
        target.url()
    )
}

fn pinned(path: &str, sha256: &str) -> String {
    format!("{{ path = \"{path}\", sha256 = \"{sha256}\" }}")
}

/// Writes beside, then renames over, as a deployment would (the reload timer never
/// reads half a file).
fn replace(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// `inlet plugin digest FILE…` as a team runs it: its stdout and exit status.
fn digest_cli(files: &[&Path]) -> (String, bool) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inlet"))
        .args(["plugin", "digest"])
        .args(files)
        .output()
        .expect("run inlet plugin digest");
    (String::from_utf8(out.stdout).unwrap(), out.status.success())
}

/// The digest `inlet plugin digest` prints for one file.
fn pin_of(file: &Path) -> String {
    let (out, ok) = digest_cli(&[file]);
    assert!(ok, "inlet plugin digest {}: {out}", file.display());
    out.split_whitespace().next().unwrap().to_string()
}

struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    async fn get(&self, path: &str, token: &str) -> Value {
        let r = self.http.get(format!("{}{path}", self.base)).bearer_auth(token).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "GET {path}");
        serde_json::from_str(&r.text().await.unwrap()).unwrap()
    }

    async fn route(&self, name: &str, token: &str) -> Value {
        let list = self.get("/api/routes", token).await;
        list["routes"].as_array().unwrap().iter().find(|r| r["name"] == name).cloned().unwrap_or(Value::Null)
    }

    async fn reload(&self) -> Value {
        let r = self.http.post(format!("{}/api/reload", self.base)).bearer_auth(ADMIN).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200);
        serde_json::from_str(&r.text().await.unwrap()).unwrap()
    }

    async fn metrics(&self) -> String {
        self.http.get(format!("{}/metrics", self.base)).send().await.unwrap().text().await.unwrap()
    }

    /// Pushes work order `key`, sequence `seq`: the push status and the entry id.
    async fn push(&self, route: &str, key: &str, seq: u32) -> (u16, Value) {
        let (status, answer) = push_work_order(&self.http, &self.base, route, key, seq).await;
        (status, serde_json::from_str(&answer).unwrap_or(Value::Null))
    }

    /// The entry, with its attempt history, once it is DONE.
    async fn delivered(&self, id: i64) -> Value {
        wait_for(&format!("entry {id} DONE"), WAIT, || async move {
            let e = self.get(&format!("/api/entries/{id}"), ADMIN).await;
            (e["status"] == "DONE").then_some(e)
        })
        .await
    }
}

fn count(metrics: &str, series: &str) -> Option<u64> {
    metrics.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

fn plugin_dist(name: &str) -> PathBuf {
    plugin_path(name)
}

async fn spawn(config: &Path) -> (InletProcess, Api) {
    let listen = format!("127.0.0.1:{}", free_port());
    let mut inlet = InletProcess::spawn_with_args(config, &["--listen", &listen, "--poll", "50ms"], &TOKENS);
    inlet.wait_healthy(WAIT).await;
    let api = Api { http: reqwest::Client::new(), base: inlet.base.clone() };
    (inlet, api)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_route_refuses_another_build_keeps_delivering_with_the_pinned_one_and_takes_a_new_pin() {
    let target = Target::start().await;
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("plugins").join("orders.wasm");
    std::fs::create_dir(plugin.parent().unwrap()).unwrap();
    std::fs::copy(plugin_dist("work_order"), &plugin).unwrap();
    let tested = pin_of(&plugin);
    let other_build = pin_of(&plugin_dist("hostile"));
    assert_ne!(tested, other_build);

    // The team pins the build it tested, as `inlet plugin digest` printed it.
    let config = dir.path().join("inlet.toml");
    let routing =
        |sha256: &str| format!("{SHARED}{}", route("orders", &pinned("plugins/orders.wasm", sha256), &target));
    std::fs::write(&config, routing(&tested.to_ascii_uppercase())).unwrap();
    let (mut inlet, api) = spawn(&config).await;

    let orders = api.route("orders", ADMIN).await;
    assert_eq!((orders["state"].as_str(), orders["plugin_sha256"].as_str()), (Some("up"), Some(tested.as_str())));
    assert_eq!(orders["plugin_pinned_sha256"], tested.as_str(), "kept in lowercase: {orders}");
    assert!(orders["error"].is_null(), "{orders}");

    // Before the replacement: delivered by the pinned build.
    let (status, pushed) = api.push("orders", "wo-1", 1).await;
    assert_eq!(status, 200, "{pushed}");
    let first = api.delivered(pushed["entry"].as_i64().unwrap()).await;
    assert_eq!(first["attempts"][0]["plugin"], tested.as_str(), "{first}");
    assert_eq!(target.for_key("wo-1").iter().map(|r| r.path.as_str()).collect::<Vec<_>>(), ["/engine-rest/message"]);

    // Another build is copied over the pinned file: refused, once, and said why.
    replace(&plugin, &std::fs::read(plugin_dist("hostile")).unwrap());
    api.reload().await;
    let metrics = wait_for("the other build refused", WAIT, || async {
        let m = api.metrics().await;
        (count(&m, "inlet_plugin_digest_mismatch_total{route=\"orders\"}") == Some(1)).then_some(m)
    })
    .await;
    assert_eq!(count(&metrics, "inlet_plugin_reloads_total{route=\"orders\",outcome=\"refused\"}"), Some(1));
    assert_eq!(count(&metrics, "inlet_route_up{route=\"orders\"}"), Some(1), "the route still runs");

    // Both digests and the path as the routing file writes it, in every place that says why.
    let says_why =
        |text: &str| text.contains(&tested) && text.contains(&other_build) && text.contains("plugins/orders.wasm");
    let orders = api.route("orders", ADMIN).await;
    assert_eq!(orders["state"], "up", "{orders}");
    assert_eq!(orders["plugin_sha256"], tested.as_str(), "the pinned version still runs: {orders}");
    let error = orders["error"].as_str().unwrap_or_default();
    assert!(says_why(error), "{orders}");
    assert!(error.contains("pins sha256") && error.contains("keeps serving"), "{orders}");
    // A viewer learns that there is a reason, not the reason (an admin token or the log shows it).
    let seen_by_team = api.route("orders", VIEWER).await;
    let team_error = seen_by_team["error"].as_str().unwrap_or_default();
    assert!(!team_error.is_empty() && !team_error.contains(&other_build), "{seen_by_team}");
    let refusals = |log: &str| log.lines().filter(|l| l.contains("plugin version refused") && says_why(l)).count();
    assert_eq!(refusals(&inlet.log()), 1, "the log says why:\n{}", inlet.log());

    // After the replacement: still delivered by the pinned build, which it runs.
    let (status, pushed) = api.push("orders", "wo-2", 1).await;
    assert_eq!(status, 200, "{pushed}");
    let second = api.delivered(pushed["entry"].as_i64().unwrap()).await;
    assert_eq!(second["attempts"][0]["plugin"], tested.as_str(), "{second}");
    assert_eq!(second["event_type"], first["event_type"], "decoded by the pinned build too: {second}");
    assert_eq!(target.for_key("wo-2").iter().map(|r| r.path.as_str()).collect::<Vec<_>>(), ["/engine-rest/message"]);

    // Reloading the same file again reports nothing new.
    let report = api.reload().await;
    assert_eq!(report["plugins"]["orders"]["result"], "refused", "{report}");
    assert_eq!(count(&api.metrics().await, "inlet_plugin_digest_mismatch_total{route=\"orders\"}"), Some(1));
    assert_eq!(refusals(&inlet.log()), 1, "reported once per cause:\n{}", inlet.log());

    // The team pins the new build: the route takes it.
    replace(&config, routing(&other_build).as_bytes());
    api.reload().await;
    let orders = wait_for("the new pin applied", WAIT, || async {
        let r = api.route("orders", ADMIN).await;
        (r["plugin_sha256"] == other_build.as_str()).then_some(r)
    })
    .await;
    assert_eq!((orders["state"].as_str(), orders["error"].as_str()), (Some("up"), None), "{orders}");
    assert_eq!(orders["plugin_pinned_sha256"], other_build.as_str(), "{orders}");
    let (status, pushed) = api.push("orders", "wo-3", 1).await;
    assert_eq!(status, 200, "{pushed}");
    let third = api.delivered(pushed["entry"].as_i64().unwrap()).await;
    assert_eq!(third["attempts"][0]["plugin"], other_build.as_str(), "{third}");
    assert_eq!(third["event_type"], "hostile", "decoded by the new build: {third}");
    assert_eq!(target.for_key("wo-3").iter().map(|r| r.path.as_str()).collect::<Vec<_>>(), ["/hostile"]);

    // Rolling back with the pin first: the build that runs keeps serving until the file matches.
    replace(&config, routing(&tested).as_bytes());
    api.reload().await;
    let orders = wait_for("the rolled-back pin waiting for its file", WAIT, || async {
        let r = api.route("orders", ADMIN).await;
        r["error"].as_str().is_some_and(|e| e.contains("a newer version was refused") && says_why(e)).then_some(r)
    })
    .await;
    assert_eq!((orders["state"].as_str(), orders["plugin_sha256"].as_str()), (Some("up"), Some(other_build.as_str())));
    let (status, pushed) = api.push("orders", "wo-4", 1).await;
    assert_eq!(status, 200, "{pushed}");
    let fourth = api.delivered(pushed["entry"].as_i64().unwrap()).await;
    assert_eq!(fourth["attempts"][0]["plugin"], other_build.as_str(), "{fourth}");
    replace(&plugin, &std::fs::read(plugin_dist("work_order")).unwrap());
    api.reload().await;
    let orders = wait_for("the pinned build back", WAIT, || async {
        let r = api.route("orders", ADMIN).await;
        (r["plugin_sha256"] == tested.as_str() && r["error"].is_null()).then_some(r)
    })
    .await;
    assert_eq!(orders["plugin_pinned_sha256"], tested.as_str(), "{orders}");
    let (status, pushed) = api.push("orders", "wo-5", 1).await;
    assert_eq!(status, 200, "{pushed}");
    let fifth = api.delivered(pushed["entry"].as_i64().unwrap()).await;
    assert_eq!(fifth["attempts"][0]["plugin"], tested.as_str(), "{fifth}");

    // Each message went once, through the build pinned when it was delivered.
    let paths: Vec<String> = target.received.lock().unwrap().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, ["/engine-rest/message", "/engine-rest/message", "/hostile", "/hostile", "/engine-rest/message"]);
    inlet.assert_running();
    assert!(inlet.sigterm_and_wait(WAIT).success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_start_a_pinned_route_whose_file_differs_is_refused_alone_until_the_pinned_build_is_back() {
    let target = Target::start().await;
    let dir = tempfile::tempdir().unwrap();
    let billing_plugin = dir.path().join("billing.wasm");
    // Pinned to the work-order build, but the file is another one.
    std::fs::copy(plugin_dist("hostile"), &billing_plugin).unwrap();
    let tested = pin_of(&plugin_dist("work_order"));
    let found = pin_of(&billing_plugin);
    let config = dir.path().join("inlet.toml");
    let orders_plugin = format!("\"{}\"", plugin_dist("work_order").display());
    std::fs::write(
        &config,
        format!(
            "{SHARED}{}{}",
            route("orders", &orders_plugin, &target),
            route("billing", &pinned("billing.wasm", &tested), &target)
        ),
    )
    .unwrap();
    let (mut inlet, api) = spawn(&config).await;

    // The other route serves.
    let (status, _) = api.push("orders", "o-1", 1).await;
    assert_eq!(status, 200);
    wait_until("orders delivered", WAIT, || async { target.for_key("o-1").len() == 1 }).await;

    // The pinned one is kept out: 503 (Pub/Sub redelivers later), and said why.
    let (status, body) = api.push("billing", "b-1", 1).await;
    assert_eq!((status, body["reason"].as_str()), (503, Some("route_refused")), "{body}");
    let billing = api.route("billing", ADMIN).await;
    assert_eq!(billing["state"], "refused", "{billing}");
    assert_eq!(billing["plugin_pinned_sha256"], tested.as_str(), "{billing}");
    let error = billing["error"].as_str().unwrap_or_default();
    assert!(error.contains(&tested) && error.contains(&found) && error.contains("billing.wasm"), "{billing}");
    assert_eq!(api.route("orders", ADMIN).await["state"], "up");
    let metrics = api.metrics().await;
    assert_eq!(count(&metrics, "inlet_route_up{route=\"billing\"}"), Some(0), "{metrics}");
    assert_eq!(count(&metrics, "inlet_route_load_failures_total{route=\"billing\"}"), Some(1), "{metrics}");
    assert_eq!(count(&metrics, "inlet_plugin_digest_mismatch_total{route=\"billing\"}"), Some(1), "{metrics}");
    assert_eq!(count(&metrics, "inlet_plugin_digest_mismatch_total{route=\"orders\"}"), Some(0), "{metrics}");
    let refusals = |log: &str| {
        log.lines().filter(|l| l.contains("route refused") && l.contains(&found) && l.contains(&tested)).count()
    };
    assert_eq!(refusals(&inlet.log()), 1, "{}", inlet.log());
    api.reload().await;
    assert_eq!(refusals(&inlet.log()), 1, "reported once per cause:\n{}", inlet.log());

    // The pinned build put back: the route comes up, and Pub/Sub's redelivery goes through.
    replace(&billing_plugin, &std::fs::read(plugin_dist("work_order")).unwrap());
    api.reload().await;
    wait_until("billing up", WAIT, || async { api.route("billing", ADMIN).await["state"] == "up" }).await;
    let (status, _) = api.push("billing", "b-1", 1).await;
    assert_eq!(status, 200);
    wait_until("billing delivered", WAIT, || async { target.for_key("b-1").len() == 1 }).await;
    assert_eq!(target.for_key("b-1")[0].path, "/engine-rest/message");
    let metrics = api.metrics().await;
    assert_eq!(count(&metrics, "inlet_route_up{route=\"billing\"}"), Some(1), "{metrics}");
    inlet.assert_running();
    assert!(inlet.sigterm_and_wait(WAIT).success());
}

#[test]
fn plugin_digest_prints_sha256sum_lines_and_fails_on_a_missing_file() {
    let work_order = plugin_dist("work_order");
    let hostile = plugin_dist("hostile");
    let (out, ok) = digest_cli(&[&work_order, &hostile]);
    assert!(ok, "{out}");
    let expected: String = [&work_order, &hostile]
        .iter()
        .map(|f| format!("{}  {}\n", inlet::inbox::digest_hex(&std::fs::read(f).unwrap()), f.display()))
        .collect();
    assert_eq!(out, expected);

    let missing = work_order.with_file_name("no-such-plugin.wasm");
    let (out, ok) = digest_cli(&[&work_order, &missing]);
    assert!(!ok, "a missing file fails the command");
    assert_eq!(out.lines().count(), 1, "the readable file is still printed: {out}");
}
