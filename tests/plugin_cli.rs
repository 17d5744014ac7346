//! Golden output of `inlet plugin test` for the example plugins: what a plugin author
//! sees for each step. `INLET_BLESS=1` rewrites the expected files.

use inlet_testkit::paths::plugin_path;
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

/// The cases whose plugin fails: the command exits 1.
const FAILING: &[&str] = &["work-order-garbage", "hostile-panic"];

#[test]
fn plugin_test_output_matches_the_golden_files() {
    let dir = Path::new("tests/plugin_cli");
    let bless = std::env::var("INLET_BLESS").is_ok_and(|v| v == "1");
    let mut failures = Vec::new();
    for (case, plugin, message, attributes, response) in CASES {
        let plugin = plugin_path(plugin);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_inlet"));
        cmd.args(["plugin", "test"]).arg(&plugin).arg("--message").arg(dir.join(message));
        for a in *attributes {
            cmd.args(["--attribute", a]);
        }
        for r in response.iter().flat_map(|r| r.split(',')) {
            cmd.arg("--response").arg(dir.join(r));
        }
        let out = cmd.env("NO_COLOR", "1").output().expect("run inlet plugin test");
        // A plugin that fails (decode error or fault) makes the command fail, so a
        // plugin's CI can run it.
        let should_fail = FAILING.contains(case);
        assert_eq!(
            out.status.code(),
            Some(if should_fail { 1 } else { 0 }),
            "{case}: exit status; stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
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

fn plugin_test(args: &[&str]) -> std::process::Output {
    let dir = Path::new("tests/plugin_cli");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_inlet"));
    cmd.args(["plugin", "test"]);
    for a in args {
        // Bare names of files under tests/plugin_cli are resolved there.
        if a.ends_with(".json") || a.ends_with(".txt") {
            cmd.arg(dir.join(a))
        } else {
            cmd.arg(a)
        };
    }
    cmd.env("NO_COLOR", "1").output().expect("run inlet plugin test")
}

fn json_of(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn json_reports_each_step_and_the_exit_status_follows_the_plugin() {
    let plugin = plugin_path("work_order");
    let plugin = plugin.to_str().unwrap();

    let done = plugin_test(&["--json", plugin, "--message", "work-order.json", "--response", "camunda-204.json"]);
    assert_eq!(done.status.code(), Some(0), "{}", String::from_utf8_lossy(&done.stderr));
    let report = json_of(&done);
    assert_eq!(report["decode"]["outcome"], "event");
    assert_eq!(report["decode"]["correlation_key"], "4711");
    assert_eq!(report["decode"]["body"]["json"]["workOrderId"], "4711");
    assert_eq!(report["steps"][0]["method"], "POST");
    assert_eq!(report["steps"][0]["path"], "/engine-rest/message");
    assert_eq!(report["steps"][0]["idempotency_key"], "test-message-1");
    assert_eq!(report["steps"][0]["answer"]["verdict"]["disposition"], "done");
    assert_eq!(report["failed"], false);

    let garbage = plugin_test(&[plugin, "--message", "garbage.txt", "--json"]);
    assert_eq!(garbage.status.code(), Some(1));
    let report = json_of(&garbage);
    assert_eq!(report["decode"]["outcome"], "error");
    assert!(report["decode"]["reason"].as_str().unwrap().contains("not a work-order-completed event"), "{report}");
    assert_eq!(report["conclusion"], "the message would be stored PARKED");
    assert_eq!(report["failed"], true);
    assert!(report.get("steps").is_none(), "no request after a failed decode: {report}");

    let hostile = plugin_path("hostile");
    let panic = plugin_test(&[hostile.to_str().unwrap(), "--message", "panic.txt", "--json"]);
    assert_eq!(panic.status.code(), Some(1));
    assert_eq!(json_of(&panic)["decode"]["kind"], "trap");
}

/// A routing file whose route `tight` allows correlation keys of 3 bytes: the work
/// order's key `4711` breaks it.
fn tight_routes(dir: &Path) -> std::path::PathBuf {
    let plugin = plugin_path("work_order");
    let file = dir.join("routes.toml");
    std::fs::write(
        &file,
        format!(
            r#"
[store]
url = "sqlite://inbox.db"

[[route]]
name = "tight"
plugin = "{plugin}"
source = {{ kind = "push" }}
target = {{ kind = "log" }}
limits = {{ max_key_bytes = 3 }}

[[route]]
name = "roomy"
plugin = "{plugin}"
source = {{ kind = "push" }}
target = {{ kind = "log" }}
"#,
            plugin = plugin.display()
        ),
    )
    .unwrap();
    file
}

#[test]
fn route_takes_the_plugin_limits_and_output_rules_of_a_routing_file() {
    let dir = tempfile::tempdir().unwrap();
    let routes = tight_routes(dir.path());
    let routes = routes.to_str().unwrap();

    let roomy = plugin_test(&["--config", routes, "--route", "roomy", "--message", "work-order.json"]);
    assert_eq!(roomy.status.code(), Some(0), "{}", String::from_utf8_lossy(&roomy.stderr));
    assert!(String::from_utf8_lossy(&roomy.stdout).contains("correlation-key: 4711"));

    let tight = plugin_test(&["--route", "tight", "--message", "work-order.json", "-c", routes, "--json"]);
    assert_eq!(tight.status.code(), Some(1), "{}", String::from_utf8_lossy(&tight.stderr));
    let report = json_of(&tight);
    assert_eq!(report["decode"]["outcome"], "refused", "{report}");
    assert_eq!(report["decode"]["rule"], "correlation-key.max-bytes");

    let unknown = plugin_test(&["--route", "nope", "--message", "work-order.json", "-c", routes]);
    assert_eq!(unknown.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(stderr.contains("no route `nope`") && stderr.contains("tight, roomy"), "{stderr}");
    assert_eq!(stderr.matches("error:").count(), 1, "error printed once: {stderr}");

    let neither = plugin_test(&["--message", "work-order.json"]);
    assert_eq!(neither.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&neither.stderr).contains("name the plugin file, or a route with --route NAME"));
}
