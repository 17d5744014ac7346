//! Google's Python Pub/Sub client (`tests/pubsub/`) as the independent publisher and
//! drain check of the Pub/Sub tests, so their traffic does not come from Inlet's code.

use std::time::Duration;

use crate::emulator::PubSubEmulator;
use crate::paths::repo_root;

/// The python with Google's Pub/Sub client (`scripts/ensure-py-pubsub`).
fn pubsub_python() -> std::ffi::OsString {
    std::env::var_os("INLET_PUBSUB_PYTHON").filter(|p| !p.is_empty()).unwrap_or_else(|| {
        panic!(
            "\n\n*** INLET_PUBSUB_PYTHON is not set: the Pub/Sub tests use Google's Python client.\n\
             *** Run the tests through scripts/test, or set it to the python that\n\
             *** scripts/ensure-py-pubsub prints: export INLET_PUBSUB_PYTHON=$(scripts/ensure-py-pubsub)\n\
             *** Tests are never skipped for a missing tool.\n\n"
        )
    })
}

/// What `tests/pubsub/publish.py` reports.
#[derive(Clone, Copy, Debug, serde::Deserialize)]
pub struct PublishReport {
    pub published: usize,
    /// From the first publish until every publish was confirmed.
    pub seconds: f64,
    /// Messages per second.
    pub rate: f64,
}

/// Publishes `count` work-order events to `topic` (a name as given to `create_topic`)
/// with Google's Python client, not Inlet's code (`tests/pubsub/publish.py`, run by
/// `$INLET_PUBSUB_PYTHON`, which `scripts/test` sets). Message `i` (`start` ≤ i <
/// `start + count`) is for correlation key `key-{i % keys}` with per-key sequence number
/// `i / keys` (its `completedItems`, what [`FakeCamunda::correlated_seqs`](crate::camunda::FakeCamunda::correlated_seqs) returns), has
/// the attributes `seq` = i, `key` and `eventId` = `evt-{i}` (the plugin's dedup key),
/// and, if `ordered`, the key as its ordering key. Returns once every publish is
/// confirmed; panics with the publisher's errors if any failed.
pub async fn publish_independent(
    emulator: &PubSubEmulator,
    topic: &str,
    count: usize,
    keys: usize,
    start: usize,
    ordered: bool,
) -> PublishReport {
    let mut cmd = publisher(emulator, topic, count, keys, start);
    if ordered {
        cmd.arg("--ordered");
    }
    run_publisher(cmd, count).await
}

/// Like [`publish_independent`] (unordered), the publishes spaced evenly over `spread`
/// instead of sent together (`publish.py --spread`): the emulator gives what it holds
/// to whichever stream of the subscription polls first, a stream that is gone
/// included, so each message spread out takes its own chance of reaching a live one.
pub async fn publish_spread(
    emulator: &PubSubEmulator,
    topic: &str,
    count: usize,
    keys: usize,
    start: usize,
    spread: Duration,
) -> PublishReport {
    let mut cmd = publisher(emulator, topic, count, keys, start);
    cmd.arg("--spread").arg(format!("{:.3}", spread.as_secs_f64()));
    run_publisher(cmd, count).await
}

/// Like [`publish_independent`] (unordered), every message also carrying `attributes`.
pub async fn publish_with_attributes(
    emulator: &PubSubEmulator,
    topic: &str,
    count: usize,
    keys: usize,
    start: usize,
    attributes: &[(&str, &str)],
) -> PublishReport {
    let mut cmd = publisher(emulator, topic, count, keys, start);
    for (name, value) in attributes {
        cmd.arg("--attribute").arg(format!("{name}={value}"));
    }
    run_publisher(cmd, count).await
}

/// Publishes one message, number `start` in [`publish_independent`]'s numbering (key
/// `key-0`, attributes `seq`, `key`, `eventId` = `evt-{start}`), whose data is the
/// bytes of `data_file`, with Google's Python client: for large messages.
pub async fn publish_file(emulator: &PubSubEmulator, topic: &str, data_file: &std::path::Path, start: usize) {
    let mut cmd = publisher(emulator, topic, 1, 1, start);
    cmd.arg("--data-file").arg(data_file);
    run_publisher(cmd, 1).await;
}

/// `tests/pubsub/publish.py` with the arguments every publish takes.
fn publisher(emulator: &PubSubEmulator, topic: &str, count: usize, keys: usize, start: usize) -> std::process::Command {
    let script = repo_root().join("tests").join("pubsub").join("publish.py");
    let mut cmd = std::process::Command::new(pubsub_python());
    cmd.arg(&script)
        .args(["--topic", &emulator.topic_path(topic)])
        .args(["--count", &count.to_string(), "--keys", &keys.to_string(), "--start", &start.to_string()])
        .env("PUBSUB_EMULATOR_HOST", &emulator.host)
        .stdin(std::process::Stdio::null());
    cmd
}

