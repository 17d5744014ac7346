//! Access control of a shared Inlet: admin tokens with roles and routes, the audit
//! log, cross-site requests, a separate admin listener, pushes to pull routes, and
//! secrets kept out of output. Inlet runs as a real process (its log is evidence)
//! or in-process on a real SQLite inbox; requests are real HTTP.

use std::path::{Path, PathBuf};
use std::time::Duration;

use inlet_testkit::in_process::start_on_sqlite;
use inlet_testkit::paths::plugin_path;
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use inlet_testkit::push::push_envelope;
use inlet_testkit::wait::{wait_for, wait_until};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(30);
const VIEWER_A: &str = "viewer-a-token-0123456789";
const OPS_A: &str = "ops-a-token-0123456789abc";
const ROOT: &str = "root-token-0123456789abcdef";

/// Two push routes, `a` and `b`, the work-order plugin, a log target.
fn routes() -> String {
    let plugin = plugin_path("work_order");
    ["a", "b"]
        .iter()
        .map(|name| {
            format!(
                "[[route]]\nname = \"{name}\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"log\" }}\n\n",
                plugin.display()
            )
        })
        .collect()
}

/// A team's viewer and operator (route `a` only, by environment variable) and an
/// unrestricted admin (token in a file).
fn token_section(dir: &Path) -> String {
    token_section_with(dir, "")
}

/// [`token_section`] with more `[admin]` fields.
fn token_section_with(dir: &Path, fields: &str) -> String {
    std::fs::write(dir.join("root.token"), format!("{ROOT}\n")).unwrap();
    "[admin]\nFIELDS\
     [[admin.token]]\nname = \"viewer-a\"\nrole = \"viewer\"\nsecret = \"${T_VIEWER_A}\"\nroutes = [\"a\"]\n\
     [[admin.token]]\nname = \"ops-a\"\nrole = \"operator\"\nsecret = \"${T_OPS_A}\"\nroutes = [\"a\"]\n\
     [[admin.token]]\nname = \"root\"\nrole = \"admin\"\nsecret_file = \"root.token\"\n\n"
        .replace("FIELDS", fields)
}

const TOKEN_ENV: [(&str, &str); 2] = [("T_VIEWER_A", VIEWER_A), ("T_OPS_A", OPS_A)];

fn write_config(dir: &Path, sections: &str) -> PathBuf {
    let path = dir.join("inlet.toml");
    std::fs::write(&path, format!("[store]\nurl = \"sqlite://inbox.db\"\n\n{sections}{}", routes())).unwrap();
    path
}

/// A process on a free port with `sections` before the routes.
async fn spawn(dir: &Path, sections: &str, envs: &[(&str, &str)]) -> InletProcess {
    let config = write_config(dir, sections);
    let listen = format!("127.0.0.1:{}", free_port());
    let mut inlet = InletProcess::spawn_with_args(&config, &["--listen", &listen, "--poll", "20ms"], envs);
    inlet.wait_healthy(WAIT).await;
    inlet
}

/// Pushes a payload the work-order plugin cannot decode: the entry is PARKED.
async fn push_undecodable(http: &reqwest::Client, base: &str, route: &str, id: &str) {
    let envelope = push_envelope(b"not a work order", &[], id);
    let r = http
        .post(format!("{base}/push/{route}"))
        .header("content-type", "application/json")
        .body(envelope.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "push to {route}: {}", r.text().await.unwrap());
}

async fn get(http: &reqwest::Client, url: &str, token: Option<&str>) -> (u16, Value) {
    let mut req = http.get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, serde_json::from_str(&r.text().await.unwrap()).unwrap_or(Value::Null))
}

