//! End to end on real parts: Pub/Sub push envelopes over HTTP into a running Inlet,
//! the real compiled plugins, a real inbox (SQLite file and PostgreSQL database), and
//! a real HTTP server playing Camunda 7 as the target. Every scenario runs on both
//! stores. Time-dependent scenarios inject a manual clock instead of sleeping.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use inlet::app::{self, Running};
use inlet::clock::{Clock, ManualClock, Millis};
use inlet::config::Config;
use inlet::inbox::{Entry, ListFilter, Status, Store};
use inlet_testkit::camunda::{FakeCamunda, Reply};
use inlet_testkit::in_process::start_on_sqlite;
use inlet_testkit::paths::plugin_path;
use inlet_testkit::pg::TestPg;
use inlet_testkit::ports::free_port;
use inlet_testkit::proxy::TcpProxy;
use inlet_testkit::push::push_envelope;
use inlet_testkit::wait::{wait_for, wait_until};

const WAIT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug)]
enum Backend {
    Sqlite,
    Postgres,
}

struct Inlet {
    running: Option<Running>,
    base: String,
    store: Arc<dyn Store>,
    config_path: PathBuf,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
    _pg: Option<TestPg>,
}

fn work_order(seq: u32, key: &str) -> Vec<u8> {
    format!(r#"{{"workOrderId":"{key}","completedItems":{seq},"completionTimestamp":"2026-08-01T10:00:00Z"}}"#)
        .into_bytes()
}

/// A `[[route]]` table for the work-order plugin.
fn route(name: &str, target_url: &str, extra: &str) -> String {
    format!(
        "[[route]]\nname = \"{name}\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"http\", url = \"{target_url}\", timeout = \"2s\" }}\n{extra}\n",
        plugin_path("work_order").display()
    )
}

impl Inlet {
    async fn start(backend: Backend, routes: &str, clock: Option<Arc<ManualClock>>) -> Inlet {
        let dir = tempfile::tempdir().expect("tempdir");
        let (url, pg) = match backend {
            Backend::Sqlite => (format!("sqlite://{}", dir.path().join("inbox.db").display()), None),
            Backend::Postgres => {
                let pg = TestPg::new().await;
                (pg.url.clone(), Some(pg))
            }
        };
        Self::start_with_store(&url, routes, clock, dir, pg).await
    }

    async fn start_with_store(
        url: &str,
        routes: &str,
        clock: Option<Arc<ManualClock>>,
        dir: tempfile::TempDir,
        pg: Option<TestPg>,
    ) -> Inlet {
        inlet::telemetry::init_logging();
        let config_path = dir.path().join("inlet.toml");
        std::fs::write(&config_path, format!("[store]\nurl = \"{url}\"\n\n{routes}")).unwrap();
        let config = Config::load(&config_path).unwrap_or_else(|e| panic!("test config is invalid:\n{e}"));
        let options = app::Options {
            clock: clock.map(|c| c as Arc<dyn Clock>),
            poll: Duration::from_millis(20),
            listen: Some("127.0.0.1:0".parse().unwrap()),
            ..app::Options::default()
        };
        let running = app::start(&config, options).await.expect("inlet starts");
        Inlet {
            base: format!("http://{}", running.addr),
            store: Arc::clone(&running.shared.store),
            running: Some(running),
            config_path,
            http: reqwest::Client::new(),
            _dir: dir,
            _pg: pg,
        }
    }

    async fn push(&self, route: &str, data: &[u8], message_id: &str) -> u16 {
        self.push_envelope(route, &push_envelope(data, &[], message_id)).await
    }

    async fn push_envelope(&self, route: &str, envelope: &serde_json::Value) -> u16 {
        self.http
            .post(format!("{}/push/{route}", self.base))
            .header("content-type", "application/json")
            .body(envelope.to_string())
            .send()
            .await
            .expect("push request")
            .status()
            .as_u16()
    }

    /// Pushes work orders `(key, seq)` in this order with `route` paused, so all are
    /// stored before the relay may claim any, then resumes it.
    async fn push_work_orders_while_paused(&self, route: &str, pushes: &[(&str, u32)]) {
        let pause = inlet::inbox::Pause {
            route: route.into(),
            paused_at: 0,
            paused_by: "test".into(),
            reason: "store everything before the first claim".into(),
        };
        self.store.pause_route(&pause).await.unwrap();
        for (key, seq) in pushes {
            assert_eq!(self.push(route, &work_order(*seq, key), &format!("m-{key}-{seq}")).await, 200);
        }
        self.store.resume_route(route).await.unwrap();
    }

    async fn entries(&self, route: &str) -> Vec<Entry> {
        self.store.list(&ListFilter { route: Some(route.into()), limit: 10_000, ..Default::default() }).await.unwrap()
    }

    async fn entry(&self, id: i64) -> Entry {
        self.store.get(id).await.unwrap().expect("entry exists")
    }

    async fn wait_status(&self, id: i64, status: Status) -> Entry {
        wait_for(&format!("entry {id} to be {status}"), WAIT, || async move {
            self.store.get(id).await.unwrap().filter(|e| e.status == status)
        })
        .await
    }

    /// Waits for the attempt after `attempts` to be settled, and returns the entry.
    async fn next_settled(&self, id: i64, attempts: i32) -> Entry {
        wait_for(&format!("attempt {} of entry {id} to be settled", attempts + 1), WAIT, || async move {
            self.store.get(id).await.unwrap().filter(|e| e.attempts > attempts && e.status != Status::InProgress)
        })
        .await
    }

    /// A GET of the admin API (the routing file must allow unauthenticated loopback).
    async fn get_json(&self, path: &str) -> serde_json::Value {
        let text = self.http.get(format!("{}{path}", self.base)).send().await.unwrap().text().await.unwrap();
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {text}"))
    }

    async fn metrics(&self) -> String {
        self.http.get(format!("{}/metrics", self.base)).send().await.unwrap().text().await.unwrap()
    }

    async fn stop(mut self) {
        if let Some(r) = self.running.take() {
            r.stop().await;
        }
    }
}

macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod on_sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() { super::$name(super::Backend::Sqlite).await; }
            )*
        }
        mod on_postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() { super::$name(super::Backend::Postgres).await; }
            )*
        }
    };
}

