//! No tenant can stall the service: plugins that sleep, hog memory, burn CPU or chat
//! on stderr are bounded by the host, and a well-behaved route beside them keeps
//! delivering. Figures (latencies, RSS) are printed with `--nocapture`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use inlet::config::PluginLimits;
use inlet::inbox::{ListFilter, Status, Store};
use inlet::plugin::{Plugin, PluginFault, wit};
use inlet_testkit::camunda::FakeCamunda;
use inlet_testkit::in_process::start_on_sqlite;
use inlet_testkit::paths::plugin_path;
use inlet_testkit::push::push_envelope;
use inlet_testkit::wait::{wait_for, wait_until};

/// POSTs one push envelope; the status and how long the answer took.
async fn push(http: &reqwest::Client, base: &str, route: &str, data: &[u8], id: &str) -> (u16, Duration) {
    let started = Instant::now();
    let res = http
        .post(format!("{base}/push/{route}"))
        .header("content-type", "application/json")
        .body(push_envelope(data, &[], id).to_string())
        .send()
        .await
        .expect("push request");
    (res.status().as_u16(), started.elapsed())
}

fn message(data: &[u8], id: &str) -> wit::Message {
    wit::Message {
        data: data.to_vec(),
        attributes: vec![],
        message_id: id.into(),
        publish_time: None,
        delivery_attempt: Some(1),
    }
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

async fn entries_of(store: &Arc<dyn Store>, route: &str) -> Vec<inlet::inbox::Entry> {
    let filter = ListFilter { route: Some(route.into()), limit: 1000, ..Default::default() };
    store.list(&filter).await.expect("list entries")
}

/// A good route (work order → fake Camunda) pushes 200 messages over 10 keys while
/// `hostile` is pushed 50 messages whose decode sleeps for an hour, and `slow-relay`
/// holds entries whose render or classify sleeps. Every sleeping call is abandoned at
/// the 1 s backstop; the good route's pushes stay fast and all its messages arrive in
/// key order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleeping_plugins_are_abandoned_at_the_backstop_while_a_good_route_delivers() {
    let camunda = Arc::new(FakeCamunda::start().await);
    let routes = format!(
        "[[route]]\nname = \"good\"\nplugin = \"{wo}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"http\", url = \"{url}\" }}\n\n\
         [[route]]\nname = \"hostile\"\nplugin = \"{h}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"log\" }}\n\
         limits = {{ call_timeout = \"1s\", timeout_tries = 2 }}\n\n\
         [[route]]\nname = \"slow-relay\"\nplugin = \"{h}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"log\" }}\n\
         limits = {{ call_timeout = \"1s\" }}\nretry = {{ initial = \"100ms\", max = \"200ms\", max_attempts = 2 }}\n",
        wo = plugin_path("work_order").display(),
        h = plugin_path("hostile").display(),
        url = camunda.url(),
    );
    let inlet = start_on_sqlite(&routes, |_| {}).await;
    let base = inlet.base();
    let http = reqwest::Client::new();
    let store = Arc::clone(&inlet.running.shared.store);

    // One sleeping decode, pushed the way Pub/Sub redelivers it: 503 (the backstop
    // may be the host's fault) until its tries are used up, then parked.
    let (first, took) = push(&http, &base, "hostile", b"sleep", "sleep-once").await;
    assert_eq!(first, 503, "a decode abandoned at the backstop is a temporary failure first");
    assert!(took < Duration::from_secs(3), "answered within the backstop plus a margin, took {took:?}");
    let (second, took) = push(&http, &base, "hostile", b"sleep", "sleep-once").await;
    assert_eq!(second, 200, "after timeout_tries the message is stored parked");
    assert!(took < Duration::from_secs(3), "took {took:?}");
    let parked = entries_of(&store, "hostile").await;
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].status, Status::Parked);
    let reason = parked[0].last_error.clone().unwrap_or_default();
    assert!(reason.contains("backstop of 1s") && reason.contains("2 times"), "reason: {reason}");

    // Entries whose render / classify sleep: stored at once, then each attempt is
    // abandoned at the backstop and counted; parked at max_attempts.
    for (n, data) in [b"render:sleep".as_slice(), b"classify:sleep"].into_iter().enumerate() {
        let (status, _) = push(&http, &base, "slow-relay", data, &format!("relay-{n}")).await;
        assert_eq!(status, 200);
    }

    // The barrage and the good route at the same time.
    let good = {
        let (http, base) = (http.clone(), base.clone());
        tokio::spawn(async move {
            let mut sent = Vec::new();
            for n in 0..200u32 {
                let key = format!("k{}", n % 10);
                let data = format!(r#"{{"workOrderId":"{key}","completedItems":{n},"completionTimestamp":"t"}}"#);
                let (status, took) = push(&http, &base, "good", data.as_bytes(), &format!("g-{n}")).await;
                assert_eq!(status, 200);
                sent.push(took);
                // Paces the good route's load: a steady stream beside the hostile one.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            sent
        })
    };
    let barrage_started = Instant::now();
    let mut barrage = tokio::task::JoinSet::new();
    for n in 0..50 {
        let (http, base) = (http.clone(), base.clone());
        barrage.spawn(async move { push(&http, &base, "hostile", b"sleep", &format!("sleep-{n}")).await });
        if n % 10 == 9 {
            // Ten in flight at a time: 50 in a row, five seconds of sleeping plugins.
            while !barrage.is_empty() {
                let (status, took) = barrage.join_next().await.unwrap().unwrap();
                assert_eq!(status, 503);
                assert!(took < Duration::from_secs(3), "a sleeping decode held its push for {took:?}");
            }
        }
    }
    let barrage_took = barrage_started.elapsed();
    let mut good_latencies = good.await.unwrap();
    good_latencies.sort();
    wait_until("all 200 good messages delivered", Duration::from_secs(60), || async { camunda.count() >= 200 }).await;
    assert_eq!(camunda.count(), 200, "each good message delivered once");
    for k in 0..10 {
        let seqs = camunda.correlated_seqs(&format!("k{k}"));
        assert_eq!(seqs.len(), 20);
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "order of k{k}: {seqs:?}");
    }
    let p99 = percentile(&good_latencies, 99);
    eprintln!(
        "good route beside 50 sleeping decodes ({barrage_took:?}): push p50 {:?}, p99 {p99:?}, max {:?}",
        percentile(&good_latencies, 50),
        good_latencies.last().unwrap()
    );
    assert!(p99 < Duration::from_secs(1), "good route push p99 {p99:?}");

    let relay = wait_for("both sleeping relay entries parked", Duration::from_secs(60), || {
        let store = Arc::clone(&store);
        async move {
            let entries = entries_of(&store, "slow-relay").await;
            entries.iter().all(|e| e.status == Status::Parked).then_some(entries)
        }
    })
    .await;
    for e in &relay {
        let error = e.last_error.clone().unwrap_or_default();
        assert!(error.contains("backstop of 1s"), "{error}");
        assert_eq!(e.attempts, 2, "each abandoned attempt counted: {e:?}");
    }
    inlet.running.stop().await;
}

