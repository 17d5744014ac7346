//! Log output of a real `inlet run`: with `--log-format json` every line is a JSON
//! object, and the lines of a delivery attempt carry its route and entry id (the
//! `attempt` span), those of ingest the route and message id (the `ingest` span);
//! in either format no colour codes reach a stderr that is not a terminal.

use std::time::Duration;

use inlet_testkit::camunda::FakeCamunda;
use inlet_testkit::paths::plugin_path;
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use inlet_testkit::push::push_envelope;
use inlet_testkit::wait::wait_until;

const DATA: &[u8] = br#"{"workOrderId":"4711","completedItems":3,"completionTimestamp":"2026-08-01T10:00:00Z"}"#;

/// A routing file with one push route delivering to `target`, in `dir`.
fn routing_file(dir: &std::path::Path, target: &str) -> std::path::PathBuf {
    let config = dir.join("inlet.toml");
    let text = format!(
        "[store]\nurl = \"sqlite://{}\"\n\n[[route]]\nname = \"orders\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"http\", url = \"{target}\", timeout = \"2s\" }}\n",
        dir.join("inbox.db").display(),
        plugin_path("work_order").display()
    );
    std::fs::write(&config, text).expect("write the routing file");
    config
}

/// Starts `inlet run` (with `extra` arguments and `envs`), pushes one good message
/// and one the plugin cannot decode, waits for the delivery, stops the process
/// gracefully and returns its log and the delivered entry's id.
async fn run_once(extra: &[&str], envs: &[(&str, &str)]) -> (String, i64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let camunda = FakeCamunda::start().await;
    let config = routing_file(dir.path(), &camunda.url());
    let listen = format!("127.0.0.1:{}", free_port());
    let mut args = vec!["--listen", listen.as_str(), "--poll", "50ms"];
    args.extend_from_slice(extra);
    let mut inlet = InletProcess::spawn_with_args(&config, &args, envs);
    inlet.wait_healthy(Duration::from_secs(60)).await;
    let http = reqwest::Client::new();
    let push = |envelope: serde_json::Value| {
        let (http, url) = (http.clone(), format!("{}/push/orders", inlet.base));
        async move {
            let answer = http
                .post(url)
                .header("content-type", "application/json")
                .body(envelope.to_string())
                .send()
                .await
                .expect("push");
            assert_eq!(answer.status().as_u16(), 200, "push answered {}", answer.status());
            let body = answer.text().await.expect("the push answer");
            serde_json::from_str::<serde_json::Value>(&body)
                .unwrap_or_else(|e| panic!("the push answer is not JSON ({e}): {body}"))
        }
    };
    let delivered = push(push_envelope(DATA, &[], "m-good")).await;
    let entry = delivered["entry"].as_i64().unwrap_or_else(|| panic!("no entry id in {delivered}"));
    let parked = push(push_envelope(b"not json at all", &[], "m-bad")).await;
    assert_eq!(parked["outcome"], "parked", "{parked}");
    wait_until("the good message to be delivered", Duration::from_secs(30), || async { camunda.count() == 1 }).await;
    // The attempt's settle is logged after the target answered: wait for that line.
    wait_until("the attempt's outcome to be logged", Duration::from_secs(30), || {
        let log = inlet.log();
        async move { log.contains("entry settled") }
    })
    .await;
    let status = inlet.sigterm_and_wait(Duration::from_secs(30));
    assert!(status.success(), "inlet exited with {status}");
    (inlet.log(), entry)
}

/// The spans a JSON line ran in (`spans`), innermost last.
fn spans(line: &serde_json::Value) -> Vec<&serde_json::Map<String, serde_json::Value>> {
    line["spans"].as_array().map(|s| s.iter().filter_map(|v| v.as_object()).collect()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_lines_parse_and_attempt_lines_carry_route_and_entry_id() {
    let (log, entry) = run_once(&["--log-format", "json"], &[]).await;
    let mut lines = Vec::new();
    for (n, text) in log.lines().enumerate() {
        let line: serde_json::Value = serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("log line {} is not JSON ({e}):\n{text}\n\nwhole log:\n{log}", n + 1));
        assert!(line.is_object(), "log line {} is not an object: {text}", n + 1);
        for field in ["timestamp", "level", "target", "message"] {
            assert!(line.get(field).is_some(), "log line {} has no `{field}`: {text}", n + 1);
        }
        lines.push(line);
    }
    assert!(lines.iter().any(|l| l["message"] == "inlet listening"), "no start line in:\n{log}");

    let attempt_lines: Vec<&serde_json::Value> =
        lines.iter().filter(|l| spans(l).iter().any(|s| s.get("name").is_some_and(|n| n == "attempt"))).collect();
    assert!(!attempt_lines.is_empty(), "no line logged inside an attempt:\n{log}");
    for line in &attempt_lines {
        let attempt = spans(line).into_iter().find(|s| s["name"] == "attempt").expect("filtered on it");
        assert_eq!(attempt.get("route"), Some(&serde_json::json!("orders")), "{line}");
        assert_eq!(attempt.get("entry"), Some(&serde_json::json!(entry)), "{line}");
        assert_eq!(attempt.get("key"), Some(&serde_json::json!("4711")), "{line}");
        assert_eq!(line["span"]["name"], "attempt", "the innermost span is the attempt: {line}");
    }
    assert!(attempt_lines.iter().any(|l| l["message"] == "entry settled"), "the settle is logged in the attempt span");

    // The message the plugin could not decode: logged in its ingest span.
    let parked = lines
        .iter()
        .find(|l| l["message"] == "message could not be decoded; parking it")
        .unwrap_or_else(|| panic!("no decode failure line in:\n{log}"));
    let ingest = spans(parked).into_iter().find(|s| s["name"] == "ingest").expect("an ingest span");
    assert_eq!(ingest.get("route"), Some(&serde_json::json!("orders")), "{parked}");
    assert_eq!(ingest.get("message_id"), Some(&serde_json::json!("m-bad")), "{parked}");
    assert!(!log.contains("\x1b["), "colour codes in a log that is not a terminal:\n{log}");
}

/// The default format, with `NO_COLOR` unset: stderr is a file, so no colour codes,
/// and the attempt's span still names route and entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_lines_have_no_colour_codes_when_stderr_is_not_a_terminal() {
    let (log, entry) = run_once(&[], &[("NO_COLOR", "")]).await;
    assert!(log.contains("inlet listening"), "no start line in:\n{log}");
    assert!(!log.contains("\x1b["), "colour codes in a log that is not a terminal:\n{log}");
    let attempt = format!("attempt{{route=\"orders\" entry={entry} key=\"4711\"");
    let alt = format!("attempt{{route=orders entry={entry} key=4711");
    assert!(
        log.lines().any(|l| l.contains("entry settled") && (l.contains(&attempt) || l.contains(&alt))),
        "no settle line inside the attempt span of entry {entry}:\n{log}"
    );
    assert!(log.lines().all(|l| serde_json::from_str::<serde_json::Value>(l).is_err()), "text lines, not JSON");
}
