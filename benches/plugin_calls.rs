//! Per-call cost of the work-order plugin (decode + render + classify) on a warm
//! instance and on a fresh store per call, beside the same logic compiled natively,
//! plus compile and cache-hit load times and the cost of the bounds (fuel and
//! epoch yields). Prints
//! figures; asserts nothing.
//!
//!     cargo bench --bench plugin_calls [-- --iterations N]

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use inlet::config::PluginLimits;
use inlet::plugin::{Metering, Plugin, wit};
use serde_json::json;

const PAYLOAD: &[u8] = br#"{"workOrderId":"4711","completedItems":3,"completionTimestamp":"2026-08-01T10:00:00Z"}"#;

fn message() -> wit::Message {
    wit::Message {
        data: PAYLOAD.to_vec(),
        attributes: vec![("eventId".into(), "evt-1".into())],
        message_id: "m-1".into(),
        publish_time: None,
        delivery_attempt: Some(1),
    }
}

fn answer() -> wit::Outcome {
    wit::Outcome::Response(wit::Response { status: 204, headers: vec![], body: vec![] })
}

/// The plugin's logic, natively: the shared event crate plus the same rendering.
fn native_cycle() -> usize {
    let attrs = vec![("eventId".to_string(), "evt-1".to_string())];
    let parsed = work_order_event::parse(PAYLOAD, &attrs).unwrap();
    let order = work_order_event::from_body(&parsed.body).unwrap();
    let body = json!({
        "messageName": "WorkOrderCompleted",
        "correlationKeys": { "workOrderId": { "value": order.work_order_id, "type": "String" } },
        "processVariables": {
            "completedItems": { "value": order.completed_items, "type": "Integer" },
            "completionTimestamp": { "value": order.completion_timestamp, "type": "String" }
        },
        "resultEnabled": false
    });
    let request = serde_json::to_vec(&body).unwrap();
    let done = matches!(black_box(204u16), 200..=299);
    request.len() + usize::from(done) + parsed.correlation_key.len()
}

async fn plugin_cycle(p: &Plugin) -> usize {
    let Ok(Ok(wit::Decoded::Event(ev))) = p.decode(message()).await else { panic!("decode") };
    let Ok(Ok(req)) = p.render(ev.clone()).await else { panic!("render") };
    let d = p.classify(ev, wit::Exchange { step: 1, state: vec![] }, answer()).await.unwrap();
    req.body.len() + usize::from(matches!(d, wit::Disposition::Done))
}

fn per_call(n: usize, mut f: impl FnMut() -> usize) -> Duration {
    for _ in 0..n / 10 {
        black_box(f());
    }
    let start = Instant::now();
    for _ in 0..n {
        black_box(f());
    }
    start.elapsed() / n as u32
}

fn main() {
    let mut iterations = 20_000usize;
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--iterations") {
        iterations = args[i + 1].parse().expect("--iterations N");
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("plugins/dist/work_order.wasm");
    assert!(path.is_file(), "build the plugins first: scripts/build-plugins");

    let compile = {
        let start = Instant::now();
        for _ in 0..3 {
            black_box(Plugin::load(&path, PluginLimits::default(), None).unwrap());
        }
        start.elapsed() / 3
    };
    let cache = tempfile::tempdir().unwrap();
    Plugin::load(&path, PluginLimits::default(), Some(cache.path())).unwrap();
    let cached = {
        let start = Instant::now();
        for _ in 0..20 {
            black_box(Plugin::load(&path, PluginLimits::default(), Some(cache.path())).unwrap());
        }
        start.elapsed() / 20
    };

    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let plugin_cycle = |p: &Plugin| rt.block_on(plugin_cycle(p));
    let native = per_call(iterations, native_cycle);
    let warm_plugin = Plugin::load(&path, PluginLimits::default(), Some(cache.path())).unwrap();
    let warm = per_call(iterations, || plugin_cycle(&warm_plugin));
    let fresh_plugin = Plugin::load(&path, PluginLimits::default(), Some(cache.path())).unwrap();
    fresh_plugin.set_warm_instances(0);
    let fresh = per_call(iterations / 10, || plugin_cycle(&fresh_plugin));
    let bytes = std::fs::read(&path).unwrap();
    let unbounded_plugin =
        Plugin::with_metering(&path, &bytes, PluginLimits::default(), Some(cache.path()), Metering::Unbounded).unwrap();
    let unbounded = per_call(iterations, || plugin_cycle(&unbounded_plugin));

    let ratio = |d: Duration| d.as_secs_f64() / native.as_secs_f64();
    println!(
        "work-order plugin: decode + render + classify, {iterations} iterations, {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("{:<46} {:>12} {:>10}", "what", "per cycle", "vs native");
    println!("{:<46} {:>12.2?} {:>9.1}x", "native Rust (same logic, same crates)", native, 1.0);
    println!("{:<46} {:>12.2?} {:>9.1}x", "plugin, warm, no fuel, no yields (unsafe)", unbounded, ratio(unbounded));
    println!("{:<46} {:>12.2?} {:>9.1}x", "plugin, warm instance (fuel + epoch yields)", warm, ratio(warm));
    println!("{:<46} {:>12.2?} {:>9.1}x", "plugin, fresh store + instance per call", fresh, ratio(fresh));
    println!("{:<46} {:>12.2?}", "load: compile the component (no cache)", compile);
    println!("{:<46} {:>12.2?}", "load: from the compiled-component cache", cached);
}
