//! Claim check (docs/claim-check.md): a message carries only a reference to its
//! payload (attributes `objectId` and `sha256`); the route's store is asked for it
//! before `decode`, and the plugin — the template plugin, of the current contract,
//! unchanged — decodes the object's bytes. The store is a local server speaking
//! Cloud Storage's JSON API download (`inlet_testkit::object_store`); the target a
//! local server that records what it receives.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use inlet::inbox::Status;
use inlet_testkit::in_process::start_on_sqlite_with_env;
use inlet_testkit::object_store::ObjectStore;
use inlet_testkit::paths::plugin_path;
use inlet_testkit::push::{push_envelope, send_push};
use inlet_testkit::wait::wait_until;
use sha2::{Digest, Sha256};

const TOKEN: &str = "store-token-for-the-claim-check-test";

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// A target that records the length and digest of every body it is sent.
async fn recording_target() -> (String, Arc<Mutex<Vec<(usize, String)>>>) {
    let seen: Arc<Mutex<Vec<(usize, String)>>> = Arc::default();
    let record = Arc::clone(&seen);
    let app = axum::Router::new()
        .fallback(axum::routing::post(move |body: Bytes| {
            let record = Arc::clone(&record);
            async move {
                record.lock().unwrap().push((body.len(), sha256(&body)));
                axum::http::StatusCode::NO_CONTENT
            }
        }))
        .layer(axum::extract::DefaultBodyLimit::disable());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, seen)
}