/// Runs the publisher, panics with its errors if it failed, returns its report.
async fn run_publisher(mut cmd: std::process::Command, count: usize) -> PublishReport {
    let described = format!("{cmd:?}");
    // A blocking wait on its own thread: the test's runtime keeps serving (fakes, Inlet).
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("the publisher's thread panicked")
        .unwrap_or_else(|e| panic!("cannot run the independent publisher {described}: {e}"));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        panic!("the independent publisher failed ({}): {described}\nstderr:\n{stderr}\nstdout:\n{stdout}", out.status);
    }
    let report: PublishReport =
        stdout.lines().last().and_then(|line| serde_json::from_str(line).ok()).unwrap_or_else(|| {
            panic!("the independent publisher printed no report: {described}\nstdout:\n{stdout}\nstderr:\n{stderr}")
        });
    assert_eq!(report.published, count, "the independent publisher's report: {stdout}");
    report
}

/// Asserts that `subscription` holds nothing: listens with Google's Python client
/// (a streaming pull, nacking whatever comes) for `quiet_for` and panics listing any
/// message that arrives, since a message there was never acked.
///
/// A streaming pull and not the REST pull: the emulator's unary pull answers 500 (a
/// NullPointerException in its OrderedMessageBacklog) on an ordered subscription that
/// a streaming pull has consumed. Call it once the consumers are stopped, with
/// `quiet_for` longer than the ack deadline, so that messages leased to a consumer
/// that went away have had time to come back.
pub async fn assert_drained(emulator: &PubSubEmulator, subscription: &str, quiet_for: Duration) {
    let mut cmd = std::process::Command::new(pubsub_python());
    cmd.arg(repo_root().join("tests/pubsub/drained.py"))
        .args(["--subscription", &emulator.subscription_path(subscription)])
        .args(["--quiet", &quiet_for.as_secs_f64().to_string()])
        .env("PUBSUB_EMULATOR_HOST", &emulator.host)
        .stdin(std::process::Stdio::null());
    let described = format!("{cmd:?}");
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("the drain check's thread panicked")
        .unwrap_or_else(|e| panic!("cannot run the drain check {described}: {e}"));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value =
        stdout.lines().last().and_then(|l| serde_json::from_str(l).ok()).unwrap_or_else(|| {
            panic!("the drain check printed no report: {described}\nstdout:\n{stdout}\nstderr:\n{stderr}")
        });
    assert!(out.status.success(), "the drain check failed: {report}\nstderr:\n{stderr}");
    assert_eq!(
        report["received"].as_u64(),
        Some(0),
        "subscription {subscription} is not drained: messages arrived that nobody acked: {report}"
    );
}

/// A message [`TopicReader`] received.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct ReadMessage {
    pub message_id: String,
    pub ordering_key: String,
    pub attributes: std::collections::BTreeMap<String, String>,
    pub data: String,
}

/// Google's Python client reading a subscription for as long as this lives
/// (`tests/pubsub/read_topic.py`): every message is acked and written to a file,
/// which [`TopicReader::messages`] reads in arrival order.
pub struct TopicReader {
    child: std::process::Child,
    out: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl TopicReader {
    pub fn start(emulator: &PubSubEmulator, subscription: &str) -> TopicReader {
        let dir = tempfile::Builder::new().prefix("inlet-topic-reader-").tempdir().expect("tempdir for the reader");
        let out = dir.path().join("messages.jsonl");
        let err = dir.path().join("stderr.txt");
        let child = std::process::Command::new(pubsub_python())
            .arg(repo_root().join("tests/pubsub/read_topic.py"))
            .args(["--subscription", &emulator.subscription_path(subscription)])
            .env("PUBSUB_EMULATOR_HOST", &emulator.host)
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&out).expect("create the reader's output"))
            .stderr(std::fs::File::create(&err).expect("create the reader's stderr"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start tests/pubsub/read_topic.py: {e}"));
        TopicReader { child, out, _dir: dir }
    }

    /// Every message received so far, in the order the client called back. Panics
    /// if the reader died.
    pub fn messages(&mut self) -> Vec<ReadMessage> {
        if let Some(status) = self.child.try_wait().expect("poll the reader") {
            let stderr = std::fs::read_to_string(self.out.with_file_name("stderr.txt")).unwrap_or_default();
            panic!("the topic reader exited ({status}):\n{stderr}");
        }
        let text = std::fs::read_to_string(&self.out).expect("read the reader's output");
        // The last line may be half written.
        text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    /// Stops the reader (SIGTERM, then waits for it) and returns everything it read.
    pub fn stop(mut self) -> Vec<ReadMessage> {
        let messages = self.messages();
        let pid = self.child.id().to_string();
        let _ = std::process::Command::new("kill").args(["-TERM", &pid]).status();
        let _ = self.child.wait();
        let text = std::fs::read_to_string(&self.out).expect("read the reader's output");
        let all: Vec<ReadMessage> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
        if all.len() >= messages.len() { all } else { messages }
    }
}

impl Drop for TopicReader {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
