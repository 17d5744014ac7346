//! Hostile plugins next to a well-behaved route: each misbehaviour is stopped within
//! its limit and parks its message with the fault kind, while the other route keeps
//! delivering. The good route's latency is printed (measured, not asserted).

use std::sync::Arc;
use std::time::{Duration, Instant};

use inlet::inbox::{ListFilter, Status};
use inlet_testkit::camunda::FakeCamunda;
use inlet_testkit::in_process::start_on_sqlite;
use inlet_testkit::paths::plugin_path;
use inlet_testkit::push::push_envelope;
use inlet_testkit::wait::wait_until;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_plugins_are_contained_while_a_good_route_keeps_delivering() {
    let camunda = Arc::new(FakeCamunda::start().await);
    let routes = format!(
        "[[route]]\nname = \"good\"\nplugin = \"{wo}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"http\", url = \"{url}\" }}\n\n\
         [[route]]\nname = \"hostile\"\nplugin = \"{h}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"log\" }}\nlimits = {{ call_timeout = \"10s\", memory_mib = 64, max_output_mib = 8 }}\n",
        wo = plugin_path("work_order").display(),
        h = plugin_path("hostile").display(),
        url = camunda.url(),
    );
    let inlet = start_on_sqlite(&routes, |_| {}).await;
    let running = &inlet.running;
    let base = format!("http://{}", running.addr);
    let http = reqwest::Client::new();
    let push = move |route: &'static str, data: Vec<u8>, id: String| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let res = http
                .post(format!("{base}/push/{route}"))
                .header("content-type", "application/json")
                .body(push_envelope(&data, &[], &id).to_string())
                .send()
                .await
                .unwrap();
            res.status().as_u16()
        }
    };

    // The good route: 200 messages over 10 keys, pushed while the hostile ones run.
    let good = {
        let push = push.clone();
        tokio::spawn(async move {
            let mut sent = Vec::new();
            for n in 0..200u32 {
                let key = format!("k{}", n % 10);
                let data = format!(r#"{{"workOrderId":"{key}","completedItems":{n},"completionTimestamp":"t"}}"#);
                assert_eq!(push("good", data.into_bytes(), format!("g-{n}")).await, 200);
                sent.push((n, Instant::now()));
            }
            sent
        })
    };
    let mut hostile = Vec::new();
    for (round, command) in ["loop", "alloc", "panic", "big", "big9", "alloc"].into_iter().enumerate() {
        let started = Instant::now();
        assert_eq!(push("hostile", command.as_bytes().to_vec(), format!("h-{round}")).await, 200, "{command}");
        hostile.push((command, started.elapsed()));
    }
    let sent = good.await.unwrap();
    wait_until("all 200 good messages delivered", Duration::from_secs(60), || async { camunda.count() >= 200 }).await;
    assert_eq!(camunda.count(), 200, "each good message delivered once");
    for k in 0..10 {
        let seqs = camunda.correlated_seqs(&format!("k{k}"));
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "order of k{k}: {seqs:?}");
    }

    let entries = running
        .shared
        .store
        .list(&ListFilter { route: Some("hostile".into()), limit: 100, ..Default::default() })
        .await
        .unwrap();
    let expect = [
        ("loop", "used up its budget of 200000000 instructions"),
        ("alloc", "memory limit of 67108864 bytes"),
        ("panic", "hostile plugin panics as asked"),
        // 100 MB cannot even be built inside a 64 MiB sandbox.
        ("big", "memory limit of 67108864 bytes"),
        ("big9", "returned 9437184 bytes, more than the 8388608 allowed"),
    ];
    for e in &entries {
        let command = String::from_utf8_lossy(&e.raw_data).into_owned();
        let (_, fault) = expect.iter().find(|(c, _)| *c == command).unwrap();
        assert_eq!(e.status, Status::Parked, "{command}");
        assert!(e.last_error.as_deref().unwrap().contains(fault), "{command}: {:?}", e.last_error);
    }
    assert_eq!(entries.len(), 6);

    // Latency of the good route: push answered → delivered, in order of sending.
    let deliveries = camunda.deliveries();
    let mut latencies: Vec<Duration> = sent
        .iter()
        .map(|(n, at)| {
            let d = deliveries.iter().find(|d| d.seq == i64::from(*n)).expect("delivered");
            d.at.saturating_duration_since(*at)
        })
        .collect();
    latencies.sort();
    let pct = |p: usize| latencies[(latencies.len() * p / 100).min(latencies.len() - 1)];
    eprintln!(
        "good route while hostile plugins ran: push→delivered p50 {:?}, p99 {:?}, max {:?}; hostile pushes answered in {:?}",
        pct(50),
        pct(99),
        latencies.last().unwrap(),
        hostile
    );
    inlet.running.stop().await;
}
