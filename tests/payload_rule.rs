//! The payload rule of the admin API and the web console: a token without `payloads`
//! reads no payload, no digest of one, and no text that may quote one (an entry's
//! `last_error`, the attempts' reasons, failure-group examples and fingerprints, the
//! `text` of repair jobs), and may not search error texts. Proven by a crawl: a
//! marker sits inside payloads where the work-order plugin's decode error quotes it
//! and where a target echoes it into its answer; every API endpoint and console page
//! is then read as a viewer and as an operator without `payloads`, and neither the
//! marker, nor a payload's digest, nor a fingerprint's words are in any answer, while
//! a viewer with `payloads` (the control) reads them where they are. Also: `/metrics`
//! shows a token limited to some routes only their series. Inlet runs as a real
//! process on a real SQLite inbox with the real compiled plugin; requests are real
//! HTTP.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::http::StatusCode;
use inlet_testkit::paths::plugin_path;
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use inlet_testkit::push::{push_envelope, send_push};
use inlet_testkit::wait::wait_for;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);
/// What must not come back to a reader without `payloads`.
const MARKER: &str = "CARD-4111111111111111";
const DIGITS: &str = "4111111111111111";
const WITHHELD: &str = "withheld: this token may not read payloads";

const PEEK: &str = "peek-viewer-token-0123456789";
const BLIND_OPS: &str = "blind-operator-token-0123456789";
const READER: &str = "reader-viewer-token-0123456789";
const ROOT: &str = "root-admin-token-0123456789ab";
const TOKEN_ENV: [(&str, &str); 4] =
    [("T_PEEK", PEEK), ("T_BLIND_OPS", BLIND_OPS), ("T_READER", READER), ("T_ROOT", ROOT)];

