//! Golden output of `inlet plugin test` for the example plugins: what a plugin author
//! sees for each step. `INLET_BLESS=1` rewrites the expected files.

mod common;

use std::path::Path;
use std::process::Command;

/// (case, plugin, message file, attributes, response files separated by commas)
type Case = (&'static str, &'static str, &'static str, &'static [&'static str], Option<&'static str>);

const CASES: &[Case] = &[
    ("work-order-done", "work_order", "work-order.json", &["eventId=evt-9"], Some("camunda-204.json")),
    ("work-order-not-yet", "work_order", "work-order.json", &[], Some("camunda-no-match.json")),
    ("work-order-several", "work_order", "work-order.json", &[], Some("camunda-several.json")),
    ("work-order-503", "work_order", "work-order.json", &[], Some("camunda-503.json")),
    ("work-order-refused", "work_order", "work-order.json", &[], Some("refused.json")),
    ("work-order-no-response", "work_order", "work-order.json", &[], None),
    ("work-order-garbage", "work_order", "garbage.txt", &[], None),
    ("hostile-panic", "hostile", "panic.txt", &[], None),
    ("flowable-one", "flowable", "work-order.json", &[], Some("flowable-query-one.json,flowable-trigger-200.json")),
    ("flowable-two", "flowable", "work-order.json", &[], Some("flowable-query-two.json")),
    ("camunda8-published", "camunda8", "work-order.json", &["eventId=evt-9"], Some("camunda8-200.json")),
    ("camunda8-duplicate", "camunda8", "work-order.json", &["eventId=evt-9"], Some("camunda8-409.json")),
    ("camunda8-invalid", "camunda8", "work-order.json", &[], Some("camunda8-400.json")),
    ("camunda8-overloaded", "camunda8", "work-order.json", &[], Some("camunda8-503.json")),
    ("template-done", "template", "template-event.json", &[], Some("camunda8-200.json")),
    ("template-refused", "template", "template-event.json", &[], Some("http-422.json")),
    ("forwarder-published", "forwarder", "legacy-work-order.json", &[], Some("pubsub-published.json")),
    ("forwarder-no-topic", "forwarder", "legacy-work-order.json", &[], Some("pubsub-no-topic.json")),
    ("flowable-zero", "flowable", "work-order.json", &[], Some("flowable-query-zero.json")),
];

#[test]
fn plugin_test_output_matches_the_golden_files() {
    let dir = Path::new("tests/plugin_cli");
    let bless = std::env::var("INLET_BLESS").is_ok_and(|v| v == "1");
    let mut failures = Vec::new();
    for (case, plugin, message, attributes, response) in CASES {
        let plugin = common::plugin_path(plugin);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_inlet"));
        cmd.args(["plugin", "test"]).arg(&plugin).arg("--message").arg(dir.join(message));
        for a in *attributes {
            cmd.args(["--attribute", a]);
        }
        for r in response.iter().flat_map(|r| r.split(',')) {
            cmd.arg("--response").arg(dir.join(r));
        }
        let out = cmd.env("NO_COLOR", "1").output().expect("run inlet plugin test");
        assert!(out.status.success(), "{case}: {}", String::from_utf8_lossy(&out.stderr));
        let actual = String::from_utf8(out.stdout).unwrap();
        let expected_path = dir.join(format!("{case}.out"));
        if bless {
            std::fs::write(&expected_path, &actual).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if expected != actual {
            failures.push(format!("{case}:\n--- expected\n{expected}--- actual\n{actual}"));
        }
    }
    assert!(failures.is_empty(), "golden mismatches (INLET_BLESS=1 to accept):\n{}", failures.join("\n"));
}