async fn post(http: &reqwest::Client, url: &str, token: Option<&str>) -> u16 {
    let mut req = http.post(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.unwrap().status().as_u16()
}

/// The ids of a route's entries, as the unrestricted admin sees them.
async fn entry_ids(http: &reqwest::Client, base: &str, route: &str) -> Vec<i64> {
    let (status, body) = get(http, &format!("{base}/api/entries?route={route}"), Some(ROOT)).await;
    assert_eq!(status, 200, "{body}");
    body["entries"].as_array().unwrap().iter().map(|e| e["id"].as_i64().unwrap()).collect()
}

async fn entry(http: &reqwest::Client, base: &str, id: i64) -> Value {
    let (status, body) = get(http, &format!("{base}/api/entries/{id}"), Some(ROOT)).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// What a repair would change about an entry.
fn state(e: &Value) -> (Value, Value, Value) {
    (e["status"].clone(), e["updated_at"].clone(), e["next_attempt_at"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_have_roles_and_routes_and_every_repair_is_audited() {
    let dir = tempfile::tempdir().unwrap();
    let inlet = spawn(dir.path(), &token_section(dir.path()), &TOKEN_ENV).await;
    let (http, base) = (reqwest::Client::new(), inlet.base.clone());
    push_undecodable(&http, &base, "a", "a-1").await;
    push_undecodable(&http, &base, "b", "b-1").await;
    let (ea, eb) = (entry_ids(&http, &base, "a").await[0], entry_ids(&http, &base, "b").await[0]);
    assert_eq!(entry(&http, &base, ea).await["status"], "PARKED");
    let (before_a, before_b) = (state(&entry(&http, &base, ea).await), state(&entry(&http, &base, eb).await));

    // No token, a wrong one, a token in the query string: 401 with a Bearer challenge.
    let r = http.get(format!("{base}/api/entries")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers()["www-authenticate"].to_str().unwrap().starts_with("Bearer"), "{:?}", r.headers());
    assert_eq!(get(&http, &format!("{base}/api/entries"), Some("not-a-known-token-at-all")).await.0, 401);
    assert_eq!(get(&http, &format!("{base}/api/entries?token={ROOT}"), None).await.0, 401);

    // The viewer reads its route, without payloads, and may not repair.
    let (status, body) = get(&http, &format!("{base}/api/entries"), Some(VIEWER_A)).await;
    assert_eq!(status, 200);
    let listed: Vec<i64> = body["entries"].as_array().unwrap().iter().map(|e| e["id"].as_i64().unwrap()).collect();
    assert_eq!(listed, vec![ea], "a viewer of route a lists only route a: {body}");
    assert!(body["entries"][0]["raw_data"].get("text").is_none(), "payload withheld: {body}");
    assert_eq!(post(&http, &format!("{base}/api/entries/{ea}/requeue"), Some(VIEWER_A)).await, 403);

    // The operator of route a: route b does not exist for it.
    let (status, body) = get(&http, &format!("{base}/api/entries"), Some(OPS_A)).await;
    assert_eq!(status, 200);
    assert!(body["entries"].as_array().unwrap().iter().all(|e| e["route"] == "a"), "{body}");
    assert_eq!(body["entries"][0]["raw_data"]["text"], "not a work order", "operators read payloads");
    let (status, body) = get(&http, &format!("{base}/api/entries?route=b"), Some(OPS_A)).await;
    assert_eq!((status, body["entries"].as_array().unwrap().len()), (200, 0), "{body}");
    let (status, shown) = get(&http, &format!("{base}/api/entries/{eb}"), Some(OPS_A)).await;
    let (_, missing) = get(&http, &format!("{base}/api/entries/999999"), Some(OPS_A)).await;
    assert_eq!(status, 404);
    assert_eq!(shown["error"], format!("no entry {eb}"), "answered like a missing entry ({missing})");
    assert_eq!(post(&http, &format!("{base}/api/entries/{eb}/requeue"), Some(OPS_A)).await, 404);
    assert_eq!(post(&http, &format!("{base}/api/reload"), Some(OPS_A)).await, 403, "reload is for admins");
    assert_eq!(get(&http, &format!("{base}/api/audit"), Some(OPS_A)).await.0, 403);

    // Nothing refused changed anything, and no refusal is in the audit log.
    assert_eq!(state(&entry(&http, &base, ea).await), before_a);
    assert_eq!(state(&entry(&http, &base, eb).await), before_b);
    let (_, audit) = get(&http, &format!("{base}/api/audit"), Some(ROOT)).await;
    assert_eq!(audit["audit"], serde_json::json!([]), "refusals are not stored");

    // The operator may requeue its own route's entry; the admin may reload.
    assert_eq!(post(&http, &format!("{base}/api/entries/{ea}/requeue"), Some(OPS_A)).await, 200);
    assert_eq!(post(&http, &format!("{base}/api/reload"), Some(ROOT)).await, 200);
    let (status, audit) = get(&http, &format!("{base}/api/audit"), Some(ROOT)).await;
    assert_eq!(status, 200);
    let lines: Vec<(&str, &str, &str, &str)> = audit["audit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["actor"].as_str().unwrap(),
                a["action"].as_str().unwrap(),
                a["subject"].as_str().unwrap(),
                a["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    let subject = format!("entry {ea}");
    assert_eq!(
        lines,
        vec![("ops-a", "requeue", subject.as_str(), "ok"), ("root", "reload", "routing file and plugins", "ok")],
        "{audit}"
    );

    // The refusals are in the log, with who and why.
    let log = inlet.log();
    assert!(log.contains("admin request refused") && log.contains("viewer-a"), "viewer refusal logged");
    assert!(log.contains("unknown token"), "bad token logged");
    assert!(log.contains("audit: repair action") && log.contains("ops-a"), "the repair logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_writes_its_repairs_to_the_audit_log_too() {
    let dir = tempfile::tempdir().unwrap();
    let inlet = spawn(dir.path(), &token_section(dir.path()), &TOKEN_ENV).await;
    let http = reqwest::Client::new();
    push_undecodable(&http, &inlet.base, "a", "a-1").await;
    let id = entry_ids(&http, &inlet.base, "a").await[0];
    let inbox = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_inlet"))
            .args(["inbox", "--config"])
            .arg(dir.path().join("inlet.toml"))
            .args(args)
            .env("USER", "carla")
            .envs(TOKEN_ENV)
            .output()
            .unwrap()
    };
    let out = inbox(&["requeue", &id.to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = inbox(&["audit"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let line = text.lines().find(|l| l.contains("requeue")).unwrap_or_else(|| panic!("no requeue line:\n{text}"));
    assert!(line.contains("cli:carla") && line.contains(&format!("entry {id}")) && line.contains("ok"), "{line}");
    let (_, audit) = get(&http, &format!("{}/api/audit", inlet.base), Some(ROOT)).await;
    assert_eq!(audit["audit"][0]["actor"], "cli:carla", "{audit}");
}

/// A page in the developer's browser posts a form to Inlet: the browser adds the
/// page's cookies and `Origin`, never an `Authorization` header.
fn cross_site_form(http: &reqwest::Client, url: &str) -> reqwest::RequestBuilder {
    http.post(url)
        .header("content-type", "application/x-www-form-urlencoded")
        .header("cookie", format!("session={ROOT}; token={ROOT}"))
        .header("origin", "https://evil.example")
        .header("sec-fetch-site", "cross-site")
        .body(format!("token={ROOT}&reason=x"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_site_form_post_changes_nothing() {
    // Token mode: cookies and form fields are no credentials.
    let dir = tempfile::tempdir().unwrap();
    let inlet = spawn(dir.path(), &token_section(dir.path()), &TOKEN_ENV).await;
    let (http, base) = (reqwest::Client::new(), inlet.base.clone());
    push_undecodable(&http, &base, "a", "a-1").await;
    let id = entry_ids(&http, &base, "a").await[0];
    let before = state(&entry(&http, &base, id).await);
    let r = cross_site_form(&http, &format!("{base}/api/entries/{id}/requeue?token={ROOT}")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let r = cross_site_form(&http, &format!("{base}/api/reload")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(state(&entry(&http, &base, id).await), before, "nothing changed");
    let (_, audit) = get(&http, &format!("{base}/api/audit"), Some(ROOT)).await;
    assert_eq!(audit["audit"], serde_json::json!([]));
    drop(inlet);

    // Loopback mode: no token needed from 127.0.0.1, but not from a browser page
    // (cross-site markers) nor through DNS rebinding (a foreign Host).
    let dir = tempfile::tempdir().unwrap();
    let inlet = spawn(dir.path(), "[admin]\nauth = \"none-loopback\"\n\n", &[]).await;
    let base = inlet.base.clone();
    push_undecodable(&http, &base, "a", "a-1").await;
    let (status, body) = get(&http, &format!("{base}/api/entries?route=a"), None).await;
    assert_eq!(status, 200, "{body}");
    let id = body["entries"][0]["id"].as_i64().unwrap();
    let show = |id: i64| {
        let (http, base) = (http.clone(), base.clone());
        async move { get(&http, &format!("{base}/api/entries/{id}"), None).await.1 }
    };
    let before = state(&show(id).await);
    let requeue = format!("{base}/api/entries/{id}/requeue");
    assert_eq!(cross_site_form(&http, &requeue).send().await.unwrap().status(), 403);
    let origin_only = http.post(&requeue).header("origin", "null").send().await.unwrap();
    assert_eq!(origin_only.status(), 403, "any Origin marks a browser");
    let rebound = http.post(&requeue).header("host", "evil.example:8080").send().await.unwrap();
    assert_eq!(rebound.status(), 403, "a DNS-rebinding page sends its own Host");
    assert_eq!(state(&show(id).await), before, "nothing changed");
    assert_eq!(post(&http, &requeue, None).await, 200, "a local tool without browser markers is let in");
    let (_, audit) = get(&http, &format!("{base}/api/audit"), None).await;
    assert_eq!(audit["audit"].as_array().unwrap().len(), 1, "{audit}");
    assert_eq!(audit["audit"][0]["actor"], "loopback");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_listens_apart_from_push_when_configured() {
    let dir = tempfile::tempdir().unwrap();
    let admin_listen = format!("127.0.0.1:{}", free_port());
    let fields = format!("listen = \"{admin_listen}\"\nmetrics_need_token = true\n");
    let sections = token_section_with(dir.path(), &fields);
    let inlet = spawn(dir.path(), &sections, &TOKEN_ENV).await;
    let (http, push_base, admin_base) = (reqwest::Client::new(), inlet.base.clone(), format!("http://{admin_listen}"));
    wait_until("the admin listener answers", WAIT, || {
        let (http, url) = (http.clone(), format!("{admin_base}/healthz"));
        async move { http.get(url).send().await.is_ok_and(|r| r.status().is_success()) }
    })
    .await;

    push_undecodable(&http, &push_base, "a", "a-1").await;
    for path in ["/api/entries", "/api/audit", "/metrics"] {
        let (status, _) = get(&http, &format!("{push_base}{path}"), Some(ROOT)).await;
        assert_eq!(status, 404, "{path} is not served on the push port");
    }
    assert_eq!(post(&http, &format!("{push_base}/api/reload"), Some(ROOT)).await, 404);
    assert_eq!(get(&http, &format!("{push_base}/readyz"), None).await.0, 200, "probes stay on both");

    let (status, body) = get(&http, &format!("{admin_base}/api/entries"), Some(ROOT)).await;
    assert_eq!((status, body["entries"].as_array().map(Vec::len)), (200, Some(1)), "{body}");
    let envelope = push_envelope(b"{}", &[], "x");
    let r = http
        .post(format!("{admin_base}/push/a"))
        .header("content-type", "application/json")
        .body(envelope.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "no pushes on the admin port");
    assert_eq!(get(&http, &format!("{admin_base}/metrics"), None).await.0, 401, "metrics need a token here");
    let metrics = http.get(format!("{admin_base}/metrics")).bearer_auth(VIEWER_A).send().await.unwrap();
    assert_eq!(metrics.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_to_a_pull_route_is_not_found() {
    let plugin = plugin_path("work_order");
    // The pull source points at a port nobody listens on: it keeps reconnecting,
    // which does not matter here.
    let routes = format!(
        "[admin]\nauth = \"none-loopback\"\n\n\
         [[route]]\nname = \"pulled\"\nplugin = \"{}\"\n\
         source = {{ kind = \"pubsub\", subscription = \"projects/p/subscriptions/s\" }}\ntarget = {{ kind = \"log\" }}\n",
        plugin.display()
    );
    let instance = start_on_sqlite(&routes, |o| {
        o.pubsub = inlet::pubsub_client::Connection::emulator(&format!("127.0.0.1:{}", free_port()));
    })
    .await;
    let http = reqwest::Client::new();
    let envelope = push_envelope(br#"{"workOrderId":"k","completedItems":1,"completionTimestamp":"t"}"#, &[], "m-1");
    let r = http
        .post(format!("{}/push/pulled", instance.base()))
        .header("content-type", "application/json")
        .body(envelope.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let (_, body) = get(&http, &format!("{}/api/entries", instance.base()), None).await;
    assert_eq!(body["entries"], serde_json::json!([]), "nothing stored");
    instance.running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_stay_out_of_check_errors_debug_and_last_error() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = plugin_path("work_order");
    let closed = free_port();
    let file = dir.path().join("inlet.toml");
    std::fs::write(
        &file,
        format!(
            "[store]\nurl = \"postgres://u:pg-secret-1@db.internal:5432/inlet\"\n\n\
             [[route]]\nname = \"r\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\n\
             target = {{ kind = \"http\", url = \"http://127.0.0.1:{closed}/x?token=url-secret-2\", headers = {{ authorization = \"Bearer ${{HDR_TOKEN}}\" }} }}\n",
            plugin.display()
        ),
    )
    .unwrap();
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_inlet"))
        .arg("check")
        .arg(&file)
        .env("HDR_TOKEN", "hdr-secret-3")
        .output()
        .unwrap();
    let printed = format!("{}{}", String::from_utf8_lossy(&check.stdout), String::from_utf8_lossy(&check.stderr));
    assert!(check.status.success(), "{printed}");
    assert!(printed.contains("postgres://u:***@db.internal:5432/inlet"), "{printed}");
    for secret in ["pg-secret-1", "url-secret-2", "hdr-secret-3"] {
        assert!(!printed.contains(secret), "`inlet check` printed {secret}:\n{printed}");
    }

    // Debug of the loaded configuration, and a configuration error naming a URL.
    let env = |name: &str| (name == "HDR_TOKEN").then(|| "hdr-secret-3".to_string());
    let text = std::fs::read_to_string(&file).unwrap();
    let config = inlet::config::Config::from_str(&file, &text, &env).unwrap();
    let debug = format!("{config:?}");
    for secret in ["pg-secret-1", "url-secret-2", "hdr-secret-3"] {
        assert!(!debug.contains(secret), "Debug shows {secret}: {debug}");
    }
    let broken = text.replace("postgres://", "mysql://");
    let errors = inlet::config::Config::from_str(&file, &broken, &env).unwrap_err().to_string();
    assert!(errors.contains("mysql://u:***@db.internal") && !errors.contains("pg-secret-1"), "{errors}");

    // A failed delivery to a URL with a secret in its query.
    let routes = format!(
        "[admin]\nauth = \"none-loopback\"\n\n[[route]]\nname = \"r\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\n\
         target = {{ kind = \"http\", url = \"http://127.0.0.1:{closed}/x?token=url-secret-2\", timeout = \"2s\" }}\n",
        plugin.display()
    );
    let instance = start_on_sqlite(&routes, |_| {}).await;
    let http = reqwest::Client::new();
    let envelope = push_envelope(br#"{"workOrderId":"k","completedItems":1,"completionTimestamp":"t"}"#, &[], "m-1");
    let r = http
        .post(format!("{}/push/r", instance.base()))
        .header("content-type", "application/json")
        .body(envelope.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let store = std::sync::Arc::clone(&instance.running.shared.store);
    let last_error = wait_for("a failed attempt", WAIT, || {
        let store = std::sync::Arc::clone(&store);
        async move {
            let filter = inlet::inbox::ListFilter { route: Some("r".into()), limit: 10, ..Default::default() };
            store.list(&filter).await.unwrap().into_iter().find_map(|e| e.last_error)
        }
    })
    .await;
    assert!(!last_error.contains("url-secret-2"), "last_error: {last_error}");
    // A transport error names the target by its origin only (tests/redirects.rs has the
    // path's secrets): the target is still recognisable by host and port.
    assert!(!last_error.contains("/x"), "last_error names the path: {last_error}");
    assert!(
        last_error.contains(&format!("http://127.0.0.1:{closed}")),
        "the target is still recognisable: {last_error}"
    );
    instance.running.stop().await;
}

#[test]
fn check_warns_about_open_pushes_and_an_admin_api_without_tokens_on_a_network() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = plugin_path("work_order");
    let route = |name: &str, auth: &str| {
        format!(
            "[[route]]\nname = \"{name}\"\nplugin = \"{}\"\nsource = {{ kind = \"push\"{auth} }}\ntarget = {{ kind = \"log\" }}\n\n",
            plugin.display()
        )
    };
    let verified = ", auth = { audience = \"https://inlet.test\", service_account = \"sa@p.iam.gserviceaccount.com\" }";
    let file = dir.path().join("inlet.toml");
    std::fs::write(
        &file,
        format!(
            "[server]\nlisten = \"0.0.0.0:8080\"\n\n{}{}{}",
            route("open", ""),
            route("explicit", ", auth = \"none\""),
            route("verified", verified)
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inlet")).arg("check").arg(&file).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "warnings do not fail the check: {stderr}");
    let warned =
        |route: &str| stderr.lines().any(|l| l.starts_with("warning:") && l.contains(&format!("route `{route}`")));
    assert!(warned("open") && warned("explicit"), "{stderr}");
    assert!(!warned("verified"), "{stderr}");
    assert!(stderr.contains("no [[admin.token]] defined"), "{stderr}");
}

/// A push request as a page sends it after rebinding its own name to Inlet's address
/// (`host`), or from another site (`origin`).
async fn push_as(
    http: &reqwest::Client,
    base: &str,
    route: &str,
    id: &str,
    host: Option<&str>,
    origin: Option<&str>,
) -> (u16, Value) {
    let mut req = http.post(format!("{base}/push/{route}")).header("content-type", "application/json").body(
        push_envelope(
            format!(r#"{{"workOrderId":"{id}","completedItems":1,"completionTimestamp":"t"}}"#).as_bytes(),
            &[],
            id,
        )
        .to_string(),
    );
    if let Some(h) = host {
        req = req.header("host", h);
    }
    if let Some(o) = origin {
        req = req.header("origin", o);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, serde_json::from_str(&r.text().await.unwrap()).unwrap_or(Value::Null))
}

/// Message ids of a route's entries, as the unrestricted admin sees them.
async fn message_ids(http: &reqwest::Client, base: &str, route: &str) -> Vec<String> {
    let (status, body) = get(http, &format!("{base}/api/entries?route={route}"), Some(ROOT)).await;
    assert_eq!(status, 200, "{body}");
    let mut ids: Vec<String> =
        body["entries"].as_array().unwrap().iter().map(|e| e["message_id"].as_str().unwrap().to_string()).collect();
    ids.sort();
    ids
}

/// DNS rebinding. A page the developer opens rebinds its name
/// (`evil.example`) to 127.0.0.1: its pushes carry `Host: evil.example` and `Origin`.
/// To a route without push auth, each of the two alone is refused (403) and nothing
/// is stored; the probes and `/metrics` do not answer that name either. Loopback and
/// a configured public name are served. In `none-loopback` mode every endpoint
/// refuses the foreign name, the console included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebinding_page_can_neither_push_nor_read_the_probes() {
    let dir = tempfile::tempdir().unwrap();
    let sections = format!("[server]\npublic_hosts = [\"inlet.example.com\"]\n\n{}", token_section(dir.path()));
    let inlet = spawn(dir.path(), &sections, &TOKEN_ENV).await;
    let (http, base) = (reqwest::Client::new(), inlet.base.clone());
    let port = base.rsplit(':').next().unwrap().to_string();
    let evil = format!("evil.example:{port}");

    let (status, body) = push_as(&http, &base, "a", "rebound-both", Some(&evil), Some("http://evil.example")).await;
    assert_eq!((status, body["reason"].as_str()), (403, Some("origin")), "{body}");
    let (status, body) = push_as(&http, &base, "a", "rebound-host", Some(&evil), None).await;
    assert_eq!((status, body["reason"].as_str()), (403, Some("foreign_host")), "{body}");
    let (status, body) = push_as(&http, &base, "a", "cross-origin", None, Some("http://evil.example")).await;
    assert_eq!((status, body["reason"].as_str()), (403, Some("origin")), "{body}");
    let (status, body) = push_as(&http, &base, "a", "subdomain", Some("inlet.example.com.evil.example"), None).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(message_ids(&http, &base, "a").await, Vec::<String>::new(), "no row for a refused push");

    let (status, body) = push_as(&http, &base, "a", "loopback", None, None).await;
    assert_eq!(status, 200, "a push to 127.0.0.1: {body}");
    let (status, body) = push_as(&http, &base, "a", "localhost", Some(&format!("localhost:{port}")), None).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = push_as(&http, &base, "a", "public", Some("Inlet.Example.Com"), None).await;
    assert_eq!(status, 200, "a configured public name: {body}");
    assert_eq!(message_ids(&http, &base, "a").await, ["localhost", "loopback", "public"]);

    for path in ["/healthz", "/readyz", "/metrics"] {
        let r = http.get(format!("{base}{path}")).header("host", &evil).send().await.unwrap();
        assert_eq!(r.status(), 403, "{path} under a rebound name");
        let r = http.get(format!("{base}{path}")).header("origin", "http://evil.example").send().await.unwrap();
        assert_eq!(r.status(), 403, "{path} from another site");
        assert_eq!(http.get(format!("{base}{path}")).send().await.unwrap().status(), 200, "{path} to 127.0.0.1");
    }
    let metrics = http.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    let count = |reason: &str| {
        let series = format!("inlet_listener_refused_total{{listener=\"server\",reason=\"{reason}\"}} ");
        metrics.lines().find_map(|l| l.strip_prefix(&series)).map_or(0, |v| v.trim().parse::<u64>().unwrap())
    };
    assert_eq!((count("foreign_host"), count("origin")), (5, 5), "{metrics}");
    // A token-holding API call is not a page's: the token binds it.
    let r = http.get(format!("{base}/api/entries")).header("host", &evil).bearer_auth(ROOT).send().await.unwrap();
    assert_eq!(r.status(), 200, "token mode: the API's bearer token is the credential");
    drop(inlet);

    // none-loopback: no credential at all, so every endpoint answers only its names.
    let dir = tempfile::tempdir().unwrap();
    let inlet = spawn(dir.path(), "[admin]\nauth = \"none-loopback\"\n\n", &[]).await;
    let base = inlet.base.clone();
    let port = base.rsplit(':').next().unwrap().to_string();
    let evil = format!("evil.example:{port}");
    for path in ["/api/entries", "/console/login", "/console", "/healthz", "/metrics"] {
        let r = http.get(format!("{base}{path}")).header("host", &evil).send().await.unwrap();
        assert_eq!(r.status(), 403, "{path} under a rebound name in none-loopback mode");
    }
    let r = http
        .post(format!("{base}/console/login"))
        .header("host", &evil)
        .header("origin", "http://evil.example")
        .form(&[("token", "x")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "a rebound sign-in");
    let (status, _) = push_as(&http, &base, "b", "rebound", Some(&evil), None).await;
    assert_eq!(status, 403);
    let (status, body) = get(&http, &format!("{base}/api/entries"), None).await;
    assert_eq!((status, body["entries"].as_array().map(Vec::len)), (200, Some(0)), "nothing stored: {body}");
    let r = http.get(format!("{base}/console/login")).send().await.unwrap();
    assert_eq!(r.status(), 200, "the console answers to 127.0.0.1");
}
