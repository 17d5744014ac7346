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
use inlet::plugin::{Metering, Plugin};

mod support;

use support::calls::{native_cycle, per_call, plugin_cycle};

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