on_both_stores!(
    pushed_message_is_delivered_once_and_done,
    duplicate_push_is_absorbed_and_a_conflict_is_kept_visible,
    thousand_messages_over_fifty_keys_keep_per_key_order,
    not_yet_is_retried_until_ready_or_parked_at_the_deadline,
    several_matches_park_at_once_and_hold_the_key_until_requeued,
    technical_failures_back_off_with_growing_jittered_capped_delays,
    garbage_and_plugin_faults_are_parked_with_the_raw_payload,
    a_re_decoded_entry_takes_the_plugins_dedup_key_and_is_never_delivered_twice,
    every_attempt_is_recorded_with_its_answer_request_and_outcome,
    failing_entries_are_grouped_by_route_and_error_fingerprint,
    group_commits_count_their_batches_and_the_delivery_slots_in_use,
);

/// Must show 1.
async fn pushed_message_is_delivered_once_and_done(backend: Backend) {
    let camunda = FakeCamunda::start().await;
    let url = camunda.url();
    let target =
        format!("target = {{ kind = \"http\", url = \"{url}\", headers = {{ Authorization = \"Bearer t0k3n\" }} }}");
    let routes = route("wo", &url, "")
        .replace(&format!("target = {{ kind = \"http\", url = \"{url}\", timeout = \"2s\" }}"), &target);
    let inlet = Inlet::start(backend, &routes, None).await;
    let not_an_envelope = inlet
        .http
        .post(format!("{}/push/wo", inlet.base))
        .header("content-type", "application/json")
        .body("{\"nope\":1}")
        .send()
        .await
        .unwrap();
    assert_eq!(not_an_envelope.status().as_u16(), 400, "a body that is not a push envelope");
    assert_eq!(inlet.push("no-such-route", b"x", "m-0").await, 404);
    assert_eq!(inlet.push("wo", &work_order(3, "4711"), "m-1").await, 200);
    let id = inlet.entries("wo").await[0].id;
    let e = inlet.wait_status(id, Status::Done).await;
    assert_eq!((e.attempts, e.correlation_key.as_deref(), e.dedup_key.as_str()), (1, Some("4711"), "m-1"));

    let d = camunda.deliveries();
    assert_eq!(d.len(), 1, "delivered exactly once");
    assert_eq!((d[0].key.as_str(), d[0].seq, d[0].idempotency_key.as_deref()), ("4711", 3, Some("m-1")));
    assert_eq!(d[0].body["messageName"], "WorkOrderCompleted");
    assert_eq!(d[0].headers.get("authorization").map(String::as_str), Some("Bearer t0k3n"), "static headers");
    assert_eq!(d[0].headers.get("content-type").map(String::as_str), Some("application/json"), "plugin headers");
    assert!(inlet.entries("wo").await.len() == 1, "rejected pushes store nothing");
    inlet.stop().await;
    assert_eq!(camunda.count(), 1, "nothing more after shutdown");
}

/// Must show 2.
async fn duplicate_push_is_absorbed_and_a_conflict_is_kept_visible(backend: Backend) {
    let camunda = FakeCamunda::start().await;
    let inlet = Inlet::start(backend, &route("wo", &camunda.url(), ""), None).await;
    let envelope = push_envelope(&work_order(1, "A"), &[("eventId", "evt-1")], "m-1");
    assert_eq!(inlet.push_envelope("wo", &envelope).await, 200);
    assert_eq!(inlet.push_envelope("wo", &envelope).await, 200, "a redelivery is acked");
    let republished = push_envelope(&work_order(1, "A"), &[("eventId", "evt-1")], "m-2");
    assert_eq!(inlet.push_envelope("wo", &republished).await, 200, "a republish under a new message id is acked");

    let id = inlet.entries("wo").await[0].id;
    inlet.wait_status(id, Status::Done).await;
    assert_eq!(inlet.entries("wo").await.len(), 1, "one row");
    assert_eq!(camunda.count(), 1, "one delivery");

    // "An order closed in two parts": same business event id, different payload.
    let second_part = push_envelope(&work_order(2, "A"), &[("eventId", "evt-1")], "m-3");
    assert_eq!(inlet.push_envelope("wo", &second_part).await, 200);
    let entries = inlet.entries("wo").await;
    assert_eq!(entries.len(), 2, "the conflicting message is stored, not dropped");
    let conflict = &entries[1];
    assert_eq!((conflict.status, conflict.conflict_of), (Status::Parked, Some(id)));
    assert!(conflict.last_error.as_deref().unwrap().contains("different payload"));
    assert_eq!(conflict.raw_data, work_order(2, "A"));
    // The conflicting message redelivered: absorbed, and not a second conflict.
    assert_eq!(inlet.push_envelope("wo", &second_part).await, 200);
    assert_eq!(inlet.entries("wo").await.len(), 2);
    let metrics = inlet.metrics().await;
    assert!(metrics.contains("inlet_dedup_conflicts_total{route=\"wo\"} 1"), "conflict metric:\n{metrics}");
    assert!(
        metrics.contains("inlet_ingested_total{route=\"wo\",outcome=\"duplicate\"} 3"),
        "duplicate metric:\n{metrics}"
    );
    assert_eq!(camunda.count(), 1, "the conflict is not delivered until a person decides");
    inlet.stop().await;
}