/// An event the template plugin reads (`id`, `key`) with `filler` bytes beside them.
fn event(id: &str, filler: usize) -> Vec<u8> {
    let mut text = format!(r#"{{"id":"{id}","key":"order-1","filler":""#);
    text.push_str(&"x".repeat(filler));
    text.push_str("\"}");
    text.into_bytes()
}

/// Pushes a message that refers to `object` (with `digest`, if any); the status and
/// the answer's outcome.
async fn push_reference(
    http: &reqwest::Client,
    base: &str,
    route: &str,
    id: &str,
    object: &str,
    digest: Option<&str>,
) -> (u16, String) {
    let mut attributes = vec![("objectId", object)];
    if let Some(d) = digest {
        attributes.push(("sha256", d));
    }
    let envelope = push_envelope(b"{}", &attributes, id);
    let answer = send_push(http, base, route, &envelope).await;
    let status = answer.status().as_u16();
    let body: serde_json::Value = serde_json::from_str(&answer.text().await.unwrap()).unwrap();
    let outcome = body.get("outcome").or_else(|| body.get("reason")).and_then(|o| o.as_str()).unwrap_or("").to_string();
    (status, outcome)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn referenced_payloads_are_fetched_checked_and_delivered_and_every_failure_is_visible() {
    let store = ObjectStore::start().await;
    let (target, received) = recording_target().await;
    let plugin = plugin_path("template");
    let routes = format!(
        r#"[[route]]
name   = "claims"
plugin = "{plugin}"
source = {{ kind = "push" }}
target = {{ kind = "http", url = "{target}", timeout = "30s" }}
max_steps = 1
fetch  = {{ kind = "gcs", bucket = "payloads", endpoint = "{endpoint}", token = "${{STORE_TOKEN}}", max_mib = 64, timeout = "2s" }}
limits = {{ fuel = 20_000_000_000, call_timeout = "60s", memory_mib = 512, max_output_mib = 128, timeout_tries = 2 }}

[[route]]
name   = "claims-s3"
plugin = "{plugin}"
source = {{ kind = "push" }}
target = {{ kind = "http", url = "{target}" }}
fetch  = {{ kind = "s3", endpoint = "{s3}", bucket = "payloads", region = "eu-west-1", access_key_id = "${{S3_KEY_ID}}", secret_access_key = "${{S3_SECRET}}" }}

[[route]]
name   = "claims-small"
plugin = "{plugin}"
source = {{ kind = "push" }}
target = {{ kind = "http", url = "{target}" }}
fetch  = {{ kind = "http", prefix = "{prefix}", max_mib = 1 }}
"#,
        plugin = plugin.display(),
        endpoint = store.endpoint(),
        prefix = store.plain_prefix(),
        s3 = store.s3_endpoint(),
    );
    let env = |name: &str| match name {
        "STORE_TOKEN" => Some(TOKEN.to_string()),
        "S3_KEY_ID" => Some("AKIDCLAIMCHECKTEST".to_string()),
        "S3_SECRET" => Some("a-secret-access-key-for-the-test".to_string()),
        _ => None,
    };
    let inlet = start_on_sqlite_with_env(&routes, &env, |_| {}).await;
    let base = inlet.base();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(120)).build().unwrap();

    // 50 MB behind a reference: fetched with the route's token, checked, decoded by
    // a plugin of the current contract, delivered whole.
    let big = event("big-1", 50 * 1000 * 1000);
    let big_digest = sha256(&big);
    store.put("payloads", "orders/big-1.json", big);
    let (status, outcome) =
        push_reference(&http, &base, "claims", "m-big", "orders/big-1.json", Some(&big_digest)).await;
    assert_eq!((status, outcome.as_str()), (200, "inserted"));
    wait_until("the 50 MB payload delivered", Duration::from_secs(120), || async {
        received.lock().unwrap().iter().any(|(_, d)| *d == big_digest)
    })
    .await;
    let (length, _) = received.lock().unwrap().iter().find(|(_, d)| *d == big_digest).cloned().unwrap();
    assert!(length > 50_000_000, "the whole payload reached the target: {length} bytes");
    let asked = store.requests();
    assert_eq!(asked[0].0, "payloads/orders/big-1.json");
    assert_eq!(asked[0].1.as_deref(), Some(format!("Bearer {TOKEN}").as_str()), "fetched with the route's token");

    // The same through an S3-compatible store: path-style, signed (Signature Version 4).
    let s3 = event("s3-1", 100);
    let s3_digest = sha256(&s3);
    store.put("payloads", "orders/s3 1.json", s3);
    let (status, outcome) =
        push_reference(&http, &base, "claims-s3", "m-s3", "orders/s3 1.json", Some(&s3_digest)).await;
    assert_eq!((status, outcome.as_str()), (200, "inserted"));
    wait_until("the S3 payload delivered", Duration::from_secs(30), || async {
        received.lock().unwrap().iter().any(|(_, d)| *d == s3_digest)
    })
    .await;
    let (_, auth) = store.requests().into_iter().find(|(o, _)| o == "payloads/orders/s3 1.json").expect("asked for");
    let auth = auth.unwrap_or_default();
    assert!(
        auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDCLAIMCHECKTEST/")
            && auth
                .contains("/eu-west-1/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature="),
        "signed for the route's key and region: {auth}"
    );

    // Each failure ends as a parked entry that says why; nothing is dropped.
    let small = event("small-1", 10);
    store.put("payloads", "tampered.json", small.clone());
    let other_digest = sha256(b"what the publisher meant");
    let cases = [
        ("claims", "m-digest", "tampered.json", Some(other_digest.as_str()), "SHA-256"),
        ("claims", "m-missing", "missing.json", Some(other_digest.as_str()), "does not exist"),
        ("claims", "m-no-digest", "tampered.json", None, "no `sha256` attribute"),
    ];
    for (route, id, object, digest, reason) in cases {
        let (status, outcome) = push_reference(&http, &base, route, id, object, digest).await;
        assert_eq!((status, outcome.as_str()), (200, "parked"), "{id}");
        let entry = inlet.running.shared.store.find_by_dedup_key(route, id).await.unwrap().expect("stored");
        assert_eq!(entry.status, Status::Parked, "{id}");
        let error = entry.last_error.unwrap_or_default();
        assert!(error.contains(reason) && error.starts_with("claim check:"), "{id}: {error}");
        assert_eq!(entry.raw_data, b"{}", "{id}: the row keeps the message as it came, the reference");
    }
    // Over the limit, through an http store.
    let huge = event("huge-1", 2 << 20);
    let huge_digest = sha256(&huge);
    store.put("plain", "huge.json", huge);
    let (status, outcome) =
        push_reference(&http, &base, "claims-small", "m-huge", "huge.json", Some(&huge_digest)).await;
    assert_eq!((status, outcome.as_str()), (200, "parked"));
    let entry = inlet.running.shared.store.find_by_dedup_key("claims-small", "m-huge").await.unwrap().unwrap();
    assert!(entry.last_error.as_deref().unwrap_or("").contains("over the route's limit"), "{:?}", entry.last_error);

    // A slow store: a temporary failure, redelivered (503) until the route's
    // timeout_tries, then parked saying so.
    store.set_delay(Some(Duration::from_secs(4)));
    let small_digest = sha256(&small);
    let first = push_reference(&http, &base, "claims", "m-slow", "tampered.json", Some(&small_digest)).await;
    assert_eq!(first, (503, "fetch_unavailable".to_string()), "the first try is a temporary failure");
    let second = push_reference(&http, &base, "claims", "m-slow", "tampered.json", Some(&small_digest)).await;
    assert_eq!(second, (200, "parked".to_string()), "the second (timeout_tries = 2) parks it");
    let entry = inlet.running.shared.store.find_by_dedup_key("claims", "m-slow").await.unwrap().unwrap();
    assert!(entry.last_error.as_deref().unwrap_or("").contains("did not arrive within"), "{:?}", entry.last_error);

    // Repair: the store is fast again; a requeue fetches the payload again and the
    // entry is delivered (the row holds the reference, not the bytes).
    store.set_delay(None);
    assert!(inlet.running.shared.store.requeue(entry.id, inlet.running.shared.clock.now()).await.unwrap());
    inlet.running.shared.wake("claims");
    wait_until("the requeued entry delivered", Duration::from_secs(30), || async {
        received.lock().unwrap().iter().any(|(_, d)| *d == small_digest)
    })
    .await;

    // A message without a reference is decoded as it came.
    let plain = event("plain-1", 5);
    let answer = send_push(&http, &base, "claims", &push_envelope(&plain, &[], "m-plain")).await;
    assert_eq!(answer.status().as_u16(), 200);
    let plain_digest = sha256(&plain);
    wait_until("the plain message delivered", Duration::from_secs(30), || async {
        received.lock().unwrap().iter().any(|(_, d)| *d == plain_digest)
    })
    .await;

    let metrics = http.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    for kind in ["digest", "not_found", "no_digest", "too_large", "timeout"] {
        let line = metrics.lines().find(|l| {
            l.starts_with("inlet_fetch_failures_total")
                && l.contains(&format!("reason=\"{kind}\""))
                && !l.ends_with(" 0")
        });
        assert!(line.is_some(), "inlet_fetch_failures_total counts {kind}:\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_the_object_of_a_purged_entry_where_the_route_asks() {
    let store = ObjectStore::start().await;
    let (target, received) = recording_target().await;
    let plugin = plugin_path("template");
    let routes = format!(
        r#"[[route]]
name   = "kept"
plugin = "{plugin}"
source = {{ kind = "push" }}
target = {{ kind = "http", url = "{target}" }}
fetch  = {{ kind = "gcs", bucket = "payloads", endpoint = "{endpoint}" }}

[[route]]
name   = "deleted"
plugin = "{plugin}"
source = {{ kind = "push" }}
target = {{ kind = "http", url = "{target}" }}
fetch  = {{ kind = "gcs", bucket = "payloads", endpoint = "{endpoint}", delete_on_purge = true }}
"#,
        plugin = plugin.display(),
        endpoint = store.endpoint(),
    );
    let inlet = start_on_sqlite_with_env(&routes, &|_| None, |_| {}).await;
    let base = inlet.base();
    let http = reqwest::Client::new();
    for (route, object) in [("kept", "a.json"), ("deleted", "b.json")] {
        let payload = event(object, 10);
        let digest = sha256(&payload);
        store.put("payloads", object, payload);
        let (status, outcome) = push_reference(&http, &base, route, object, object, Some(&digest)).await;
        assert_eq!((status, outcome.as_str()), (200, "inserted"));
    }
    wait_until("both delivered", Duration::from_secs(30), || async { received.lock().unwrap().len() == 2 }).await;
    let shared = &inlet.running.shared;
    wait_until("both entries DONE", Duration::from_secs(30), || async {
        let mut done = 0;
        for route in ["kept", "deleted"] {
            let entry = shared.store.find_by_dedup_key(route, if route == "kept" { "a.json" } else { "b.json" }).await;
            done += usize::from(entry.ok().flatten().is_some_and(|e| e.status == Status::Done));
        }
        done == 2
    })
    .await;

    // Retention's pass, as the running instance makes it every minute, for entries
    // finished before a moment from now.
    let purged = inlet::app::purge_expired(shared, shared.clock.now() + 1_000).await.unwrap();
    assert_eq!(purged, 2, "both finished entries purged");
    assert!(store.contains("payloads", "a.json"), "the route that does not ask keeps its object");
    assert!(!store.contains("payloads", "b.json"), "delete_on_purge deleted the purged entry's object");
    let metrics = http.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(
        metrics.lines().any(|l| l == r#"inlet_fetch_deletes_total{route="deleted",outcome="deleted"} 1"#),
        "the delete counted:\n{metrics}"
    );
}