fn rss_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let kib: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kib << 10
}

/// A plugin that keeps 48 MiB per instance, called 200 times with 16 at once: the
/// instances that grew past `keep_warm_mib` are dropped after their call, so the
/// process stays within the route's documented worst case and gives the memory back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_kept_between_calls_is_bounded_by_the_documented_worst_case() {
    let limits = PluginLimits { call_timeout: Duration::from_secs(30), ..PluginLimits::default() };
    let bound = limits.worst_case_bytes(16);
    let plugin = Plugin::load(&plugin_path("hostile"), limits, None).expect("hostile loads");
    let baseline = rss_bytes();
    let peak = Arc::new(std::sync::atomic::AtomicUsize::new(baseline));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (Arc::clone(&peak), Arc::clone(&sampling));
        std::thread::spawn(move || {
            while sampling.load(Ordering::Relaxed) {
                peak.fetch_max(rss_bytes(), Ordering::Relaxed);
                // The sampler's period: RSS is read, not awaited.
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let gate = Arc::new(tokio::sync::Semaphore::new(16));
    let mut calls = tokio::task::JoinSet::new();
    for n in 0..200 {
        let (plugin, gate) = (Arc::clone(&plugin), Arc::clone(&gate));
        calls.spawn(async move {
            let _slot = gate.acquire().await.unwrap();
            plugin.decode(message(b"keep:48", &format!("m-{n}"))).await
        });
    }
    while let Some(answer) = calls.join_next().await {
        assert!(matches!(answer.unwrap(), Ok(Ok(wit::Decoded::Event(_)))), "every call succeeds");
    }
    sampling.store(false, Ordering::Relaxed);
    sampler.join().unwrap();
    let grew = peak.load(Ordering::Relaxed).saturating_sub(baseline);
    eprintln!(
        "keep:48 ×200, 16 at once: RSS baseline {} MiB, peak +{} MiB, documented bound for the route +{} MiB; \
         warm pool afterwards {} MiB",
        baseline >> 20,
        grew >> 20,
        bound >> 20,
        plugin.warm_bytes() >> 20
    );
    assert!(grew < bound, "RSS grew by {grew} bytes, bound {bound}");
    assert_eq!(plugin.warm_bytes(), 0, "instances past keep_warm_mib are not pooled");
}

/// A decode that uses half the default instruction budget is never parked, however
/// busy the machine is: the budget is counted in instructions, and the wall-clock
/// backstop is far above what such a call needs even with every core taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_the_fuel_budget_under_cpu_contention_parks_nothing() {
    let path = plugin_path("hostile");
    let budget = PluginLimits::default().fuel;
    let rounds = rounds_using(&path, budget / 2).await;
    eprintln!("spin:{rounds} uses about half of the default budget of {budget} instructions");

    let routes = format!(
        "[[route]]\nname = \"spin\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"log\" }}\n",
        path.display()
    );
    let inlet = start_on_sqlite(&routes, |_| {}).await;
    let base = inlet.base();
    let http = reqwest::Client::new();

    // Busy threads on every core (twice over), for the whole run.
    let busy = Arc::new(AtomicBool::new(true));
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let burners: Vec<_> = (0..cores * 2)
        .map(|_| {
            let busy = Arc::clone(&busy);
            std::thread::spawn(move || {
                let mut x = 0u64;
                while busy.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    let mut pushes = tokio::task::JoinSet::new();
    for n in 0..40 {
        let (http, base) = (http.clone(), base.clone());
        let data = format!("spin:{rounds}");
        pushes.spawn(async move { push(&http, &base, "spin", data.as_bytes(), &format!("s-{n}")).await });
        if pushes.len() == 4 {
            let (status, took) = pushes.join_next().await.unwrap().unwrap();
            assert_eq!(status, 200);
            slowest = slowest.max(took);
        }
    }
    while let Some(done) = pushes.join_next().await {
        let (status, took) = done.unwrap();
        assert_eq!(status, 200);
        slowest = slowest.max(took);
    }
    busy.store(false, Ordering::Relaxed);
    for b in burners {
        b.join().unwrap();
    }
    let entries = entries_of(&inlet.running.shared.store, "spin").await;
    assert_eq!(entries.len(), 40);
    let parked: Vec<_> = entries.iter().filter(|e| e.status == Status::Parked).collect();
    assert!(
        parked.is_empty(),
        "parked under contention: {:?}",
        parked.iter().map(|e| &e.last_error).collect::<Vec<_>>()
    );
    eprintln!("40 decodes at half the fuel budget beside {} busy threads: slowest push {slowest:?}", cores * 2);
    inlet.running.stop().await;
}

/// How many `spin` rounds use about `fuel` instructions, found from the fuel the
/// plugin needs for a known number of rounds (the smallest budget that lets it finish).
async fn rounds_using(path: &Path, fuel: u64) -> u64 {
    async fn needed(path: &Path, rounds: u64) -> u64 {
        let (mut low, mut high) = (1u64, 1u64 << 34);
        while low < high {
            let mid = low + (high - low) / 2;
            let limits = PluginLimits { fuel: mid, call_timeout: Duration::from_secs(30), ..PluginLimits::default() };
            // The first instantiation runs at load, under the same budget.
            let finished = match Plugin::load(path, limits, inlet::plugin::default_cache_dir().as_deref()) {
                Ok(p) => match p.decode(message(format!("spin:{rounds}").as_bytes(), "calibrate")).await {
                    Ok(_) => true,
                    Err(PluginFault::FuelExhausted(_)) => false,
                    Err(other) => panic!("calibration call failed: {other}"),
                },
                Err(_) => false,
            };
            if finished { high = mid } else { low = mid + 1 }
        }
        low
    }
    let base = needed(path, 0).await;
    let per_million = needed(path, 1_000_000).await - base;
    assert!(per_million > 0, "spin rounds cost fuel");
    (fuel - base) * 1_000_000 / per_million
}

/// A plugin that writes 1 KiB to stderr at every call keeps working (its stderr is
/// bounded per call and cleared between calls), and a panic's entry shows only its
/// own stderr, not what earlier calls wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stderr_is_bounded_per_call_and_shows_only_its_own_call() {
    let plugin = Plugin::load(&plugin_path("hostile"), PluginLimits::default(), None).expect("loads");
    for n in 0..10_000 {
        let answer = plugin.decode(message(b"chatty", &format!("c-{n}"))).await;
        assert!(matches!(answer, Ok(Ok(wit::Decoded::Event(_)))), "call {n}: {answer:?}");
    }

    let routes = format!(
        "[[route]]\nname = \"chatty\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"log\" }}\n",
        plugin_path("hostile").display()
    );
    let inlet = start_on_sqlite(&routes, |_| {}).await;
    let (base, http) = (inlet.base(), reqwest::Client::new());
    for (n, data) in ["chatty", "chatty", "chatty-panic:first", "chatty", "chatty-panic:second"].iter().enumerate() {
        assert_eq!(push(&http, &base, "chatty", data.as_bytes(), &format!("p-{n}")).await.0, 200);
    }
    let entries = entries_of(&inlet.running.shared.store, "chatty").await;
    for (id, own, other) in [("p-2", "first", "second"), ("p-4", "second", "first")] {
        let e = entries.iter().find(|e| e.message_id == id).expect("entry");
        let error = e.last_error.clone().unwrap_or_default();
        assert_eq!(e.status, Status::Parked);
        assert!(error.contains(&format!("chatty-panic {own} says goodbye")), "{error}");
        assert!(!error.contains(other) && !error.contains("cccc"), "another call's stderr leaked: {error}");
    }
    inlet.running.stop().await;
}

/// Plugins read a frozen clock and a random stream that restarts at every call, so
/// decoding the same message twice gives the same answer. (Rust's `HashMap` seeds are
/// drawn once per instance and then stepped, so they repeat per fresh instance.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_see_no_real_time_or_entropy() {
    let load = || Plugin::load(&plugin_path("hostile"), PluginLimits::default(), None).expect("loads");
    let body = |answer| match answer {
        Ok(Ok(wit::Decoded::Event(ev))) => String::from_utf8(ev.body).unwrap(),
        other => panic!("decode failed: {other:?}"),
    };
    let (one, two) = (load(), load());
    let first = body(one.decode(message(b"entropy", "e-1")).await);
    assert!(first.starts_with("wall=0 elapsed=0ns "), "{first}");
    let elsewhere = body(two.decode(message(b"entropy", "e-1")).await);
    assert_eq!(first, elsewhere, "two instances saw different time or randomness");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let later = body(one.decode(message(b"entropy", "e-1")).await);
    assert!(later.starts_with("wall=0 elapsed=0ns "), "{later}");
}

/// A delivery attempt that panics (a bug in the host, injected here) is logged,
/// counted as a failed attempt and in `inlet_attempt_panics_total`, retried with
/// backoff and parked at `max_attempts` — not left to its lease forever — while the
/// relay goes on delivering other keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_attempt_is_counted_and_parked_at_max_attempts() {
    let routes = format!(
        "[[route]]\nname = \"r\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"log\" }}\n\
         retry = {{ initial = \"50ms\", max = \"100ms\", max_attempts = 3 }}\n",
        plugin_path("hostile").display()
    );
    let inlet = start_on_sqlite(&routes, |o| o.panic_on_key = Some("boom".into())).await;
    let (base, http) = (inlet.base(), reqwest::Client::new());
    assert_eq!(push(&http, &base, "r", b"boom:1", "b-1").await.0, 200);
    assert_eq!(push(&http, &base, "r", b"fine:1", "f-1").await.0, 200);
    let store = Arc::clone(&inlet.running.shared.store);
    let entries = wait_for("the panicking entry parked and the other done", Duration::from_secs(60), || {
        let store = Arc::clone(&store);
        async move {
            let entries = entries_of(&store, "r").await;
            let settled = entries.iter().all(|e| matches!(e.status, Status::Parked | Status::Done));
            settled.then_some(entries)
        }
    })
    .await;
    let boom = entries.iter().find(|e| e.message_id == "b-1").unwrap();
    assert_eq!(boom.status, Status::Parked);
    assert_eq!(boom.attempts, 3, "every panicked attempt counted");
    let error = boom.last_error.clone().unwrap_or_default();
    assert!(error.contains("panicked") && error.contains("fault injection"), "{error}");
    assert_eq!(entries.iter().find(|e| e.message_id == "f-1").unwrap().status, Status::Done);
    let metrics = http.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("inlet_attempt_panics_total{route=\"r\"} 3"), "{metrics}");
    inlet.running.stop().await;
}