/// An entry parked before it could be decoded is stored under its message id. When a
/// requeue decodes it, it takes the plugin's dedup key: if the same event was stored
/// meanwhile under that key (republished under a new message id and decoded by a
/// fixed plugin), the entry is ignored as a duplicate instead of delivered twice; a
/// different payload under that key is parked as a conflict; a free key is taken.
async fn a_re_decoded_entry_takes_the_plugins_dedup_key_and_is_never_delivered_twice(backend: Backend) {
    let camunda = FakeCamunda::start().await;
    let inlet = Inlet::start(backend, &route("wo", &camunda.url(), ""), None).await;
    let parked_undecoded = |message_id: &str, data: Vec<u8>, event_id: &str| inlet::inbox::NewEntry {
        route: "wo".into(),
        dedup_key: message_id.into(),
        decoded: None,
        raw_data: data,
        attributes: vec![("eventId".into(), event_id.into())],
        message_id: message_id.into(),
        publish_time: None,
        delivery_attempt: None,
        status: Status::Parked,
        last_error: Some("decode failed: the plugin of the day could not read it".into()),
    };
    let store = &inlet.store;
    let same = store.insert(&parked_undecoded("m-1", work_order(1, "A"), "evt-1"), 0).await.unwrap().id();
    let other = store.insert(&parked_undecoded("m-3", work_order(2, "B"), "evt-1"), 0).await.unwrap().id();
    let free = store.insert(&parked_undecoded("m-4", work_order(1, "C"), "evt-9"), 0).await.unwrap().id();
    // The same event, republished under a new message id, is decoded and delivered.
    assert_eq!(
        inlet.push_envelope("wo", &push_envelope(&work_order(1, "A"), &[("eventId", "evt-1")], "m-2")).await,
        200
    );
    let holder = inlet.entries("wo").await.into_iter().find(|e| e.dedup_key == "evt-1").expect("stored under evt-1").id;
    inlet.wait_status(holder, Status::Done).await;

    for id in [same, other, free] {
        assert!(store.requeue(id, 0).await.unwrap(), "entry {id} requeued");
    }
    let ignored = inlet.wait_status(same, Status::Ignored).await;
    let reason = ignored.last_error.unwrap_or_default();
    assert!(reason.contains(&format!("duplicate of entry {holder}")), "{reason}");
    assert_eq!(ignored.dedup_key, "m-1", "the key stays with the entry that holds it");
    let conflict = inlet.wait_status(other, Status::Parked).await;
    let reason = conflict.last_error.unwrap_or_default();
    assert!(reason.contains(&format!("which entry {holder} holds with a different payload")), "{reason}");
    let taken = inlet.wait_status(free, Status::Done).await;
    assert_eq!(taken.dedup_key, "evt-9", "a free key is taken");

    let keys: Vec<String> = camunda.deliveries().iter().map(|d| d.key.clone()).collect();
    assert_eq!(keys, ["A", "C"], "each event delivered once, the conflict not at all");
    let metrics = inlet.metrics().await;
    assert!(metrics.contains("inlet_dedup_conflicts_total{route=\"wo\"} 1"), "conflict metric:\n{metrics}");
    inlet.stop().await;
}

/// An entry that went not-yet → retry → done has three
/// attempts in its history, each with the plugin's answer, the request and its
/// status, and the entry's status and reason after it — in the store and in
/// `GET /api/entries/{id}`.
async fn every_attempt_is_recorded_with_its_answer_request_and_outcome(backend: Backend) {
    let camunda = FakeCamunda::with_behaviour(|_, attempt| match attempt {
        1 => Reply::NoMatch,
        2 => Reply::Status(500),
        _ => Reply::Ok,
    })
    .await;
    let clock = ManualClock::new(1_800_000_000_000);
    let routes = format!("[admin]\nauth = \"none-loopback\"\n\n{}", route("wo", &camunda.url(), ""));
    let inlet = Inlet::start(backend, &routes, Some(Arc::clone(&clock))).await;
    assert_eq!(inlet.push("wo", &work_order(1, "h"), "m-h").await, 200);
    let id = inlet.entries("wo").await[0].id;
    let mut e = inlet.next_settled(id, 0).await;
    while e.status == Status::Open {
        clock.set(e.next_attempt_at);
        e = inlet.next_settled(id, e.attempts).await;
    }
    assert_eq!(e.status, Status::Done);

    let attempts = inlet.store.attempts(id).await.unwrap();
    let summary: Vec<(i32, &str, &str, Option<u16>)> = attempts
        .iter()
        .map(|a| (a.attempt, a.answer.as_str(), a.status.as_str(), a.requests.first().and_then(|r| r.status)))
        .collect();
    assert_eq!(
        summary,
        [(1, "not_yet", "OPEN", Some(400)), (2, "retry", "OPEN", Some(500)), (3, "done", "DONE", Some(204))],
        "{attempts:#?}"
    );
    let reasons: Vec<&str> = attempts.iter().map(|a| a.reason.as_deref().unwrap_or("")).collect();
    assert!(reasons[0].starts_with("not yet:"), "{reasons:?}");
    assert!(reasons[1].contains("target answered 500"), "{reasons:?}");
    assert_eq!(reasons[2], "");
    for a in &attempts {
        assert_eq!((a.requests.len(), a.requests[0].method.as_str()), (1, "POST"));
        assert_eq!(a.requests[0].path, "/engine-rest/message");
        assert_eq!(a.plugin.as_deref().map(str::len), Some(64), "the plugin's digest");
        assert!(a.started_at >= 1_800_000_000_000 && a.duration_ms >= 0 && !a.owner.is_empty());
    }
    let shown = inlet.get_json(&format!("/api/entries/{id}")).await;
    let answers: Vec<&str> =
        shown["attempts"].as_array().unwrap().iter().map(|a| a["answer"].as_str().unwrap()).collect();
    assert_eq!(answers, ["not_yet", "retry", "done"], "{shown}");
    inlet.stop().await;
}