/// A target that refuses every request and quotes it back: 500 (retried later) for a
/// work order whose id starts with `retry-`, 422 (parked by the plugin) otherwise.
async fn echoing_target() -> String {
    let app = axum::Router::new().fallback(|body: axum::body::Bytes| async move {
        let text = String::from_utf8_lossy(&body).into_owned();
        let status = if text.contains("\"retry-") {
            StatusCode::INTERNAL_SERVER_ERROR
        } else {
            StatusCode::UNPROCESSABLE_ENTITY
        };
        (status, format!("refused: {text}"))
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

/// A viewer without payloads (`peek`), an operator without them (`blind-ops`), a
/// viewer with them (`reader`, the control) and an admin; routes `orders` (to the
/// echoing target, with the hostile plugin in shadow: it decodes every payload whole
/// into its event, so the shadow's samples hold the marker) and `other` (a log target).
fn write_config(dir: &Path, target: &str, admin_fields: &str) -> PathBuf {
    let plugin = plugin_path("work_order");
    let candidate = plugin_path("hostile");
    let config = format!(
        "[store]\nurl = \"sqlite://inbox.db\"\n\n\
         [admin]\n{admin_fields}\
         [[admin.token]]\nname = \"peek\"\nrole = \"viewer\"\nsecret = \"${{T_PEEK}}\"\n\
         [[admin.token]]\nname = \"blind-ops\"\nrole = \"operator\"\npayloads = false\nsecret = \"${{T_BLIND_OPS}}\"\n\
         [[admin.token]]\nname = \"reader\"\nrole = \"viewer\"\npayloads = true\nsecret = \"${{T_READER}}\"\n\
         [[admin.token]]\nname = \"root\"\nrole = \"admin\"\nsecret = \"${{T_ROOT}}\"\n\n\
         [[route]]\nname = \"orders\"\nplugin = \"{p}\"\ncandidate = \"{c}\"\nsource = {{ kind = \"push\" }}\n\
         target = {{ kind = \"http\", url = \"{target}\", timeout = \"5s\" }}\n\
         retry = {{ initial = \"1h\", max = \"1h\" }}\n\n\
         [[route]]\nname = \"other\"\nplugin = \"{p}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"log\" }}\n",
        p = plugin.display(),
        c = candidate.display(),
    );
    let path = dir.join("inlet.toml");
    std::fs::write(&path, config).unwrap();
    path
}

async fn spawn(dir: &Path, target: &str, admin_fields: &str) -> InletProcess {
    let config = write_config(dir, target, admin_fields);
    let listen = format!("127.0.0.1:{}", free_port());
    let mut inlet = InletProcess::spawn_with_args(&config, &["--listen", &listen, "--poll", "20ms"], &TOKEN_ENV);
    inlet.wait_healthy(WAIT).await;
    inlet
}

/// Pushes `payload`; returns the hex SHA-256 of the bytes pushed (`payload_digest`).
async fn push(http: &reqwest::Client, base: &str, route: &str, payload: &Value, id: &str) -> String {
    push_with(http, base, route, payload, id, &[]).await
}

async fn push_with(
    http: &reqwest::Client,
    base: &str,
    route: &str,
    payload: &Value,
    id: &str,
    attributes: &[(&str, &str)],
) -> String {
    use sha2::Digest as _;
    let data = payload.to_string();
    let envelope = push_envelope(data.as_bytes(), attributes, id);
    let r = send_push(http, base, route, &envelope).await;
    assert_eq!(r.status(), 200, "push {id}: {}", r.text().await.unwrap());
    sha2::Sha256::digest(data.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// One answer: what was asked, its status and its body as text.
struct Answer {
    asked: String,
    status: u16,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{}: not JSON ({e}): {}", self.asked, self.body))
    }
}

async fn send(asked: String, req: reqwest::RequestBuilder) -> Answer {
    let r = req.send().await.unwrap_or_else(|e| panic!("{asked}: {e}"));
    let status = r.status().as_u16();
    Answer { asked, status, body: r.text().await.unwrap() }
}

async fn api_get(http: &reqwest::Client, base: &str, path: &str, token: &str) -> Answer {
    send(format!("GET {path} as {token}"), http.get(format!("{base}{path}")).bearer_auth(token)).await
}

async fn api_post(http: &reqwest::Client, base: &str, path: &str, token: &str, body: &Value) -> Answer {
    let req = http
        .post(format!("{base}{path}"))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body.to_string());
    send(format!("POST {path} {body} as {token}"), req).await
}

/// A signed-in console session: its cookie and CSRF token.
struct Session {
    cookie: String,
    csrf: String,
}

async fn sign_in(http: &reqwest::Client, base: &str, token: &str) -> Session {
    let r = http.post(format!("{base}/console/login")).form(&[("token", token)]).send().await.unwrap();
    assert_eq!(r.status(), 303, "sign-in as {token}");
    let set = r.headers()["set-cookie"].to_str().unwrap().to_string();
    let cookie = set.split(';').next().unwrap().to_string();
    let page = http.get(format!("{base}/console")).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let page = page.text().await.unwrap();
    let csrf = page
        .split(r#"name="csrf" value=""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no CSRF field on the console page: {page}"))
        .to_string();
    Session { cookie, csrf }
}

async fn page(http: &reqwest::Client, base: &str, path: &str, session: &Session) -> Answer {
    send(format!("GET {path} (console)"), http.get(format!("{base}{path}")).header("cookie", &session.cookie)).await
}

async fn page_post(http: &reqwest::Client, base: &str, path: &str, session: &Session, form: &[(&str, &str)]) -> Answer {
    let mut fields = vec![("csrf", session.csrf.as_str())];
    fields.extend_from_slice(form);
    let req = http.post(format!("{base}{path}")).header("cookie", &session.cookie).form(&fields);
    send(format!("POST {path} {form:?} (console)"), req).await
}

/// Every answer a token gets from a crawl of the API and the console: the GET
/// endpoints with realistic ids and filters, the repair dry runs, and every page.
/// Returns the answers and the GET path templates of the API it covered.
async fn crawl(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    ids: &[i64],
    fingerprints: &[String],
) -> (Vec<Answer>, BTreeSet<&'static str>) {
    let mut out = Vec::new();
    let mut covered = BTreeSet::new();
    let q = |s: &str| url_encode(s);
    let mut entry_lists = vec![
        "/api/entries".to_string(),
        "/api/entries?route=orders".into(),
        "/api/entries?status=parked".into(),
        "/api/entries?status=open".into(),
        "/api/entries?route=orders&status=parked&limit=1".into(),
        "/api/entries?key=wo-echo".into(),
        "/api/entries?after=0&limit=2".into(),
        format!("/api/entries?text={}", q(MARKER)),
        "/api/entries?text=CARD-41".into(),
    ];
    entry_lists.extend(fingerprints.iter().map(|f| format!("/api/entries?route=orders&fingerprint={}", q(f))));
    for path in entry_lists {
        out.push(api_get(http, base, &path, token).await);
    }
    covered.insert("/api/entries");
    for id in ids {
        out.push(api_get(http, base, &format!("/api/entries/{id}"), token).await);
    }
    covered.insert("/api/entries/{id}");
    for path in ["/api/failures", "/api/failures?route=orders", "/api/failures?limit=1"] {
        out.push(api_get(http, base, path, token).await);
    }
    covered.insert("/api/failures");
    out.push(api_get(http, base, "/api/repairs", token).await);
    covered.insert("/api/repairs");
    out.push(api_get(http, base, "/api/routes", token).await);
    covered.insert("/api/routes");
    out.push(api_get(http, base, "/api/routes/orders/shadow", token).await);
    covered.insert("/api/routes/{name}/shadow");
    out.push(api_get(http, base, "/api/routes/orders/replays", token).await);
    covered.insert("/api/routes/{name}/replays");
    for path in ["/api/replays/1", "/api/replays/999999"] {
        out.push(api_get(http, base, path, token).await);
    }
    covered.insert("/api/replays/{id}");
    out.push(api_get(http, base, "/api/audit", token).await);
    covered.insert("/api/audit");
    out.push(api_get(http, base, "/api/openapi.json", token).await);
    covered.insert("/api/openapi.json");
    out.push(api_get(http, base, "/metrics", token).await);
    covered.insert("/metrics");
    for path in ["/healthz", "/readyz"] {
        out.push(send(format!("GET {path}"), http.get(format!("{base}{path}"))).await);
    }
    covered.extend(["/healthz", "/readyz"]);

    // Repair dry runs: by route, by failure group, by key, and by error text.
    let mut dry_runs = vec![
        json!({"action": "requeue", "route": "orders", "dry_run": true}),
        json!({"action": "park", "route": "orders", "dry_run": true}),
        json!({"action": "requeue", "route": "orders", "key": "wo-echo", "dry_run": true, "now": true}),
        json!({"action": "requeue", "route": "orders", "text": MARKER, "dry_run": true}),
        json!({"action": "ignore", "route": "orders", "text": "CARD-41", "reason": "probe", "dry_run": true}),
    ];
    dry_runs.extend(
        fingerprints.iter().map(|f| json!({"action": "requeue", "route": "orders", "fingerprint": f, "dry_run": true})),
    );
    for body in &dry_runs {
        out.push(api_post(http, base, "/api/repairs", token, body).await);
    }

    // The console, signed in with the same token.
    let session = sign_in(http, base, token).await;
    let mut pages = vec![
        "/console".to_string(),
        "/console/failures".into(),
        "/console/failures?route=orders".into(),
        "/console/entries".into(),
        "/console/entries?route=orders".into(),
        "/console/entries?route=orders&status=parked".into(),
        "/console/entries?status=open".into(),
        "/console/entries?key=wo-echo".into(),
        format!("/console/entries?text={}", q(MARKER)),
        "/console/entries?route=orders&text=CARD-41".into(),
        "/console/repairs".into(),
        "/console/audit".into(),
        "/console/login".into(),
        "/console/routes/orders/shadow".into(),
    ];
    pages.extend(fingerprints.iter().map(|f| format!("/console/entries?route=orders&fingerprint={}", q(f))));
    pages.extend(ids.iter().map(|id| format!("/console/entries/{id}")));
    for path in pages {
        out.push(page(http, base, &path, &session).await);
    }
    let mut previews: Vec<Vec<(&str, &str)>> = vec![
        vec![("step", "preview"), ("action", "requeue"), ("route", "orders")],
        vec![("step", "preview"), ("action", "requeue"), ("route", "orders"), ("text", MARKER)],
        vec![("step", "preview"), ("action", "ignore"), ("route", "orders"), ("text", "CARD-41"), ("reason", "probe")],
    ];
    previews.extend(
        fingerprints.iter().map(|f| {
            vec![("step", "preview"), ("action", "requeue"), ("route", "orders"), ("fingerprint", f.as_str())]
        }),
    );
    for form in &previews {
        out.push(page_post(http, base, "/console/repairs", &session, form).await);
    }
    (out, covered)
}

/// `s` percent-encoded for a query string.
fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn answer<'a>(answers: &'a [Answer], asked: &str) -> &'a Answer {
    answers.iter().find(|a| a.asked == asked).unwrap_or_else(|| panic!("no answer to {asked}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_without_payloads_reads_no_text_that_quotes_one() {
    let dir = tempfile::tempdir().unwrap();
    let target = echoing_target().await;
    let inlet = spawn(dir.path(), &target, "").await;
    let (http, base) =
        (reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap(), inlet.base.clone());

    // The plugin's decode error quotes the marker (a string where a number belongs);
    // the target quotes the request, marker and all, in its 422 (parked) and its 500
    // (retried in an hour).
    let undecodable = json!({"workOrderId": "wo-decode", "completedItems": MARKER, "completionTimestamp": "t"});
    let mut digests = vec![push(&http, &base, "orders", &undecodable, "m-decode").await];
    let parked = json!({"workOrderId": "wo-echo", "completedItems": 1, "completionTimestamp": MARKER});
    digests.push(push(&http, &base, "orders", &parked, "m-echo").await);
    let retried = json!({"workOrderId": "retry-1", "completedItems": 1, "completionTimestamp": MARKER});
    digests.push(push(&http, &base, "orders", &retried, "m-retry").await);
    // A second payload under a known dedup key: a conflict, whose dedup key ends in
    // a digest of the payload.
    let first = json!({"workOrderId": "wo-conflict", "completedItems": 1, "completionTimestamp": "t"});
    push_with(&http, &base, "other", &first, "m-c1", &[("eventId", "ev-1")]).await;
    let second = json!({"workOrderId": "wo-conflict", "completedItems": 1, "completionTimestamp": MARKER});
    digests.push(push_with(&http, &base, "other", &second, "m-c2", &[("eventId", "ev-1")]).await);
    push(
        &http,
        &base,
        "other",
        &json!({"workOrderId": "wo-other", "completedItems": 2, "completionTimestamp": "t"}),
        "m-other",
    )
    .await;

    // Wait until all three carry the marker in their error, as the admin reads them.
    let entries = wait_for("three entries failing with the marker in their error", WAIT, || {
        let http = http.clone();
        let base = base.clone();
        async move {
            let list = api_get(&http, &base, "/api/entries?route=orders", ROOT).await.json();
            let entries = list["entries"].as_array()?.clone();
            let quoting =
                entries.iter().filter(|e| e["last_error"].as_str().is_some_and(|t| t.contains(MARKER))).count();
            (quoting == 3).then_some(entries)
        }
    })
    .await;
    let by_key = |key: &str| entries.iter().find(|e| e["correlation_key"] == key).map(|e| e["id"].as_i64().unwrap());
    let echo_id = by_key("wo-echo").expect("the echoed entry was decoded");
    let retry_id = by_key("retry-1").expect("the retried entry was decoded");
    let decode_id = entries.iter().find(|e| e["correlation_key"].is_null()).unwrap()["id"].as_i64().unwrap();
    let root_view = api_get(&http, &base, &format!("/api/entries/{echo_id}"), ROOT).await.json();
    assert!(root_view["last_error"].as_str().unwrap().starts_with("camunda answered 422: refused: "), "{root_view}");
    assert!(root_view["attempts"][0]["reason"].as_str().unwrap().contains(MARKER), "{root_view}");
    let retry_view = api_get(&http, &base, &format!("/api/entries/{retry_id}"), ROOT).await.json();
    assert_eq!(retry_view["status"], "OPEN", "{retry_view}");
    assert!(retry_view["last_error"].as_str().unwrap().starts_with("target answered 500: refused: "), "{retry_view}");

    // A repair job whose filter text holds the marker (it matches nothing, moves nothing).
    let job = api_post(
        &http,
        &base,
        "/api/repairs",
        ROOT,
        &json!({"action": "park", "route": "orders", "text": format!("{MARKER}-none"), "reason": "probe"}),
    )
    .await;
    assert_eq!(job.status, 202, "{}", job.body);

    // A replay window (its reason is an operator's words, not a payload).
    let window = api_post(
        &http,
        &base,
        "/api/routes/orders/replays",
        ROOT,
        &json!({"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z", "reason": "probe"}),
    )
    .await;
    assert_eq!(window.status, 200, "{}", window.body);

    let mut ids: Vec<i64> = Vec::new();
    for route in ["orders", "other"] {
        let list = api_get(&http, &base, &format!("/api/entries?route={route}"), ROOT).await.json();
        ids.extend(list["entries"].as_array().unwrap().iter().map(|e| e["id"].as_i64().unwrap()));
    }
    ids.push(999_999);
    let groups = api_get(&http, &base, "/api/failures", ROOT).await.json();
    let fingerprints: Vec<String> =
        groups["groups"].as_array().unwrap().iter().map(|g| g["fingerprint"].as_str().unwrap().to_string()).collect();
    assert_eq!(fingerprints.len(), 4, "a group per error: {groups}");
    let other = api_get(&http, &base, "/api/entries?route=other&status=parked", ROOT).await.json();
    let conflict = &other["entries"][0];
    assert_eq!(conflict["dedup_key"], format!("ev-1#conflict-{}", &digests[3][..16]), "{other}");
    let conflict_id = conflict["id"].as_i64().unwrap();
    assert!(fingerprints.iter().all(|f| !f.contains(DIGITS)), "fingerprints mask the marker: {fingerprints:?}");
    // Without payloads, a group is named by its example entry, not its fingerprint
    // (which keeps an error's words); a long run of a fingerprint's plain words must
    // not show.
    let group_refs: Vec<String> =
        groups["groups"].as_array().unwrap().iter().map(|g| format!("entry:{}", g["example_id"])).collect();
    let words: Vec<String> = fingerprints
        .iter()
        .map(|f| {
            let runs = f.split(|c: char| "\"'`<>&\\".contains(c));
            runs.max_by_key(|r| r.len()).unwrap().to_string()
        })
        .collect();
    assert!(words.iter().all(|w| w.len() >= 20), "{words:?}");

    // The candidate's differences, the marker in both sides of their samples.
    wait_for("the shadow's samples of the three marked messages", WAIT, || {
        let http = http.clone();
        let base = base.clone();
        async move {
            let report = api_get(&http, &base, "/api/routes/orders/shadow", ROOT).await.json();
            let differing = report["counts"]["decode"]["differing"].as_u64()?;
            (differing >= 3 && report.to_string().contains(MARKER)).then_some(())
        }
    })
    .await;

    // The control: a viewer with payloads reads the marker where it is.
    let (control, covered) = crawl(&http, &base, READER, &ids, &fingerprints).await;
    for asked in [
        format!("GET /api/entries/{decode_id} as {READER}"),
        format!("GET /api/entries/{echo_id} as {READER}"),
        format!("GET /api/entries/{retry_id} as {READER}"),
        format!("GET /api/entries?route=orders as {READER}"),
        format!("GET /api/failures as {READER}"),
        format!("GET /api/repairs as {READER}"),
        format!("GET /console/entries/{decode_id} (console)"),
        format!("GET /console/entries/{echo_id} (console)"),
        "GET /console/entries?route=orders (console)".to_string(),
        "GET /console/failures (console)".to_string(),
        "GET /console/repairs (console)".to_string(),
        format!("GET /api/routes/orders/shadow as {READER}"),
        "GET /console/routes/orders/shadow (console)".to_string(),
    ] {
        let a = answer(&control, &asked);
        assert_eq!(a.status, 200, "{asked}: {}", a.body);
        assert!(a.body.contains(MARKER), "the control reads the marker in {asked}: {}", a.body);
    }
    let echo = answer(&control, &format!("GET /api/entries/{echo_id} as {READER}")).json();
    assert_eq!(echo["payload_digest"], digests[1], "{echo}");
    let shown = answer(&control, &format!("GET /api/entries/{conflict_id} as {READER}")).json();
    assert_eq!(shown["dedup_key"], conflict["dedup_key"], "{shown}");
    let text_search = answer(&control, &format!("GET /api/entries?text=CARD-41 as {READER}")).json();
    assert_eq!(text_search["entries"].as_array().unwrap().len(), 3, "the control may search errors: {text_search}");
    let echo = answer(&control, &format!("GET /api/entries/{echo_id} as {READER}")).json();
    assert!(echo["attempts"][0]["reason"].as_str().unwrap().contains(MARKER), "{echo}");

    // Every GET endpoint the API describes was crawled.
    let doc: Value = serde_json::from_str(inlet::admin::openapi::OPENAPI).unwrap();
    let described: BTreeSet<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, ops)| ops.get("get").is_some())
        .map(|(path, _)| path.as_str())
        .collect();
    let missed: Vec<_> = described.difference(&covered).collect();
    assert!(missed.is_empty(), "GET endpoints the crawl misses: {missed:?}");

    let control_groups = answer(&control, &format!("GET /api/failures as {READER}"));
    assert!(words.iter().all(|w| control_groups.body.contains(w.as_str())), "{}", control_groups.body);

    // Without payloads, as a viewer and as an operator: the marker is nowhere.
    let blind_groups: Vec<String> = fingerprints.iter().chain(&group_refs).cloned().collect();
    for token in [PEEK, BLIND_OPS] {
        let (answers, _) = crawl(&http, &base, token, &ids, &blind_groups).await;
        assert!(answers.len() > 50, "{} answers", answers.len());
        for a in &answers {
            assert!(
                !a.body.contains(MARKER) && !a.body.contains(DIGITS),
                "{} ({}) shows the payload's marker: {}",
                a.asked,
                a.status,
                a.body
            );
            for w in &words {
                assert!(!a.body.contains(w.as_str()), "{} ({}) shows a fingerprint: {}", a.asked, a.status, a.body);
            }
            for digest in &digests {
                assert!(
                    !a.body.contains(&digest[..16]),
                    "{} ({}) shows a payload digest: {}",
                    a.asked,
                    a.status,
                    a.body
                );
            }
        }
        // The crawl read what there is to read: the entries, withheld where they quote.
        let shown = answer(&answers, &format!("GET /api/entries/{echo_id} as {token}"));
        assert_eq!(shown.status, 200, "{}", shown.body);
        let shown = shown.json();
        assert_eq!(shown["last_error"], WITHHELD, "{shown}");
        assert_eq!(shown["attempts"][0]["reason"], WITHHELD, "{shown}");
        assert_eq!(shown["attempts"][0]["requests"][0]["status"], 422, "{shown}");
        assert_eq!(shown["raw_data"]["withheld"], "this token may not read payloads", "{shown}");
        assert_eq!(shown["payload_digest"], WITHHELD, "{shown}");
        let conflict = answer(&answers, &format!("GET /api/entries/{conflict_id} as {token}")).json();
        assert_eq!(conflict["dedup_key"], "ev-1#conflict-withheld", "{conflict}");
        let listed = answer(&answers, &format!("GET /api/entries?route=orders as {token}")).json();
        assert_eq!(listed["entries"].as_array().unwrap().len(), 3, "{listed}");
        let failures = answer(&answers, &format!("GET /api/failures as {token}")).json();
        assert_eq!(failures["groups"].as_array().unwrap().len(), 4, "{failures}");
        assert!(failures["groups"].as_array().unwrap().iter().all(|g| g["example_error"] == WITHHELD), "{failures}");
        let named: BTreeSet<&str> =
            failures["groups"].as_array().unwrap().iter().map(|g| g["fingerprint"].as_str().unwrap()).collect();
        assert_eq!(named, group_refs.iter().map(String::as_str).collect(), "{failures}");
        // A group is listed by its example entry; a fingerprint, guessed or not, is refused.
        let group =
            answer(&answers, &format!("GET /api/entries?route=orders&fingerprint=entry%3A{echo_id} as {token}"));
        let group = group.json();
        assert_eq!(group["entries"].as_array().map(Vec::len), Some(1), "{group}");
        assert_eq!(group["entries"][0]["id"], echo_id, "{group}");
        for f in &fingerprints {
            let asked = format!("GET /api/entries?route=orders&fingerprint={} as {token}", url_encode(f));
            assert_eq!(answer(&answers, &asked).status, 403, "{asked}");
        }
        let group_page =
            answer(&answers, &format!("GET /console/entries?route=orders&fingerprint=entry%3A{echo_id} (console)"));
        assert!(group_page.body.contains(r#"<strong id="match-total">1</strong>"#), "{}", group_page.body);
        let jobs = answer(&answers, &format!("GET /api/repairs as {token}")).json();
        assert_eq!(jobs["jobs"][0]["filter"]["text"], WITHHELD, "{jobs}");
        // Searching error texts is refused, in the API and the console.
        for asked in
            [format!("GET /api/entries?text=CARD-41 as {token}"), format!("GET /api/entries?text={MARKER} as {token}")]
        {
            let a = answer(&answers, &asked);
            assert_eq!(a.status, 403, "{asked}: {}", a.body);
        }
        assert_eq!(answer(&answers, "GET /console/entries?route=orders&text=CARD-41 (console)").status, 403);
        let list_page = answer(&answers, "GET /console/entries?route=orders (console)");
        assert_eq!(list_page.status, 200);
        assert!(list_page.body.contains(WITHHELD) && !list_page.body.contains(r#"name="text""#), "{}", list_page.body);
        let entry_page = answer(&answers, &format!("GET /console/entries/{echo_id} (console)"));
        assert_eq!(entry_page.status, 200);
        assert!(entry_page.body.contains(WITHHELD), "{}", entry_page.body);
        let failures_page = answer(&answers, "GET /console/failures (console)");
        assert!(failures_page.status == 200 && failures_page.body.contains("group-link"), "{}", failures_page.body);
    }

    // The operator's dry runs answer, except by error text; the viewer's are refused.
    let (answers, _) = crawl(&http, &base, BLIND_OPS, &ids, &blind_groups).await;
    let dry = |body: Value| format!("POST /api/repairs {body} as {BLIND_OPS}");
    let by_route = answer(&answers, &dry(json!({"action": "requeue", "route": "orders", "dry_run": true})));
    assert_eq!((by_route.status, by_route.json()["matches"]["count"].as_i64()), (200, Some(2)), "{}", by_route.body);
    let by_text =
        answer(&answers, &dry(json!({"action": "requeue", "route": "orders", "text": MARKER, "dry_run": true})));
    assert_eq!(by_text.status, 403, "{}", by_text.body);
    let group = format!("entry:{echo_id}");
    let by_group =
        answer(&answers, &dry(json!({"action": "requeue", "route": "orders", "fingerprint": group, "dry_run": true})));
    assert_eq!((by_group.status, by_group.json()["matches"]["count"].as_i64()), (200, Some(1)), "{}", by_group.body);
    assert_eq!(by_group.json()["filter"]["fingerprint"], group, "{}", by_group.body);
    let preview = answer(
        &answers,
        "POST /console/repairs [(\"step\", \"preview\"), (\"action\", \"requeue\"), (\"route\", \"orders\")] (console)",
    );
    assert!(preview.status == 200 && preview.body.contains("dry-run-count"), "{}", preview.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_a_route_limited_token_only_its_routes() {
    let dir = tempfile::tempdir().unwrap();
    let target = echoing_target().await;
    // `peek` is limited to `orders` here.
    let config = write_config(dir.path(), &target, "metrics_need_token = true\n").display().to_string();
    let text = std::fs::read_to_string(&config).unwrap().replacen(
        "role = \"viewer\"\nsecret = \"${T_PEEK}\"\n",
        "role = \"viewer\"\nsecret = \"${T_PEEK}\"\nroutes = [\"orders\"]\n",
        1,
    );
    std::fs::write(&config, text).unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut inlet =
        InletProcess::spawn_with_args(Path::new(&config), &["--listen", &listen, "--poll", "20ms"], &TOKEN_ENV);
    inlet.wait_healthy(WAIT).await;
    let (http, base) = (reqwest::Client::new(), inlet.base.clone());
    push(
        &http,
        &base,
        "other",
        &json!({"workOrderId": "wo-other", "completedItems": 2, "completionTimestamp": "t"}),
        "m-1",
    )
    .await;

    assert_eq!(send("GET /metrics".into(), http.get(format!("{base}/metrics"))).await.status, 401);
    // The limited scrape comes first: series appear while the process warms up (the inbox
    // gauges once this instance takes the publisher's turn) and none goes away, so every
    // series the limited token read is still there when the unrestricted one reads after it.
    let limited = api_get(&http, &base, "/metrics", PEEK).await;
    assert_eq!(limited.status, 200);
    let all = api_get(&http, &base, "/metrics", ROOT).await;
    assert_eq!(all.status, 200);
    assert!(all.body.contains("route=\"other\"") && all.body.contains("route=\"orders\""), "{}", all.body);
    assert!(!limited.body.contains("route=\"other\""), "another route's series: {}", limited.body);
    assert!(limited.body.contains("inlet_route_up{route=\"orders\"} 1"), "its own route's series: {}", limited.body);
    assert!(limited.body.contains("inlet_store_up 1"), "process-wide series stay: {}", limited.body);
    assert!(limited.body.ends_with("# EOF\n"), "{}", limited.body);
    // Every series a limited token reads is one the unrestricted token reads too.
    let every: BTreeSet<&str> =
        all.body.lines().filter(|l| !l.starts_with('#')).map(|l| l.split(' ').next().unwrap()).collect();
    for line in limited.body.lines().filter(|l| !l.starts_with('#')) {
        assert!(every.contains(line.split(' ').next().unwrap()), "{line}");
    }
}
