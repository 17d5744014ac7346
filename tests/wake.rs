//! Instances on one PostgreSQL inbox wake each other (LISTEN/NOTIFY) instead of
//! waiting for their poll interval: what one instance — or a CLI repair — makes
//! claimable, every instance hears of at once.

use std::time::{Duration, Instant};

use inlet::inbox::Status;
use inlet_testkit::camunda::{FakeCamunda, Reply};
use inlet_testkit::paths::plugin_path;
use inlet_testkit::pg::TestPg;
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use inlet_testkit::push::{post_push, push_envelope};
use inlet_testkit::wait::{wait_for, wait_until};

/// Long enough that a delivery within [`WITHIN`] can only come from a wake-up.
const POLL: &str = "300s";
const WITHIN: Duration = Duration::from_secs(45);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announcement_reaches_every_listener_on_the_inbox() {
    let pg = TestPg::new().await;
    let speaker = inlet::inbox::open(&pg.url, 2).await.unwrap();
    let listener = inlet::inbox::open(&pg.url, 2).await.unwrap();
    let mut heard = listener.announcements().expect("PostgreSQL announces");
    // The listener connects in the background: announce until it hears.
    let mut got = Vec::new();
    let deadline = Instant::now() + WITHIN;
    while got.len() < 2 {
        assert!(Instant::now() < deadline, "no announcement heard; got {got:?}");
        speaker.announce(&["wo".to_string(), "other".to_string()]).await.expect("announce");
        while let Ok(Some(route)) = tokio::time::timeout(Duration::from_millis(300), heard.recv()).await {
            if !got.contains(&route) {
                got.push(route);
            }
        }
    }
    got.sort();
    assert_eq!(got, ["other", "wo"]);

    let dir = tempfile::tempdir().unwrap();
    let sqlite = inlet::inbox::open(&format!("sqlite://{}", dir.path().join("i.db").display()), 1).await.unwrap();
    assert!(sqlite.announcements().is_none(), "one instance per SQLite file: nobody to hear");
    sqlite.announce(&["wo".to_string()]).await.expect("a no-op on SQLite");
}

/// A stream of inserts is announced at most once per `ANNOUNCE_SPACING`, and the
/// last of them is announced too: nothing queued is dropped by the spacing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_announcements_is_spaced_and_its_last_is_heard() {
    use inlet::ingest::{ANNOUNCE_SPACING, Ingest};
    let pg = TestPg::new().await;
    let speaker = inlet::inbox::open(&pg.url, 2).await.unwrap();
    let listener = inlet::inbox::open(&pg.url, 2).await.unwrap();
    let mut heard = listener.announcements().expect("PostgreSQL announces");
    // Wait until the listener is connected: announce until it hears.
    let deadline = Instant::now() + WITHIN;
    loop {
        assert!(Instant::now() < deadline, "the listener never heard an announcement");
        speaker.announce(&["ready".to_string()]).await.unwrap();
        if let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(300), heard.recv()).await {
            break;
        }
    }
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(300), heard.recv()).await {}

    let clock = inlet::clock::ManualClock::starting_now();
    let ingest =
        Ingest::new(speaker, clock, std::sync::Arc::new(inlet::telemetry::Metrics::new())).with_announcements();
    let start = Instant::now();
    let mut calls = 0;
    while start.elapsed() < Duration::from_millis(500) {
        ingest.announce("wo");
        calls += 1;
        tokio::task::yield_now().await;
    }
    ingest.announce("last");
    let burst = start.elapsed();
    let mut wo = 0;
    let last = tokio::time::timeout(WITHIN, async {
        while let Some(route) = heard.recv().await {
            match route.as_str() {
                "wo" => wo += 1,
                "last" => return,
                other => panic!("heard {other}"),
            }
        }
        panic!("the listener stopped");
    })
    .await;
    assert!(last.is_ok(), "the announcement made last was never heard");
    let most = (burst.as_millis() / ANNOUNCE_SPACING.as_millis()) as u64 + 2;
    assert!(wo >= 1, "{calls} calls and no announcement heard");
    assert!(wo <= most, "{wo} announcements in {burst:?} ({calls} calls), more than one per {ANNOUNCE_SPACING:?}");
}

/// Claims the relay of route `wo` has made (`inlet_claim_duration_seconds_count`).
async fn claims(http: &reqwest::Client, base: &str) -> u64 {
    let metrics = http.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    metrics
        .lines()
        .find(|l| l.starts_with("inlet_claim_duration_seconds_count{route=\"wo\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A running instance polling every five minutes delivers an entry requeued by a
/// CLI process (another process, no relay of its own) within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeue_from_the_cli_wakes_a_running_instance_at_once() {
    let pg = TestPg::new().await;
    let camunda =
        FakeCamunda::with_behaviour(|_, attempt| if attempt == 1 { Reply::SeveralMatch } else { Reply::Ok }).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("inlet.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"{}\"\n\n[[route]]\nname = \"wo\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\n\
             target = {{ kind = \"http\", url = \"{}\", timeout = \"2s\" }}\n",
            pg.url,
            plugin_path("work_order").display(),
            camunda.url()
        ),
    )
    .unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut inlet = InletProcess::spawn_with_args(&config, &["--listen", &listen, "--poll", POLL], &[]);
    inlet.wait_healthy(WITHIN).await;

    let http = reqwest::Client::new();
    let data = br#"{"workOrderId":"k","completedItems":1,"completionTimestamp":"t"}"#;
    assert_eq!(post_push(&http, &inlet.base, "wo", &push_envelope(data, &[], "m-1")).await, 200);
    let store = inlet::inbox::open(&pg.url, 2).await.unwrap();
    let id = wait_for("the entry to be parked (two executions match)", WITHIN, || async {
        let filter = inlet::inbox::ListFilter { status: Some(Status::Parked), limit: 10, ..Default::default() };
        let entries = store.list(&filter).await.unwrap();
        entries.into_iter().find(|e| e.status == Status::Parked).map(|e| e.id)
    })
    .await;
    // The relay goes idle after the attempt: it claims once more, finds nothing and
    // waits for its (five-minute) poll. Its claims are counted: at start, on the push,
    // after the attempt. Should a later claim still be on its way, the test would pass
    // without a wake-up, never fail.
    wait_until("the relay's claim after the attempt", WITHIN, || async { claims(&http, &inlet.base).await >= 3 }).await;

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inlet"))
        .args(["inbox", "requeue", &id.to_string(), "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(out.status.success(), "requeue: {}", String::from_utf8_lossy(&out.stderr));
    let requeued = Instant::now();
    wait_until("the requeued entry to be delivered without waiting for the poll", WITHIN, || async {
        camunda.correlated_seqs("k") == vec![1]
    })
    .await;
    println!("delivered {:?} after the requeue (poll interval {POLL})", requeued.elapsed());
    inlet.assert_running();
}