/// Parked and retrying entries grouped by route and a fingerprint of their
/// error with the varying parts masked — six several-matches parks over six keys, four
/// undecodable payloads whose errors differ only in a column number, two entries
/// retrying after 503s — are three groups with the right counts, in the store and in
/// `GET /api/failures`.
async fn failing_entries_are_grouped_by_route_and_error_fingerprint(backend: Backend) {
    let camunda = FakeCamunda::with_behaviour(|key, _| match key {
        k if k.starts_with("several") => Reply::SeveralMatch,
        _ => Reply::Status(503),
    })
    .await;
    let routes = format!(
        "[admin]\nauth = \"none-loopback\"\n\n{}",
        route("wo", &camunda.url(), "retry = { initial = \"1h\", max = \"2h\", max_attempts = 50 }")
    );
    let inlet = Inlet::start(backend, &routes, None).await;
    for k in 0..6 {
        assert_eq!(inlet.push("wo", &work_order(1, &format!("several-{k}")), &format!("m-s{k}")).await, 200);
    }
    for k in 0..4 {
        let garbage = format!("{}not json", " ".repeat(k));
        assert_eq!(inlet.push("wo", garbage.as_bytes(), &format!("m-g{k}")).await, 200);
    }
    for k in 0..2 {
        assert_eq!(inlet.push("wo", &work_order(1, &format!("down-{k}")), &format!("m-d{k}")).await, 200);
    }
    wait_until("every entry parked or retrying", WAIT, || async {
        inlet
            .entries("wo")
            .await
            .iter()
            .all(|e| e.status == Status::Parked || (e.status == Status::Open && e.attempts > 0))
    })
    .await;

    let mut groups = inlet.store.failure_groups(None, 100).await.unwrap();
    groups.sort_by_key(|g| (g.parked, g.retrying));
    let counts: Vec<(i64, i64, i64)> = groups.iter().map(|g| (g.parked, g.retrying, g.keys)).collect();
    assert_eq!(counts, [(0, 2, 2), (4, 0, 0), (6, 0, 6)], "{groups:#?}");
    assert!(groups[0].fingerprint.contains("target answered 503"), "{groups:#?}");
    assert!(groups[1].fingerprint.starts_with("decode failed"), "{groups:#?}");
    assert!(groups[1].fingerprint.contains("column #"), "the column number is masked: {groups:#?}");
    assert!(groups[2].example_error.contains("executions match"), "{groups:#?}");
    assert!(groups.iter().all(|g| g.route == "wo" && g.first_seen <= g.last_seen));

    let api = inlet.get_json("/api/failures?route=wo").await;
    let sizes: Vec<i64> = api["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["parked"].as_i64().unwrap() + g["retrying"].as_i64().unwrap())
        .collect();
    assert_eq!(sizes, [6, 4, 2], "largest first: {api}");
    let other = inlet.get_json("/api/failures?route=nope").await;
    assert_eq!(other["groups"], serde_json::json!([]));
    inlet.stop().await;
}

/// Must show 3.
async fn thousand_messages_over_fifty_keys_keep_per_key_order(backend: Backend) {
    let camunda = FakeCamunda::start().await.with_delay(Duration::from_millis(1));
    let inlet = Arc::new(Inlet::start(backend, &route("wo", &camunda.url(), "concurrency = 8"), None).await);
    let mut pushers = Vec::new();
    for k in 0..50 {
        let inlet = Arc::clone(&inlet);
        pushers.push(tokio::spawn(async move {
            for seq in 1..=20 {
                let status = inlet.push("wo", &work_order(seq, &format!("key-{k}")), &format!("m-{k}-{seq}")).await;
                assert_eq!(status, 200);
            }
        }));
    }
    for p in pushers {
        p.await.unwrap();
    }
    wait_until("1,000 deliveries", Duration::from_secs(120), || async { camunda.count() >= 1000 }).await;
    for k in 0..50 {
        assert_eq!(camunda.correlated_seqs(&format!("key-{k}")), (1..=20).collect::<Vec<i64>>(), "order of key-{k}");
    }
    assert_eq!(camunda.max_in_flight_per_key(), 1, "overlaps: {:?}", camunda.overlaps());
    assert_eq!(camunda.count(), 1000, "no extra deliveries");
    let entries = inlet.entries("wo").await;
    assert_eq!(entries.len(), 1000);
    wait_until("all rows DONE", WAIT, || async { inlet.entries("wo").await.iter().all(|e| e.status == Status::Done) })
        .await;
    Arc::into_inner(inlet).expect("pushers finished").stop().await;
}

/// Must show 4.
async fn not_yet_is_retried_until_ready_or_parked_at_the_deadline(backend: Backend) {
    let camunda = FakeCamunda::with_behaviour(|key, attempt| match key {
        "late" if attempt < 3 => Reply::NoMatch,
        "late" => Reply::Ok,
        _ => Reply::NoMatch,
    })
    .await;
    let clock = ManualClock::new(1_800_000_000_000);
    let extra = "retry = { initial = \"1s\", max = \"1m\" }\nnot_yet = { deadline = \"10m\", max_interval = \"2m\" }";
    let inlet = Inlet::start(backend, &route("wo", &camunda.url(), extra), Some(Arc::clone(&clock))).await;

    assert_eq!(inlet.push("wo", &work_order(1, "late"), "m-late").await, 200);
    let id = inlet.entries("wo").await[0].id;
    let mut e = inlet.next_settled(id, 0).await;
    while e.status == Status::Open {
        assert!(e.last_error.as_deref().unwrap().starts_with("not yet:"), "{:?}", e.last_error);
        clock.set(e.next_attempt_at);
        e = inlet.next_settled(id, e.attempts).await;
    }
    assert_eq!((e.status, e.attempts), (Status::Done, 3), "delivered once the process was ready");

    let received = clock.now();
    assert_eq!(inlet.push("wo", &work_order(1, "never"), "m-never").await, 200);
    let id = inlet.entries("wo").await[1].id;
    let mut e = inlet.next_settled(id, 0).await;
    while e.status == Status::Open {
        assert!(e.next_attempt_at <= received + 600_000, "never scheduled past the deadline");
        clock.set(e.next_attempt_at);
        e = inlet.next_settled(id, e.attempts).await;
    }
    assert_eq!(e.status, Status::Parked);
    assert!(clock.now() >= received + 600_000, "parked only once the deadline was reached");
    let error = e.last_error.unwrap();
    assert!(
        error.contains("deadline of 10m") && error.contains("No process definition or execution matches"),
        "{error}"
    );
    assert_eq!(camunda.deliveries_for("never").len() as i32, e.attempts);

    // A requeue starts a new run: the deadline counts again from the run's first
    // not-yet answer, not from receipt (which would leave exactly one try).
    let requeued_at = clock.now();
    assert!(inlet.store.requeue(id, requeued_at).await.unwrap());
    let mut e = inlet.next_settled(id, 0).await;
    while e.status == Status::Open {
        assert!(e.next_attempt_at <= requeued_at + 600_000, "never scheduled past the new deadline");
        clock.set(e.next_attempt_at);
        e = inlet.next_settled(id, e.attempts).await;
    }
    assert_eq!(e.status, Status::Parked);
    assert!(e.attempts > 1, "the requeued entry got a whole deadline again, not one try: {e:?}");
    assert!(clock.now() >= requeued_at + 600_000, "parked only once the new deadline was reached");
    inlet.stop().await;
}

/// Must show 5.
async fn several_matches_park_at_once_and_hold_the_key_until_requeued(backend: Backend) {
    let camunda =
        FakeCamunda::with_behaviour(
            |key, attempt| if key == "dup" && attempt == 1 { Reply::SeveralMatch } else { Reply::Ok },
        )
        .await;
    let inlet = Inlet::start(backend, &route("wo", &camunda.url(), ""), None).await;
    for seq in 1..=3 {
        assert_eq!(inlet.push("wo", &work_order(seq, "dup"), &format!("d-{seq}")).await, 200);
    }
    for seq in 1..=3 {
        assert_eq!(inlet.push("wo", &work_order(seq, "other"), &format!("o-{seq}")).await, 200);
    }
    let ids: Vec<i64> = inlet.entries("wo").await.iter().map(|e| e.id).collect();
    let parked = inlet.wait_status(ids[0], Status::Parked).await;
    assert_eq!(parked.attempts, 1, "parked at once, no retries");
    assert!(parked.last_error.as_deref().unwrap().contains("2 executions match"), "{:?}", parked.last_error);
    wait_until("the other key to be delivered", WAIT, || async { camunda.correlated_seqs("other").len() == 3 }).await;
    for id in &ids[1..3] {
        let e = inlet.entry(*id).await;
        assert_eq!((e.status, e.attempts), (Status::Open, 0), "later entries of the key wait behind the parked one");
    }
    assert_eq!(camunda.deliveries_for("dup").len(), 1);

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inlet"))
        .args(["inbox", "--config"])
        .arg(&inlet.config_path)
        .args(["requeue", &ids[0].to_string()])
        .output()
        .expect("run inlet inbox requeue");
    assert!(out.status.success(), "requeue failed: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("requeued {}", ids[0]));

    wait_until("the key to drain after the requeue", WAIT, || async { camunda.correlated_seqs("dup").len() == 3 })
        .await;
    assert_eq!(camunda.correlated_seqs("dup"), vec![1, 2, 3], "in order after the repair");
    inlet.stop().await;
}

/// Must show 6.
async fn technical_failures_back_off_with_growing_jittered_capped_delays(backend: Backend) {
    let camunda = FakeCamunda::with_behaviour(|_, _| Reply::Status(500)).await;
    let refused = format!("http://127.0.0.1:{}", free_port());
    let clock = ManualClock::new(1_800_000_000_000);
    let policy = "retry = { initial = \"1s\", max = \"10s\", multiplier = 2.0, jitter = 0.2, max_attempts = 7 }";
    let routes = format!("{}{}", route("failing", &camunda.url(), policy), route("refused", &refused, policy));
    let inlet = Inlet::start(backend, &routes, Some(Arc::clone(&clock))).await;

    for (route, error_part) in [("failing", "target answered 500"), ("refused", "connect error")] {
        assert_eq!(inlet.push(route, &work_order(1, "k"), "m-1").await, 200);
        let id = inlet.entries(route).await[0].id;
        let mut delays = Vec::new();
        let mut e = inlet.next_settled(id, 0).await;
        while e.status == Status::Open {
            assert!(e.last_error.as_deref().unwrap().contains(error_part), "{route}: {:?}", e.last_error);
            delays.push(e.next_attempt_at - clock.now());
            clock.set(e.next_attempt_at);
            e = inlet.next_settled(id, e.attempts).await;
        }
        assert_eq!((e.status, e.attempts), (Status::Parked, 7), "{route}: parked after max_attempts");
        assert!(e.last_error.as_deref().unwrap().starts_with("gave up after 7 attempts"), "{:?}", e.last_error);

        // Attempt n waits initial·2^(n-1) ± 20%, never more than max.
        let bases: [Millis; 6] = [1_000, 2_000, 4_000, 8_000, 10_000, 10_000];
        assert_eq!(delays.len(), 6, "{route}: {delays:?}");
        for (d, base) in delays.iter().zip(bases) {
            assert!(
                *d >= base * 8 / 10 && *d <= (base * 12 / 10).min(10_000),
                "{route}: delay {d} for base {base}: {delays:?}"
            );
        }
        assert!(delays[..4].windows(2).all(|w| w[1] > w[0]), "{route}: delays grow until the cap: {delays:?}");
        assert!(delays.iter().zip(bases).any(|(d, b)| *d != b), "{route}: delays are jittered: {delays:?}");
    }
    assert_eq!(camunda.count(), 7);
    inlet.stop().await;
}

/// Must show 7.
async fn garbage_and_plugin_faults_are_parked_with_the_raw_payload(backend: Backend) {
    let camunda = FakeCamunda::start().await;
    let hostile = format!(
        "[[route]]\nname = \"hostile\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"log\" }}\nlimits = {{ call_timeout = \"10s\", fuel = 20000000, memory_mib = 32 }}\n",
        plugin_path("hostile").display(),
    );
    let inlet = Inlet::start(backend, &format!("{}{hostile}", route("wo", &camunda.url(), "")), None).await;

    let garbage: &[u8] = b"\xff\xfe{not json at all";
    assert_eq!(inlet.push("wo", garbage, "g-1").await, 200, "acked: the row is stored");
    let e = &inlet.entries("wo").await[0];
    assert_eq!(e.status, Status::Parked);
    assert_eq!(e.raw_data, garbage, "raw bytes intact");
    assert!(
        e.last_error.as_deref().unwrap().starts_with("decode failed: payload is not a work-order-completed event"),
        "{:?}",
        e.last_error
    );

    let cases = [
        ("panic", "plugin trapped", "hostile plugin panics as asked"),
        ("loop", "used up its budget of 20000000 instructions", ""),
        ("alloc", "memory limit of 33554432 bytes", ""),
    ];
    for (command, fault, detail) in cases {
        assert_eq!(inlet.push("hostile", command.as_bytes(), &format!("h-{command}")).await, 200, "{command}");
        let e = inlet.entries("hostile").await.into_iter().find(|e| e.message_id == format!("h-{command}")).unwrap();
        let error = e.last_error.unwrap();
        assert_eq!(e.status, Status::Parked, "{command}");
        assert!(
            error.starts_with("plugin fault during decode") && error.contains(fault) && error.contains(detail),
            "{command}: {error}"
        );
        assert_eq!(e.raw_data, command.as_bytes());
    }
    // The host, and the plugin, still serve.
    assert_eq!(inlet.push("hostile", b"fine:1", "h-ok").await, 200);
    assert_eq!(inlet.push("wo", &work_order(1, "K"), "ok-1").await, 200);
    wait_until("the good work order delivered", WAIT, || async { camunda.correlated_seqs("K") == vec![1] }).await;
    let fine = inlet.entries("hostile").await.into_iter().find(|e| e.message_id == "h-ok").unwrap();
    inlet.wait_status(fine.id, Status::Done).await;
    let metrics = inlet.metrics().await;
    for kind in ["trap", "fuel", "out_of_memory"] {
        let line = format!("inlet_plugin_faults_total{{route=\"hostile\",call=\"decode\",kind=\"{kind}\"}} 1");
        assert!(metrics.contains(&line), "missing {line}:\n{metrics}");
    }

    // Repair: ship a fixed plugin (here the same one) and requeue; the entry is decoded
    // again. The garbage is still garbage, so it parks again with the same error.
    let garbage_id = inlet.entries("wo").await[0].id;
    assert!(inlet.store.requeue(garbage_id, 0).await.unwrap());
    let e = inlet.next_settled(garbage_id, 0).await;
    assert_eq!(e.status, Status::Parked);
    assert!(e.last_error.unwrap().starts_with("decode failed"));
    inlet.stop().await;
}

/// Must show 8: the inbox is unreachable → the push is answered 503 and nothing is
/// acknowledged; when it is back, the redelivery is stored and relayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_store_answers_503_and_acks_nothing() {
    let pg = TestPg::new().await;
    let proxy = TcpProxy::start("127.0.0.1:5432").await;
    let url = pg.url.replace("127.0.0.1:5432", &proxy.addr);
    assert_ne!(url, pg.url, "the store must go through the proxy");
    let camunda = FakeCamunda::start().await;
    let inlet =
        Inlet::start_with_store(&url, &route("wo", &camunda.url(), ""), None, tempfile::tempdir().unwrap(), None).await;
    let mut direct = pg.connect().await;

    assert_eq!(inlet.push("wo", &work_order(1, "K"), "m-1").await, 200);
    // Settled before the cut: an attempt whose settle fails in an outage stays
    // IN_PROGRESS until its lease expires and is then delivered again (at least once).
    let first = inlet.entries("wo").await[0].id;
    inlet.wait_status(first, Status::Done).await;
    proxy.set_up(false);
    assert_eq!(inlet.push("wo", &work_order(2, "K"), "m-2").await, 503, "no commit, no ack");
    assert_eq!(inlet.push("wo", &work_order(2, "K"), "m-2").await, 503);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox_entry").fetch_one(&mut direct).await.unwrap();
    assert_eq!(rows, 1, "nothing stored while unreachable");
    let metrics = inlet.metrics().await;
    assert!(metrics.contains("inlet_ingest_failures_total{route=\"wo\"} 2"), "{metrics}");

    proxy.set_up(true);
    wait_until("the redelivery to be accepted", WAIT, || async {
        inlet.push("wo", &work_order(2, "K"), "m-2").await == 200
    })
    .await;
    wait_until("both delivered", WAIT, || async { camunda.correlated_seqs("K") == vec![1, 2] }).await;
    inlet.stop().await;
    drop(pg);
}

#[allow(dead_code)]
fn by_key(entries: &[Entry]) -> HashMap<String, Vec<i64>> {
    let mut m: HashMap<String, Vec<i64>> = HashMap::new();
    for e in entries {
        m.entry(e.correlation_key.clone().unwrap_or_default()).or_default().push(e.id);
    }
    m
}

/// Must show 8 on the embedded store: SQLite cannot be unplugged like a server, but
/// another process can hold its write lock past Inlet's 10 s busy timeout. The push is
/// then answered 503 (nothing stored, nothing acked), and accepted once the lock is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_locked_past_the_busy_timeout_answers_503_and_acks_nothing() {
    use sqlx::Connection as _;
    let camunda = FakeCamunda::start().await;
    let inlet = Inlet::start(Backend::Sqlite, &route("wo", &camunda.url(), ""), None).await;
    let path = inlet._dir.path().join("inbox.db");
    let mut locker =
        sqlx::SqliteConnection::connect_with(&sqlx::sqlite::SqliteConnectOptions::new().filename(&path)).await.unwrap();
    sqlx::query("BEGIN EXCLUSIVE").execute(&mut locker).await.unwrap();
    assert_eq!(inlet.push("wo", &work_order(1, "K"), "m-1").await, 503, "no commit, no ack");
    sqlx::query("ROLLBACK").execute(&mut locker).await.unwrap();
    assert!(inlet.entries("wo").await.is_empty(), "nothing stored while locked");
    assert!(inlet.metrics().await.contains("inlet_ingest_failures_total{route=\"wo\"} 1"));

    assert_eq!(inlet.push("wo", &work_order(1, "K"), "m-1").await, 200, "the redelivery is stored");
    wait_until("delivered", WAIT, || async { camunda.correlated_seqs("K") == vec![1] }).await;
    inlet.stop().await;
}

