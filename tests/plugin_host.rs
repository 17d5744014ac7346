//! The plugin host on its own: the compiled-component cache and calls under limits.

use inlet::config::PluginLimits;
use inlet::plugin::{Plugin, wit};
use inlet_testkit::paths::plugin_path;

fn message(data: &[u8]) -> wit::Message {
    wit::Message {
        data: data.to_vec(),
        attributes: vec![],
        message_id: "m".into(),
        publish_time: None,
        delivery_attempt: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compiled_components_are_cached_and_a_broken_cache_file_is_replaced() {
    let cache = tempfile::tempdir().unwrap();
    let path = plugin_path("work_order");
    let files = || std::fs::read_dir(cache.path()).unwrap().map(|e| e.unwrap().path()).collect::<Vec<_>>();

    Plugin::load(&path, PluginLimits::default(), Some(cache.path())).expect("first load compiles");
    let cached = files();
    assert_eq!(cached.len(), 1, "one compiled component: {cached:?}");
    assert!(cached[0].extension().is_some_and(|e| e == "cwasm"));
    let size = std::fs::metadata(&cached[0]).unwrap().len();

    let plugin = Plugin::load(&path, PluginLimits::default(), Some(cache.path())).expect("second load uses the cache");
    let decoded = plugin.decode(message(br#"{"workOrderId":"1","completedItems":1,"completionTimestamp":"t"}"#)).await;
    assert!(matches!(decoded, Ok(Ok(wit::Decoded::Event(_)))), "{decoded:?}");

    std::fs::write(&cached[0], b"not a compiled component").unwrap();
    Plugin::load(&path, PluginLimits::default(), Some(cache.path())).expect("a broken cache file is not fatal");
    assert_eq!(std::fs::metadata(&cached[0]).unwrap().len(), size, "rewritten with the real compilation");

    // Another plugin gets its own entry.
    Plugin::load(&plugin_path("hostile"), PluginLimits::default(), Some(cache.path())).unwrap();
    assert_eq!(files().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_trapped_is_replaced_and_the_plugin_keeps_serving() {
    let plugin = Plugin::load(&plugin_path("hostile"), PluginLimits::default(), None).unwrap();
    for _ in 0..3 {
        let fault = plugin.decode(message(b"panic")).await.expect_err("panics");
        assert_eq!(fault.kind(), "trap");
        let ok = plugin.decode(message(b"k:1")).await.expect("serves after a trap");
        assert!(matches!(ok, Ok(wit::Decoded::Event(ref e)) if e.correlation_key == "k"), "{ok:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuel_stops_a_loop_by_instruction_count_whatever_the_clock() {
    let limits =
        PluginLimits { call_timeout: std::time::Duration::from_secs(30), fuel: 5_000_000, ..PluginLimits::default() };
    let plugin = Plugin::load(&plugin_path("hostile"), limits, None).unwrap();
    let fault = plugin.decode(message(b"loop")).await.expect_err("the loop runs out of fuel");
    assert_eq!(fault.kind(), "fuel");
    assert_eq!(fault.to_string(), "plugin used up its budget of 5000000 instructions (fuel)");
    let ok = plugin.decode(message(b"k:1")).await.expect("an ordinary call fits in the fuel");
    assert!(matches!(ok, Ok(wit::Decoded::Event(_))), "{ok:?}");
}

#[test]
fn a_plugin_that_cannot_start_within_its_memory_limit_is_refused_at_load() {
    let limits = PluginLimits { memory_bytes: 64 << 10, ..PluginLimits::default() };
    let err = Plugin::load(&plugin_path("work_order"), limits, None).expect_err("64 KiB is too little to start");
    let text = err.to_string();
    assert!(text.contains("cannot start within its limits") && text.contains("memory limit of 65536 bytes"), "{text}");
}
