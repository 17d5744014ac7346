//! Repair by filter on real parts: 500 parked entries over 20
//! keys with two different errors, a real `inlet` process, a real HTTP target. The
//! failure groups show the two; a dry run of one group counts it and moves nothing;
//! the real requeue runs as a job at its rate, the process is SIGKILLed mid-job, and
//! a restarted one finishes it: every entry of the group delivered, in per-key order,
//! no faster than the rate, the other group untouched.

use std::time::{Duration, Instant};

use inlet::inbox::{Decoded, NewEntry, Status};
use inlet_testkit::camunda::{FakeCamunda, Reply};
use inlet_testkit::paths::plugin_path;
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use inlet_testkit::wait::{wait_for, wait_until};

const KEYS: usize = 20;
const PER_KEY: usize = 25;
const RATE: usize = 10;

fn work_order(seq: usize, key: &str) -> Vec<u8> {
    format!(r#"{{"workOrderId":"{key}","completedItems":{seq},"completionTimestamp":"2026-08-01T10:00:00Z"}}"#)
        .into_bytes()
}

/// Entry `seq` of `key`, parked with `error` as if a delivery had failed.
fn parked(key: &str, seq: usize, error: String) -> NewEntry {
    let data = work_order(seq, key);
    NewEntry {
        route: "wo".into(),
        dedup_key: format!("{key}-{seq}"),
        decoded: Some(Decoded {
            event_type: "work-order-completed".into(),
            correlation_key: key.into(),
            schema_version: None,
            body: data.clone(),
        }),
        raw_data: data,
        attributes: Vec::new(),
        message_id: format!("m-{key}-{seq}"),
        publish_time: None,
        delivery_attempt: None,
        status: Status::Parked,
        last_error: Some(error),
    }
}

async fn api(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let mut req = http.request(method, url);
    if let Some(body) = body {
        req = req.header("content-type", "application/json").body(body.to_string());
    }
    let resp = req.send().await.unwrap_or_else(|e| panic!("{url}: {e}"));
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{url}: not JSON ({e}): {text}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_group_is_requeued_by_a_rate_limited_job_that_survives_a_kill() {
    let camunda = FakeCamunda::with_behaviour(|_, _| Reply::Ok).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("inbox.db");
    let url = format!("sqlite://{}", db.display());
    let port = free_port();
    let config = dir.path().join("inlet.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"{url}\"\n\n[server]\nlisten = \"127.0.0.1:{port}\"\n\n[admin]\nauth = \"none-loopback\"\n\n\
             [[route]]\nname = \"wo\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\n\
             target = {{ kind = \"http\", url = \"{}\", timeout = \"2s\" }}\nlease = \"10s\"\n",
            plugin_path("work_order").display(),
            camunda.url()
        ),
    )
    .unwrap();

    // Keys 0–9 parked after a gateway outage, keys 10–19 for several matches: the
    // numbers in the errors differ from entry to entry, the groups do not.
    let store = inlet::inbox::open(&url, 4).await.expect("open the inbox");
    for k in 0..KEYS {
        let key = format!("key-{k}");
        for seq in 1..=PER_KEY {
            let error = if k < 10 {
                format!(
                    "gave up after {} attempts: target answered 503: gateway node {} busy",
                    3 + seq % 4,
                    k * 7 + seq
                )
            } else {
                format!("Cannot correlate message 'WorkOrderCompleted': {} executions match", 2 + seq % 3)
            };
            store.insert(&parked(&key, seq, error), 1_000 + seq as i64).await.unwrap();
        }
    }
    drop(store);

    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let mut first = InletProcess::spawn(&config, &[]);
    first.wait_healthy(Duration::from_secs(30)).await;
    let base = first.base.clone();

    let (status, groups) = api(&http, reqwest::Method::GET, &format!("{base}/api/failures?route=wo"), None).await;
    assert_eq!(status, 200, "{groups}");
    let groups = groups["groups"].as_array().unwrap().clone();
    let sizes: Vec<(i64, i64)> =
        groups.iter().map(|g| (g["parked"].as_i64().unwrap(), g["keys"].as_i64().unwrap())).collect();
    assert_eq!(sizes, [(250, 10), (250, 10)], "{groups:#?}");
    let outage =
        groups.iter().find(|g| g["fingerprint"].as_str().unwrap().contains("answered 503")).expect("the outage group")
            ["fingerprint"]
            .as_str()
            .unwrap()
            .to_string();

    let request = |dry_run: bool| serde_json::json!({ "action": "requeue", "route": "wo", "fingerprint": outage, "rate": RATE, "dry_run": dry_run });
    let (status, dry) = api(&http, reqwest::Method::POST, &format!("{base}/api/repairs"), Some(request(true))).await;
    assert_eq!(status, 200, "{dry}");
    assert_eq!(dry["matches"]["count"], 250, "{dry}");
    assert_eq!(dry["matches"]["distinct_keys"], 10, "{dry}");
    // A window in which nothing may be delivered: a dry run that moved entries would
    // have them at the target by now; there is no event to poll for.
    tokio::time::sleep(Duration::from_millis(500)).await; // a window for what must not happen
    assert_eq!(camunda.count(), 0, "a dry run moves nothing");
    let (_, still) = api(&http, reqwest::Method::GET, &format!("{base}/api/failures?route=wo"), None).await;
    assert_eq!(still["groups"].as_array().unwrap().len(), 2, "{still}");

    let started = Instant::now();
    let (status, job) = api(&http, reqwest::Method::POST, &format!("{base}/api/repairs"), Some(request(false))).await;
    assert_eq!(status, 202, "{job}");
    let job_id = job["job"].as_i64().unwrap();
    wait_until("a fifth of the group delivered", Duration::from_secs(60), || async { camunda.count() >= 50 }).await;
    first.sigkill();
    let at_kill = camunda.count();
    assert!(at_kill < 250, "the kill must come mid-job ({at_kill} delivered)");

    let mut second = InletProcess::spawn(&config, &[]);
    second.wait_healthy(Duration::from_secs(30)).await;
    let base = second.base.clone();
    let finished = wait_for("the job to finish", Duration::from_secs(120), || {
        let (http, url) = (http.clone(), format!("{base}/api/repairs"));
        async move {
            let (_, jobs) = api(&http, reqwest::Method::GET, &url, None).await;
            let job = jobs["jobs"].as_array()?.iter().find(|j| j["id"] == job_id)?.clone();
            (job["state"] == "done").then_some(job)
        }
    })
    .await;
    wait_until("every requeued entry delivered", Duration::from_secs(60), || async {
        (0..10).all(|k| {
            let mut seqs = camunda.correlated_seqs(&format!("key-{k}"));
            seqs.dedup();
            seqs.len() >= PER_KEY
        })
    })
    .await;
    let elapsed = started.elapsed();

    assert_eq!(finished["moved"], 250, "each entry requeued once: {finished}");
    for k in 0..10 {
        let mut seqs = camunda.correlated_seqs(&format!("key-{k}"));
        // A delivery in flight at the kill may be repeated by the next instance.
        seqs.dedup();
        assert_eq!(seqs, (1..=PER_KEY as i64).collect::<Vec<_>>(), "key-{k} delivered in order");
    }
    for k in 10..KEYS {
        assert!(camunda.correlated_seqs(&format!("key-{k}")).is_empty(), "the other group is untouched");
    }
    assert_eq!(camunda.max_in_flight_per_key(), 1);
    let repeats = camunda.count() - 250;
    println!("{at_kill} delivered at the kill; {repeats} repeated after it; job done in {elapsed:?}");
    assert!(repeats <= 8, "only deliveries in flight at the kill may repeat ({repeats})");
    // 250 entries at 10 per second take 25 s; a tick of slack for the first one.
    assert!(elapsed >= Duration::from_secs(24), "faster than the rate: 250 entries in {elapsed:?}");

    let (_, left) = api(&http, reqwest::Method::GET, &format!("{base}/api/failures?route=wo"), None).await;
    let left: Vec<i64> = left["groups"].as_array().unwrap().iter().map(|g| g["parked"].as_i64().unwrap()).collect();
    assert_eq!(left, [250], "only the other group is left");
    let (_, audit) = api(&http, reqwest::Method::GET, &format!("{base}/api/audit"), None).await;
    let actions: Vec<&str> = audit["audit"].as_array().unwrap().iter().map(|a| a["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["repair-requeue", "repair-requeue"], "started and done: {audit}");
    drop(second);
}
