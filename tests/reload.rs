//! Hot reload: a plugin file replaced on disk while messages flow is picked up
//! without losing or double-decoding a message; a corrupt file is refused and the
//! running version keeps serving.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use inlet::app;
use inlet::config::Config;
use inlet::inbox::{ListFilter, Status};
use inlet_testkit::camunda::FakeCamunda;
use inlet_testkit::paths::plugin_path;
use inlet_testkit::push::push_envelope;
use inlet_testkit::wait::wait_until;

const WAIT: Duration = Duration::from_secs(60);

fn replace(path: &std::path::Path, bytes: &[u8]) {
    // As a deployment would: write beside it, then rename over it.
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replacing_a_plugin_while_messages_flow_loses_nothing_and_refuses_a_corrupt_file() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("plugin.wasm");
    std::fs::copy(plugin_path("work_order"), &plugin).unwrap();
    let cfg = dir.path().join("inlet.toml");
    std::fs::write(
        &cfg,
        "[store]\nurl = \"sqlite://inbox.db\"\n\n[[route]]\nname = \"r\"\nplugin = \"plugin.wasm\"\nsource = { kind = \"push\" }\ntarget = { kind = \"log\" }\n",
    )
    .unwrap();
    let config = Config::load(&cfg).unwrap();
    let options = app::Options {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        poll: Duration::from_millis(20),
        reload_every: Some(Duration::from_millis(50)),
        plugin_cache: None,
        ..app::Options::default()
    };
    let running = app::start(&config, options).await.unwrap();
    let base = format!("http://{}", running.addr);
    let store = Arc::clone(&running.shared.store);
    let http = reqwest::Client::new();
    let metrics = |http: reqwest::Client, base: String| async move {
        http.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap()
    };

    // 10 pushers × 100 messages, each pusher's messages in sequence.
    let pushed = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let mut pushers = Vec::new();
    for p in 0..10 {
        let (http, base, pushed, gate) = (http.clone(), base.clone(), Arc::clone(&pushed), Arc::clone(&gate));
        pushers.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for n in 0..100 {
                if n == 30 || n == 60 {
                    // Wait for the test to change the plugin file.
                    gate.acquire().await.unwrap().forget();
                }
                let data = format!(r#"{{"workOrderId":"p{p}","completedItems":{n},"completionTimestamp":"t"}}"#);
                let envelope = push_envelope(data.as_bytes(), &[], &format!("m-{p}-{n}"));
                let res = http
                    .post(format!("{base}/push/r"))
                    .header("content-type", "application/json")
                    .body(envelope.to_string())
                    .send()
                    .await
                    .unwrap();
                assert_eq!(res.status().as_u16(), 200);
                let body: serde_json::Value = serde_json::from_str(&res.text().await.unwrap()).unwrap();
                ids.push(body["entry"].as_i64().unwrap());
                pushed.fetch_add(1, Ordering::SeqCst);
            }
            ids
        }));
    }

    wait_until("300 pushes", WAIT, || async { pushed.load(Ordering::SeqCst) == 300 }).await;
    replace(&plugin, &std::fs::read(plugin_path("hostile")).unwrap());
    wait_until("the new version to be swapped in", WAIT, || {
        let m = metrics(http.clone(), base.clone());
        async move { m.await.contains("inlet_plugin_reloads_total{route=\"r\",outcome=\"ok\"} 1") }
    })
    .await;
    gate.add_permits(10);

    wait_until("600 pushes", WAIT, || async { pushed.load(Ordering::SeqCst) == 600 }).await;
    replace(&plugin, b"\0asm this is not a component");
    wait_until("the corrupt version to be refused", WAIT, || {
        let m = metrics(http.clone(), base.clone());
        async move { m.await.contains("inlet_plugin_reloads_total{route=\"r\",outcome=\"refused\"} 1") }
    })
    .await;
    gate.add_permits(10);

    let mut per_pusher = Vec::new();
    for p in pushers {
        per_pusher.push(p.await.unwrap());
    }
    wait_until("every entry DONE", WAIT, || async {
        let all = store.list(&ListFilter { route: Some("r".into()), limit: 2000, ..Default::default() }).await.unwrap();
        all.len() == 1000 && all.iter().all(|e| e.status == Status::Done)
    })
    .await;

    let all = store.list(&ListFilter { route: Some("r".into()), limit: 2000, ..Default::default() }).await.unwrap();
    assert_eq!(all.len(), 1000, "one row per message: none lost, none twice");
    assert!(all.iter().all(|e| e.attempts == 1), "each delivered once");
    let version = |id: i64| all.iter().find(|e| e.id == id).unwrap().event_type.clone().unwrap();
    for ids in &per_pusher {
        let versions: Vec<String> = ids.iter().map(|id| version(*id)).collect();
        assert!(versions[..30].iter().all(|v| v == "work-order-completed"), "before the swap: {versions:?}");
        assert!(
            versions[30..].iter().all(|v| v == "hostile"),
            "after the swap, and after the corrupt file: {versions:?}"
        );
    }
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_routing_file_is_applied_per_route_and_a_broken_one_is_refused() {
    let camunda = FakeCamunda::start().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("inlet.toml");
    let wo = plugin_path("work_order");
    let route_a = |concurrency: u32| {
        format!(
            "[[route]]\nname = \"a\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"http\", url = \"{}\" }}\nconcurrency = {concurrency}\n",
            wo.display(),
            camunda.url()
        )
    };
    let route_b = format!(
        "[[route]]\nname = \"b\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"log\" }}\n",
        wo.display()
    );
    // The test calls the admin API without a token, from 127.0.0.1.
    let store = "[store]\nurl = \"sqlite://inbox.db\"\n\n[admin]\nauth = \"none-loopback\"\n\n";
    std::fs::write(&cfg, format!("{store}{}", route_a(4))).unwrap();
    let options = app::Options {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        poll: Duration::from_millis(20),
        reload_every: None,
        ..app::Options::default()
    };
    let running = app::start(&Config::load(&cfg).unwrap(), options).await.unwrap();
    let base = format!("http://{}", running.addr);
    let http = reqwest::Client::new();
    let push = |route: &str, seq: u32| {
        let data = format!(r#"{{"workOrderId":"k","completedItems":{seq},"completionTimestamp":"t"}}"#);
        http.post(format!("{base}/push/{route}"))
            .header("content-type", "application/json")
            .body(push_envelope(data.as_bytes(), &[], &format!("{route}-{seq}")).to_string())
            .send()
    };
    let reload = || async {
        let r = http.post(format!("{base}/api/reload")).send().await.unwrap();
        serde_json::from_str::<serde_json::Value>(&r.text().await.unwrap()).unwrap()
    };

    assert_eq!(push("a", 1).await.unwrap().status().as_u16(), 200);
    assert_eq!(push("b", 1).await.unwrap().status().as_u16(), 404, "no route b yet");
    assert_eq!(reload().await["routing_file"]["result"], "unchanged");

    std::fs::write(&cfg, format!("{store}{}{route_b}", route_a(2))).unwrap();
    let report = reload().await;
    assert_eq!(report["routing_file"]["result"], "applied", "{report}");
    assert_eq!(report["routing_file"]["added"], serde_json::json!(["b"]));
    assert_eq!(report["routing_file"]["changed"], serde_json::json!(["a"]));
    assert_eq!(push("b", 2).await.unwrap().status().as_u16(), 200, "the new route serves");
    assert_eq!(push("a", 2).await.unwrap().status().as_u16(), 200);
    wait_until("route a delivered both", WAIT, || async { camunda.correlated_seqs("k") == vec![1, 2] }).await;

    std::fs::write(&cfg, format!("{store}{}{route_b}retyr = 3\n", route_a(2))).unwrap();
    let report = reload().await;
    assert_eq!(report["routing_file"]["result"], "refused", "{report}");
    assert!(report["routing_file"]["error"].as_str().unwrap().contains("unknown field `retyr`"), "{report}");
    assert_eq!(reload().await["routing_file"]["error"], "same refused version as before", "reported once");
    assert_eq!(push("b", 3).await.unwrap().status().as_u16(), 200, "the running configuration stays");

    std::fs::write(&cfg, format!("[store]\nurl = \"sqlite://other.db\"\n\n{}", route_a(2))).unwrap();
    let report = reload().await;
    assert!(report["routing_file"]["error"].as_str().unwrap().contains("needs a restart"), "{report}");

    std::fs::write(&cfg, format!("{store}{}", route_a(2))).unwrap();
    let report = reload().await;
    assert_eq!(report["routing_file"]["removed"], serde_json::json!(["b"]), "{report}");
    assert_eq!(report["routing_file"]["changed"], serde_json::json!([]), "route a unchanged: {report}");
    assert_eq!(push("b", 4).await.unwrap().status().as_u16(), 404, "route b is gone");

    let entries = store_entries(&running, "b").await;
    assert_eq!(entries.len(), 2, "what route b stored stays in the inbox");
    running.stop().await;
}

async fn store_entries(running: &app::Running, route: &str) -> Vec<inlet::inbox::Entry> {
    running
        .shared
        .store
        .list(&ListFilter { route: Some(route.into()), limit: 100, ..Default::default() })
        .await
        .unwrap()
}
