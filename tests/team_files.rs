//! Teams own their routing files: a directory of them, one team's broken route refused
//! alone (reported in the log, a metric and `/api/routes`; `/readyz` stays ready), and brought up
//! by the next reload once fixed, without a restart.

use std::path::Path;
use std::time::Duration;

use inlet::app;
use inlet::config::Config;
use inlet_testkit::camunda::FakeCamunda;
use inlet_testkit::paths::plugin_path;
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use inlet_testkit::push::push_envelope;
use inlet_testkit::wait::{wait_for, wait_until};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

/// A push route to the work-order plugin at `plugin` (as written in the file).
fn route(name: &str, plugin: &str, target: &str) -> String {
    format!("[[route]]\nname = \"{name}\"\nplugin = \"{plugin}\"\nsource = {{ kind = \"push\" }}\ntarget = {target}\n")
}

fn http_target(camunda: &FakeCamunda) -> String {
    format!("{{ kind = \"http\", url = \"{}\", timeout = \"5s\" }}", camunda.url())
}

/// Writes beside, then renames over, as a deployment would.
fn replace(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn work_order_event(key: &str, seq: u32) -> Vec<u8> {
    format!(r#"{{"workOrderId":"{key}","completedItems":{seq},"completionTimestamp":"t"}}"#).into_bytes()
}

async fn get_json(http: &reqwest::Client, url: String) -> (u16, Value) {
    let r = http.get(url).send().await.unwrap();
    let status = r.status().as_u16();
    (status, serde_json::from_str(&r.text().await.unwrap()).unwrap_or(Value::Null))
}

async fn reload(http: &reqwest::Client, base: &str) -> Value {
    let r = http.post(format!("{base}/api/reload")).send().await.unwrap();
    serde_json::from_str(&r.text().await.unwrap()).unwrap()
}

async fn push(http: &reqwest::Client, base: &str, route: &str, key: &str, seq: u32) -> u16 {
    let envelope = push_envelope(&work_order_event(key, seq), &[], &format!("{route}-{key}-{seq}"));
    http.post(format!("{base}/push/{route}"))
        .header("content-type", "application/json")
        .body(envelope.to_string())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_plugin_built_for_another_contract_refuses_only_its_route_until_its_file_is_fixed() {
    let camunda = FakeCamunda::start().await;
    let dir = tempfile::tempdir().unwrap();
    let routes = dir.path().join("routes.d");
    std::fs::create_dir(&routes).unwrap();
    // The platform's file holds the shared settings; each team has its own file. The
    // broken plugin is named relative to its team's file.
    std::fs::copy(plugin_path("future_contract"), routes.join("billing.wasm")).unwrap();
    std::fs::write(
        routes.join("00-platform.toml"),
        "[store]\nurl = \"sqlite://inbox.db\"\n\n[admin]\nauth = \"none-loopback\"\n",
    )
    .unwrap();
    let good = plugin_path("work_order").display().to_string();
    std::fs::write(routes.join("orders.toml"), route("orders", &good, &http_target(&camunda))).unwrap();
    let billing_file = routes.join("billing.toml");
    std::fs::write(&billing_file, route("billing", "billing.wasm", &http_target(&camunda))).unwrap();

    let listen = format!("127.0.0.1:{}", free_port());
    let mut inlet = InletProcess::spawn_with_args(&routes, &["--listen", &listen, "--poll", "50ms"], &[]);
    inlet.wait_healthy(WAIT).await;
    let base = inlet.base.clone();
    let http = reqwest::Client::new();

    // The other team's route starts and delivers.
    assert_eq!(push(&http, &base, "orders", "o-1", 1).await, 200);
    wait_until("orders delivered", WAIT, || async { camunda.correlated_seqs("o-1") == vec![1] }).await;
    assert!(routes.join("inbox.db").is_file(), "sqlite url relative to the file that names it");

    // The broken one answers 503 (Pub/Sub redelivers later) and is reported everywhere.
    assert_eq!(push(&http, &base, "billing", "b-1", 1).await, 503);
    // Ready (the healthy routes run), and nothing more: the detail is for the admin API.
    let (status, ready) = get_json(&http, format!("{base}/readyz")).await;
    assert_eq!((status, ready), (200, serde_json::json!({ "status": "ready" })));

    let (_, api) = get_json(&http, format!("{base}/api/routes")).await;
    let by_name = |name: &str| api["routes"].as_array().unwrap().iter().find(|r| r["name"] == name).cloned().unwrap();
    let orders = by_name("orders");
    assert_eq!((orders["state"].as_str(), orders["source"].as_str()), (Some("up"), Some("push")), "{api}");
    assert_eq!(orders["plugin_sha256"].as_str().map(str::len), Some(64), "{api}");
    assert!(orders["error"].is_null(), "{api}");
    let billing = by_name("billing");
    assert_eq!(billing["state"], "refused", "{api}");
    assert!(billing["file"].as_str().unwrap().ends_with("billing.toml"), "{api}");
    assert!(billing["error"].as_str().unwrap().contains("built against plugin contract 0.2.0"), "{api}");

    let metrics = http.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("inlet_route_up{route=\"orders\"} 1"), "{metrics}");
    assert!(metrics.contains("inlet_route_up{route=\"billing\"} 0"), "{metrics}");
    assert!(metrics.contains("inlet_route_load_failures_total{route=\"billing\"} 1"), "{metrics}");

    // A reload that reads the same broken plugin again reports nothing new.
    let report = reload(&http, &base).await;
    assert_eq!(report["routing_file"]["result"], "unchanged", "{report}");
    assert_eq!(report["refused"][0]["route"], "billing", "{report}");
    let refusals = |log: &str| log.lines().filter(|l| l.contains("route refused") && l.contains("billing")).count();
    assert_eq!(refusals(&inlet.log()), 1, "logged once per cause:\n{}", inlet.log());

    // Fixed: the team points its route at a good plugin; the next reload brings it up.
    std::fs::write(&billing_file, route("billing", &good, &http_target(&camunda))).unwrap();
    let report = reload(&http, &base).await;
    assert_eq!(report["routing_file"]["result"], "applied", "{report}");
    assert_eq!(report["routing_file"]["added"], serde_json::json!(["billing"]), "{report}");
    assert_eq!(report["routing_file"]["changed"], serde_json::json!([]), "orders untouched: {report}");
    assert_eq!(report["refused"], serde_json::json!([]), "{report}");

    // Pub/Sub's redelivery of the refused message now goes through, and so do new ones.
    assert_eq!(push(&http, &base, "billing", "b-1", 1).await, 200);
    assert_eq!(push(&http, &base, "billing", "b-1", 2).await, 200);
    wait_until("billing delivered", WAIT, || async { camunda.correlated_seqs("b-1") == vec![1, 2] }).await;
    let (_, api) = get_json(&http, format!("{base}/api/routes")).await;
    assert!(api["routes"].as_array().unwrap().iter().all(|r| r["state"] == "up"), "{api}");
    let metrics = http.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("inlet_route_up{route=\"billing\"} 1"), "{metrics}");
    inlet.assert_running();
    assert!(inlet.sigterm_and_wait(WAIT).success());
}

/// The same, in process and on the reload timer: a fixed plugin *file* brings its route
/// up; a team file that stops parsing keeps that team's running routes on their last
/// good version; a removed file removes its routes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_timer_retries_a_fixed_plugin_and_a_broken_team_file_keeps_its_last_good_version() {
    let dir = tempfile::tempdir().unwrap();
    let good = plugin_path("work_order");
    let b_plugin = dir.path().join("b.wasm");
    std::fs::copy(plugin_path("future_contract"), &b_plugin).unwrap();
    std::fs::write(
        dir.path().join("platform.toml"),
        "[store]\nurl = \"sqlite://inbox.db\"\n\n[admin]\nauth = \"none-loopback\"\n",
    )
    .unwrap();
    let team_a = dir.path().join("team-a.toml");
    std::fs::write(&team_a, route("a", &good.display().to_string(), "{ kind = \"log\" }")).unwrap();
    let team_b = dir.path().join("team-b.toml");
    std::fs::write(&team_b, route("b", "b.wasm", "{ kind = \"log\" }")).unwrap();
    // Not a routing file: ignored.
    std::fs::write(dir.path().join("notes.txt"), "[[route]]\nname = 3\n").unwrap();

    let config = Config::load_partial(dir.path()).unwrap();
    assert_eq!(config.routes.len(), 2, "both routes validate; b's plugin fails only when loaded");
    let options = app::Options {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        poll: Duration::from_millis(20),
        reload_every: Some(Duration::from_millis(50)),
        plugin_cache: None,
        ..app::Options::default()
    };
    let running = app::start(&config, options).await.unwrap();
    let base = format!("http://{}", running.addr);
    let http = reqwest::Client::new();
    assert_eq!(push(&http, &base, "a", "k", 1).await, 200);
    assert_eq!(push(&http, &base, "b", "k", 1).await, 503);

    replace(&b_plugin, &std::fs::read(&good).unwrap());
    wait_for("route b up on the timer", WAIT, || async {
        (push(&http, &base, "b", "k", 2).await == 200).then_some(())
    })
    .await;

    std::fs::write(&team_a, "[[route]\nname = \"a\"\n").unwrap();
    // A file that does not parse names no route: it is listed as a file, and its
    // routes keep their last good version.
    let api = wait_for("the broken team file reported", WAIT, || async {
        let (_, v) = get_json(&http, format!("{base}/api/routes")).await;
        (v["refused_files"].as_array().is_some_and(|f| !f.is_empty())).then_some(v)
    })
    .await;
    assert!(api["refused_files"][0]["file"].as_str().unwrap().ends_with("team-a.toml"), "{api}");
    let a = api["routes"].as_array().unwrap().iter().find(|r| r["name"] == "a").cloned().unwrap();
    assert_eq!(a["state"], "up", "{api}");
    assert!(a["error"].as_str().unwrap().contains("a newer version was refused"), "{api}");
    assert_eq!(push(&http, &base, "a", "k", 2).await, 200, "team a's route still runs");
    assert_eq!(push(&http, &base, "b", "k", 3).await, 200, "team b is unaffected");

    std::fs::remove_file(&team_b).unwrap();
    wait_until("route b removed with its file", WAIT, || async { push(&http, &base, "b", "k", 4).await == 404 }).await;
    assert_eq!(push(&http, &base, "a", "k", 3).await, 200);
    running.stop().await;
}