/// The settles' group commit is told of every delivery slot in use (so a batch can wait
/// for the settles of attempts that end together), and both groups count their batches:
/// what `/metrics` shows as `inlet_group_commit_*`, and the only sign, short of a
/// benchmark, that the relay's slots still tell the group what to expect.
async fn group_commits_count_their_batches_and_the_delivery_slots_in_use(backend: Backend) {
    // Slow enough to read the metrics while the three attempts are out, with seconds
    // to spare on a loaded machine (the first answer would take its slot back).
    let camunda = FakeCamunda::start().await.with_delay(Duration::from_secs(10));
    let routes = route("wo", &camunda.url(), "").replace("timeout = \"2s\"", "timeout = \"30s\"");
    let inlet = Inlet::start(backend, &routes, None).await;
    let value = |name: &str, group: &str| {
        let series = format!("inlet_group_commit_{name}{{group=\"{group}\"}}");
        let (http, base) = (inlet.http.clone(), inlet.base.clone());
        async move { inlet_testkit::metrics::series(&http, &base, &series).await }
    };
    assert_eq!(value("expected_writes", "settles").await, Some(0.0), "shown at zero before any work");
    assert_eq!(value("batch_size_count", "inserts").await, Some(0.0), "shown at zero before any work");

    for (seq, key) in ["A", "B", "C"].into_iter().enumerate() {
        assert_eq!(inlet.push("wo", &work_order(seq as u32 + 1, key), &format!("m-{key}")).await, 200);
    }
    let inserted = value("batch_size_sum", "inserts").await.expect("insert batches shown");
    assert_eq!(inserted, 3.0, "each push's insert went through the inserts' group");
    wait_until("three attempts at the target", WAIT, || async { camunda.count() == 3 }).await;
    assert_eq!(value("expected_writes", "settles").await, Some(3.0), "each delivery slot in use expects its settle");

    for entry in inlet.entries("wo").await {
        inlet.wait_status(entry.id, Status::Done).await;
    }
    wait_until("the slots to be given back", WAIT, || async { value("expected_writes", "settles").await == Some(0.0) })
        .await;
    let settled = value("batch_size_sum", "settles").await.expect("settle batches shown");
    let batches = value("batch_size_count", "settles").await.expect("settle batches shown");
    assert_eq!(settled, 3.0, "three settles went through the settles' group");
    assert!((1.0..=3.0).contains(&batches), "{batches} batches for three settles");
    assert_eq!(value("seconds_count", "settles").await, Some(batches), "each batch's write is timed");
    inlet.stop().await;
}

