//! The HTTP API's answers as a client reads them: typed JSON for every outcome of a
//! push and of each admin endpoint, `{"error": …}` for every refusal (the handlers',
//! the request parsing's, unknown paths and methods), on a real SQLite file and a real
//! PostgreSQL database; and API.md naming every endpoint the server routes.

use std::time::Duration;

use inlet::app::{self, Running};
use inlet::config::Config;
use inlet_testkit::paths::plugin_path;
use inlet_testkit::pg::TestPg;
use inlet_testkit::push::push_envelope;
use inlet_testkit::wait::wait_until;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// Where a test's inbox lives; dropping it drops the database or the folder.
enum Store {
    Sqlite(tempfile::TempDir),
    Postgres(TestPg, tempfile::TempDir),
}

impl Store {
    async fn sqlite() -> Store {
        Store::Sqlite(tempfile::tempdir().unwrap())
    }

    async fn postgres() -> Store {
        Store::Postgres(TestPg::new().await, tempfile::tempdir().unwrap())
    }

    fn dir(&self) -> &std::path::Path {
        match self {
            Store::Sqlite(d) | Store::Postgres(_, d) => d.path(),
        }
    }

    fn url(&self) -> String {
        match self {
            Store::Sqlite(d) => format!("sqlite://{}", d.path().join("inbox.db").display()),
            Store::Postgres(pg, _) => pg.url.clone(),
        }
    }
}

/// Inlet in this process, admin API in loopback mode, push route `wo` (work-order
/// plugin, `log` target: every entry is delivered at once).
async fn start(store: &Store) -> (Running, String) {
    let config = store.dir().join("inlet.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"{}\"\n\n[admin]\nauth = \"none-loopback\"\n\n\
             [[route]]\nname = \"wo\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"log\" }}\n",
            store.url(),
            plugin_path("work_order").display()
        ),
    )
    .unwrap();
    let config = Config::load(&config).unwrap_or_else(|e| panic!("test routing file is invalid:\n{e}"));
    let options = app::Options {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        poll: Duration::from_millis(20),
        reload_every: None,
        ..app::Options::default()
    };
    let running = app::start(&config, options).await.expect("inlet starts");
    let base = format!("http://{}", running.addr);
    (running, base)
}