/// On a route with more keys than delivery slots, a key's settles hand its next
/// entries on (no claim of the relay's for them), but only for a bounded run while no
/// slot is free (`HAND_ON_SHARED_LIMIT`, 16): then the relay's claim, oldest first,
/// takes the entry of a key that waited. One slot, so a relay keeps two attempts (one
/// delivering, one whose settle is out: `SETTLING_PER_SLOT`); two keys' runs hold both.
/// A1, C1, …, A5, C5, then B1, then A6–A40 and C6–C40 in turns, all stored before the
/// relay may claim. Without handing on, B1 would go eleventh (its id is older than
/// A6's); handed on without a bound, last; here once one of the two runs has ended
/// (A1 and the 16 handed on after it, C's as many beside it) and its slot is free.
/// PostgreSQL only: SQLite's settles hand nothing on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_more_keys_than_slots_a_key_keeps_its_slot_for_a_bounded_run() {
    let camunda = FakeCamunda::start().await;
    let inlet = Inlet::start(Backend::Postgres, &route("wo", &camunda.url(), "concurrency = 1"), None).await;
    let mut pushes: Vec<(&str, u32)> = (1..=5).flat_map(|seq| [("A", seq), ("C", seq)]).collect();
    pushes.push(("B", 1));
    pushes.extend((6..=40).flat_map(|seq| [("A", seq), ("C", seq)]));
    inlet.push_work_orders_while_paused("wo", &pushes).await;
    wait_until("81 deliveries", WAIT, || async { camunda.count() >= 81 }).await;

    assert_eq!(camunda.correlated_seqs("A"), (1..=40).collect::<Vec<i64>>(), "A's order");
    assert_eq!(camunda.correlated_seqs("C"), (1..=40).collect::<Vec<i64>>(), "C's order");
    assert_eq!(camunda.correlated_seqs("B"), [1], "B delivered once");
    assert_eq!(camunda.max_in_flight_per_key(), 1, "overlaps: {:?}", camunda.overlaps());
    assert_eq!(camunda.max_in_flight(), 1, "one slot: one delivery at a time");
    let keys: Vec<String> = camunda.deliveries().into_iter().map(|d| d.key).collect();
    let b_at = keys.iter().position(|k| k == "B").expect("B delivered");
    // Each run is its first entry and 16 handed on; B1 goes when one of them has ended
    // and a slot is free, so after both runs' 34 deliveries at most (seen: 33 and 34;
    // two more for the order in which the runs' last settles and the claim meet), not
    // after 80; and not before one run has ended (17).
    assert!((17..=36).contains(&b_at), "B1 went at position {b_at} (from 0): {keys:?}");
    let handed_on =
        inlet_testkit::metrics::series(&inlet.http, &inlet.base, "inlet_claims_handed_on_total{route=\"wo\"}")
            .await
            .unwrap_or(0.0);
    assert!(handed_on >= 20.0, "A's and C's entries were handed on by their settles ({handed_on})");
    inlet.stop().await;
}

/// A slot is given back when the target has answered, before the attempt's settle
/// commits, and the relay claims another key's entry for it meanwhile: the target
/// still never has more requests in flight than the route's concurrency, and a key
/// never two. Twenty keys of three entries each, concurrency 3, every answer 30 ms
/// late so that requests overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_given_back_before_the_settle_keep_the_route_within_its_concurrency() {
    for backend in [Backend::Postgres, Backend::Sqlite] {
        let camunda = FakeCamunda::start().await.with_delay(Duration::from_millis(30));
        let inlet = Inlet::start(backend, &route("wo", &camunda.url(), "concurrency = 3"), None).await;
        for seq in 1..=3 {
            for key in 0..20 {
                let key = format!("K{key}");
                assert_eq!(inlet.push("wo", &work_order(seq, &key), &format!("m-{key}-{seq}")).await, 200);
            }
        }
        wait_until("60 deliveries", WAIT, || async { camunda.count() >= 60 }).await;
        for key in 0..20 {
            assert_eq!(camunda.correlated_seqs(&format!("K{key}")), [1, 2, 3], "K{key}'s order ({backend:?})");
        }
        assert_eq!(camunda.max_in_flight_per_key(), 1, "overlaps: {:?}", camunda.overlaps());
        assert_eq!(camunda.max_in_flight(), 3, "the route's concurrency bounds the requests in flight ({backend:?})");
        inlet.stop().await;
    }
}