fn work_order(key: &str, seq: u32) -> Vec<u8> {
    format!(r#"{{"workOrderId":"{key}","completedItems":{seq},"completionTimestamp":"t"}}"#).into_bytes()
}

/// A request's status and its body as JSON (`Null` when it is not JSON).
async fn answer(r: reqwest::RequestBuilder) -> (u16, Value) {
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON ({status}): {text}")))
}

fn post_json(http: &reqwest::Client, url: String, body: Value) -> reqwest::RequestBuilder {
    http.post(url).header("content-type", "application/json").body(body.to_string())
}

async fn push(http: &reqwest::Client, base: &str, envelope: Value) -> (u16, Value) {
    answer(http.post(format!("{base}/push/wo")).header("content-type", "application/json").body(envelope.to_string()))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_answers_name_the_entry_and_what_became_of_it_on_sqlite() {
    push_answers_name_the_entry_and_what_became_of_it(Store::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_answers_name_the_entry_and_what_became_of_it_on_postgres() {
    push_answers_name_the_entry_and_what_became_of_it(Store::postgres().await).await;
}

async fn push_answers_name_the_entry_and_what_became_of_it(store: Store) {
    let (running, base) = start(&store).await;
    let http = reqwest::Client::new();

    let first = push_envelope(&work_order("k", 1), &[("eventId", "e-1")], "m-1");
    let (status, inserted) = push(&http, &base, first.clone()).await;
    assert_eq!(status, 200, "{inserted}");
    let id = inserted["entry"].as_i64().expect("the entry id");
    assert_eq!(inserted, json!({ "entry": id, "outcome": "inserted" }));
    assert_eq!(push(&http, &base, first).await, (200, json!({ "entry": id, "outcome": "duplicate" })));

    // Another payload under the same business key: its own PARKED entry.
    let other = push_envelope(&work_order("k", 2), &[("eventId", "e-1")], "m-2");
    let (status, conflict) = push(&http, &base, other.clone()).await;
    assert_eq!(status, 200, "{conflict}");
    let cid = conflict["entry"].as_i64().expect("the conflict entry id");
    assert_ne!(cid, id);
    assert_eq!(conflict, json!({ "entry": cid, "outcome": "conflict", "conflict_of": id }));
    let again = json!({ "entry": cid, "outcome": "duplicate", "conflict_of": id });
    assert_eq!(push(&http, &base, other).await, (200, again), "a conflict seen again is a duplicate");

    let (status, parked) = push(&http, &base, push_envelope(b"not a work order", &[], "m-3")).await;
    assert_eq!((status, &parked["outcome"]), (200, &json!("parked")), "{parked}");
    let stored = running.shared.store.get(parked["entry"].as_i64().unwrap()).await.unwrap().unwrap();
    assert_eq!(stored.status, inlet::inbox::Status::Parked);

    // Refusals: the same shape, with a reason from a fixed set.
    let (status, body) = push(&http, &base, json!({ "message": { "data": "" } })).await;
    assert_eq!((status, &body["reason"]), (400, &json!("bad_envelope")), "{body}");
    assert!(body["error"].as_str().unwrap().contains("messageId"), "{body}");
    let (status, body) = answer(http.post(format!("{base}/push/nope")).body("{}")).await;
    assert_eq!(body, json!({ "error": "no route named `nope`", "reason": "no_route" }));
    assert_eq!(status, 404);
    let (status, body) = answer(http.get(format!("{base}/push/wo"))).await;
    assert_eq!(status, 405, "{body}");
    assert!(body["error"].as_str().unwrap().contains("does not take GET"), "{body}");

    // The metric uses the same words.
    let metrics = running.shared.metrics.render();
    for outcome in ["inserted", "duplicate", "conflict", "parked"] {
        let sample = format!("inlet_ingested_total{{route=\"wo\",outcome=\"{outcome}\"}}");
        assert!(metrics.contains(&sample), "{sample} missing:\n{metrics}");
    }
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_answers_are_typed_and_every_refusal_is_an_error_object_on_sqlite() {
    admin_answers_are_typed_and_every_refusal_is_an_error_object(Store::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_answers_are_typed_and_every_refusal_is_an_error_object_on_postgres() {
    admin_answers_are_typed_and_every_refusal_is_an_error_object(Store::postgres().await).await;
}

async fn admin_answers_are_typed_and_every_refusal_is_an_error_object(store: Store) {
    let (running, base) = start(&store).await;
    let http = reqwest::Client::new();
    let (_, parked) = push(&http, &base, push_envelope(b"garbage", &[], "m-1")).await;
    let parked = parked["entry"].as_i64().unwrap();
    let (_, done) = push(&http, &base, push_envelope(&work_order("k", 1), &[], "m-2")).await;
    let done = done["entry"].as_i64().unwrap();
    let store_ = std::sync::Arc::clone(&running.shared.store);
    wait_until("the good entry is delivered", WAIT, || {
        let store = std::sync::Arc::clone(&store_);
        async move { store.get(done).await.unwrap().unwrap().status == inlet::inbox::Status::Done }
    })
    .await;

    assert_eq!(answer(http.get(format!("{base}/healthz"))).await, (200, json!({ "status": "ok" })));

    // Reading: a page, with the next page's `after` when it is full.
    let (status, page) = answer(http.get(format!("{base}/api/entries?limit=1"))).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["entries"][0]["id"], parked);
    assert_eq!(page["entries"][0]["raw_data"], json!({ "text": "garbage" }));
    assert_eq!(page["entries"][0]["body"], Value::Null, "never decoded");
    assert_eq!(page["next_after"], parked);
    let (_, rest) = answer(http.get(format!("{base}/api/entries?after={parked}"))).await;
    assert_eq!(rest["entries"].as_array().unwrap().len(), 1, "{rest}");
    assert!(rest.get("next_after").is_none(), "the last page: {rest}");
    let (_, shown) = answer(http.get(format!("{base}/api/entries/{done}"))).await;
    assert_eq!((shown["status"].as_str(), shown["correlation_key"].as_str()), (Some("DONE"), Some("k")));
    assert!(shown["body"]["text"].as_str().unwrap().contains("workOrderId"), "{shown}");

    // Repairs answer the entry, the action and the state it is in now.
    let park_body = |reason: &str| json!({ "reason": reason }).to_string();
    let (status, requeued) = answer(http.post(format!("{base}/api/entries/{parked}/requeue"))).await;
    assert_eq!((status, requeued), (200, json!({ "entry": parked, "action": "requeue", "status": "OPEN" })));
    let (status, refused) = answer(http.post(format!("{base}/api/entries/{done}/requeue"))).await;
    assert_eq!(status, 409);
    let error = format!("entry {done} is DONE; requeue applies to PARKED or OPEN entries");
    assert_eq!(refused, json!({ "error": error, "entry": done, "status": "DONE" }));
    let park = |id: i64, body: String| {
        http.post(format!("{base}/api/entries/{id}/park")).header("content-type", "application/json").body(body)
    };
    let (status, refused) = answer(park(done, park_body("hold it"))).await;
    assert_eq!((status, &refused["status"]), (409, &json!("DONE")), "{refused}");

    // Requests that do not parse: an error object with axum's status and reason.
    let cases: Vec<(&str, reqwest::RequestBuilder, u16, &str)> = vec![
        ("an id that is no number", http.get(format!("{base}/api/entries/abc")), 400, "abc"),
        ("an unknown status", http.get(format!("{base}/api/entries?status=stuck")), 400, "unknown status `stuck`"),
        ("a misspelt filter", http.get(format!("{base}/api/entries?stauts=parked")), 400, "stauts"),
        (
            "a body that is no JSON type",
            http.post(format!("{base}/api/entries/{done}/park")).body("x"),
            415,
            "Content-Type",
        ),
        ("a body without reason", park(done, "{}".into()), 422, "reason"),
        ("an empty reason", park(done, park_body("  ")), 400, "`reason` must not be empty"),
        (
            "a duration that is none",
            post_json(&http, format!("{base}/api/purge"), json!({ "older_than": "soon" })),
            400,
            "older_than",
        ),
        ("an unknown path", http.get(format!("{base}/api/nothing")), 404, "no endpoint /api/nothing"),
        ("an unknown method", http.delete(format!("{base}/api/entries/{done}")), 405, "does not take DELETE"),
        ("a missing entry", http.get(format!("{base}/api/entries/999999")), 404, "no entry 999999"),
        (
            "an unknown token",
            http.get(format!("{base}/api/entries")).bearer_auth("no-such-token-at-all"),
            401,
            "unknown token",
        ),
    ];
    for (what, request, expected, says) in cases {
        let (status, body) = answer(request).await;
        assert_eq!(status, expected, "{what}: {body}");
        let error = body["error"].as_str().unwrap_or_else(|| panic!("{what}: no error field: {body}"));
        assert!(error.contains(says), "{what}: {body}");
    }
    let entry = running.shared.store.get(done).await.unwrap().unwrap();
    assert_eq!(entry.status, inlet::inbox::Status::Done, "no refused request changed anything");

    // Administration.
    let (status, purged) = answer(post_json(&http, format!("{base}/api/purge"), json!({ "older_than": "1h" }))).await;
    assert_eq!((status, purged), (200, json!({ "purged": 0, "older_than": "1h" })));
    let (_, audit) = answer(http.get(format!("{base}/api/audit?limit=2"))).await;
    let actions: Vec<(&str, &str)> = audit["audit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["action"].as_str().unwrap(), a["outcome"].as_str().unwrap()))
        .collect();
    assert_eq!(actions, [("requeue", "ok"), ("requeue", "conflict")], "{audit}");
    assert!(audit["next_after"].is_i64(), "a full page names the next: {audit}");
    let (_, routes) = answer(http.get(format!("{base}/api/routes"))).await;
    assert_eq!(routes["routes"][0]["name"], "wo", "{routes}");
    assert_eq!(
        (routes["routes"][0]["state"].as_str(), routes["routes"][0]["source"].as_str()),
        (Some("up"), Some("push"))
    );
    assert_eq!(routes["refused_files"], json!([]));
    running.stop().await;
}

/// Every path `src/app.rs` routes, with its methods (lowercase): `.route("P", get(…).post(…))`,
/// or `.route("P", name)` with `let name = post(…)` earlier in the file.
fn routed() -> Vec<(String, Vec<String>)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let app = std::fs::read_to_string(root.join("src/app.rs")).unwrap();
    let methods_in = |text: &str| -> Vec<String> {
        ["get", "post", "put", "delete", "patch"]
            .iter()
            .filter(|m| {
                let after_word = |i: usize| i == 0 || !text.as_bytes()[i - 1].is_ascii_alphanumeric();
                text.match_indices(&format!("{m}(")).any(|(i, _)| after_word(i))
            })
            .map(|m| m.to_string())
            .collect()
    };
    let mut routes = Vec::new();
    for rest in app.split(".route(\"").skip(1) {
        let (path, after) = rest.split_once('"').unwrap();
        let handler = after.lines().next().unwrap().trim_start_matches(',').trim();
        let mut methods = methods_in(handler);
        if methods.is_empty() {
            let name = handler.split(')').next().unwrap().trim();
            let binding =
                app.split(&format!("let {name} = ")).nth(1).unwrap_or_else(|| panic!("no `let {name}` in src/app.rs"));
            methods = methods_in(binding.lines().next().unwrap());
        }
        assert!(!methods.is_empty(), "no method found for {path}: {handler}");
        routes.push((path.to_string(), methods));
    }
    assert!(routes.len() >= 10, "found the routes in src/app.rs: {routes:?}");
    routes
}

/// API.md names every path the server routes.
#[test]
fn api_md_documents_every_endpoint() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("API.md")).unwrap();
    let missing: Vec<String> =
        routed().into_iter().map(|(p, _)| p).filter(|p| !doc.contains(&format!(" {p}"))).collect();
    assert!(missing.is_empty(), "API.md does not document {missing:?}");
}

/// The OpenAPI description served at `/api/openapi.json` names exactly the paths and
/// methods the server routes.
#[test]
fn openapi_describes_exactly_the_routed_endpoints() {
    let doc: Value = serde_json::from_str(inlet::admin::openapi::OPENAPI).expect("openapi.json is JSON");
    assert_eq!(doc["openapi"], "3.1.0");
    let mut described: Vec<(String, String)> = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().unwrap().keys() {
            described.push((path.clone(), method.clone()));
        }
    }
    let mut routed: Vec<(String, String)> =
        routed().into_iter().flat_map(|(p, ms)| ms.into_iter().map(move |m| (p.clone(), m))).collect();
    described.sort();
    routed.sort();
    let undescribed: Vec<_> = routed.iter().filter(|r| !described.contains(r)).collect();
    let unrouted: Vec<_> = described.iter().filter(|d| !routed.contains(d)).collect();
    assert!(
        undescribed.is_empty() && unrouted.is_empty(),
        "routed but not in openapi.json: {undescribed:?}; in openapi.json but not routed: {unrouted:?}"
    );
    // Every operation says what it answers, and every `$ref` resolves.
    let text = inlet::admin::openapi::OPENAPI;
    for piece in text.split("\"$ref\": \"#/components/").skip(1) {
        let target = piece.split('"').next().unwrap();
        let mut node = &doc["components"];
        for part in target.split('/') {
            node = &node[part];
        }
        assert!(!node.is_null(), "$ref #/components/{target} resolves to nothing");
    }
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            assert!(op["responses"].as_object().is_some_and(|r| !r.is_empty()), "{method} {path} has no responses");
        }
    }
}