/// An entry handed on by its key's settle waits for a delivery slot only while its
/// lease still covers a delivery: on a route whose lease leaves no room to wait
/// (target timeout 1 s, one step, lease 2 s), with its one slot taken by another
/// key's delivery (each answer 300 ms late; the relay claims for a slot as soon as
/// it is given back, before the settle that hands on has committed), the entry is
/// handed back undelivered, OPEN at once, and claimed again. Two keys in turns,
/// eight entries each: each delivered once, in its key's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_handed_on_is_handed_back_when_no_slot_comes_free_within_its_lease() {
    let camunda = FakeCamunda::start().await.with_delay(Duration::from_millis(300));
    let route = format!(
        "[[route]]\nname = \"wo\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"http\", url = \"{}\", timeout = \"1s\" }}\nmax_steps = 1\nlease = \"2s\"\nconcurrency = 1\n",
        plugin_path("work_order").display(),
        camunda.url()
    );
    let inlet = Inlet::start(Backend::Postgres, &route, None).await;
    let pushes: Vec<(&str, u32)> = (1..=8).flat_map(|seq| [("A", seq), ("B", seq)]).collect();
    inlet.push_work_orders_while_paused("wo", &pushes).await;
    wait_until("16 entries DONE", WAIT, || async {
        inlet.entries("wo").await.iter().filter(|e| e.status == Status::Done).count() == 16
    })
    .await;

    assert_eq!(camunda.correlated_seqs("A"), (1..=8).collect::<Vec<i64>>(), "A delivered once each, in order");
    assert_eq!(camunda.correlated_seqs("B"), (1..=8).collect::<Vec<i64>>(), "B delivered once each, in order");
    assert_eq!(camunda.count(), 16, "nothing delivered twice");
    assert_eq!(camunda.max_in_flight(), 1, "one slot: one delivery at a time");
    let handed_back: Vec<Entry> = inlet
        .entries("wo")
        .await
        .into_iter()
        .filter(|e| e.last_error.as_deref().is_some_and(|e| e.contains("handed back undelivered")))
        .collect();
    assert!(!handed_back.is_empty(), "some entry handed on waited for the slot and was handed back");
    for e in &handed_back {
        assert!(e.attempts >= 2, "entry {} was claimed again after it was handed back: {e:?}", e.id);
    }
    inlet.stop().await;
}

/// Shutdown waits for in-flight deliveries only as long as the grace period: a
/// delivery still running then is abandoned and its entry handed back (OPEN, no
/// lease), so the next instance takes it at once, not when its lease expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_abandons_deliveries_still_running_after_the_grace_period() {
    let camunda = FakeCamunda::start().await.with_delay(Duration::from_secs(8));
    let route = format!(
        "[[route]]\nname = \"wo\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"http\", url = \"{}\", timeout = \"20s\" }}\nmax_steps = 1\n",
        plugin_path("work_order").display(),
        camunda.url()
    );
    let inlet = start_on_sqlite(&route, |o| o.grace = Duration::from_millis(300)).await;
    let r = reqwest::Client::new()
        .post(format!("{}/push/wo", inlet.base()))
        .header("content-type", "application/json")
        .body(push_envelope(&work_order(1, "WO-1"), &[], "m-1").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    wait_until("the delivery to be in flight", Duration::from_secs(10), || async { camunda.count() == 1 }).await;

    let store = Arc::clone(&inlet.running.shared.store);
    let started = std::time::Instant::now();
    inlet.running.stop().await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "stop waited {took:?} for an 8 s delivery despite a 300 ms grace period");
    let entry = store.get(1).await.unwrap().expect("the entry");
    assert_eq!(entry.status, Status::Open, "abandoned, not settled, and handed back");
    assert_eq!((entry.lease_owner, entry.lease_expires_at), (None, None), "no lease to wait out");
}
