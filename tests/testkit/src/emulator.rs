//! Google's Pub/Sub emulator, really started: [`PubSubEmulator`], killed and restarted
//! by tests, spoken to through its REST API.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::ports::free_port;
use crate::wait::{POLL_INTERVAL, poll_blocking};

/// How long the emulator (a JVM) may take to answer after a start or restart.
const EMULATOR_START_TIMEOUT: Duration = Duration::from_secs(90);

/// The real Pub/Sub emulator (`gcloud beta emulators pubsub start`), in its own process
/// group on a free port, stopped — the whole group, Java server included — on drop.
/// Spoken to through its REST API.
///
/// It keeps all state in memory: after [`PubSubEmulator::restart`] topics and
/// subscriptions are gone (the caller recreates them) and message ids start at 1 again.
pub struct PubSubEmulator {
    /// `127.0.0.1:PORT`, as `PUBSUB_EMULATOR_HOST` wants it.
    pub host: String,
    pub project: String,
    /// The running `gcloud` wrapper; `None` between [`PubSubEmulator::kill`] and
    /// [`PubSubEmulator::restart`].
    child: Option<std::process::Child>,
    /// stdout and stderr of every run on this host:port, appended.
    log: PathBuf,
    http: reqwest::Client,
}

impl PubSubEmulator {
    /// Starts an emulator for `project` on a free port and waits until it answers.
    pub async fn start(project: &str) -> PubSubEmulator {
        let port = free_port();
        let log = std::env::temp_dir().join(format!("inlet-pubsub-emulator-{port}.log"));
        // A fresh log: the port may have served an earlier run.
        std::fs::File::create(&log).unwrap_or_else(|e| panic!("emulator log file {}: {e}", log.display()));
        let mut emulator = PubSubEmulator {
            host: format!("127.0.0.1:{port}"),
            project: project.to_owned(),
            child: None,
            log,
            http: reqwest::Client::new(),
        };
        emulator.spawn_and_wait().await;
        emulator
    }

    /// A handle to an emulator that another value runs on `host` (for a task that only
    /// publishes or pulls): it owns no process, so dropping it stops nothing.
    pub fn attach(host: &str, project: &str) -> PubSubEmulator {
        PubSubEmulator {
            host: host.to_owned(),
            project: project.to_owned(),
            child: None,
            log: PathBuf::new(),
            http: reqwest::Client::new(),
        }
    }

    /// Kills the emulator (the whole process group, SIGKILL: it keeps nothing worth a
    /// graceful stop) and waits until its port refuses connections. Idempotent.
    pub fn kill(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        kill_group(&mut child);
        // The Java server is not our child, so it cannot be waited for: its listening
        // socket closing is the sign it is gone (even while it is an unreaped zombie).
        let addr: std::net::SocketAddr = self.host.parse().expect("the emulator host is an address");
        let gone = poll_blocking(Duration::from_secs(10), || {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err().then_some(())
        });
        assert!(gone.is_some(), "the Pub/Sub emulator on {} still accepts connections 10 s after SIGKILL", self.host);
    }

    /// Starts the emulator again on the same host:port and project (killing it first if
    /// it runs) and waits until it answers. It comes back empty: recreate topics and
    /// subscriptions.
    pub async fn restart(&mut self) {
        self.kill();
        use std::io::Write as _;
        let mut log = std::fs::OpenOptions::new().append(true).open(&self.log).expect("emulator log file");
        let _ = writeln!(log, "\n----- inlet tests: emulator restarted -----\n");
        self.spawn_and_wait().await;
    }

    /// Path of the emulator's log (every run on this port).
    pub fn log_path(&self) -> &std::path::Path {
        &self.log
    }

    /// The spawn and the readiness wait shared by [`start`](Self::start) and
    /// [`restart`](Self::restart).
    async fn spawn_and_wait(&mut self) {
        use std::os::unix::process::CommandExt as _;
        let out = std::fs::OpenOptions::new().append(true).open(&self.log).expect("emulator log file");
        let child = std::process::Command::new("gcloud")
            .args([
                "beta",
                "emulators",
                "pubsub",
                "start",
                &format!("--host-port={}", self.host),
                &format!("--project={}", self.project),
            ])
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().expect("emulator log file"))
            .stderr(out)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the Pub/Sub emulator (gcloud beta emulators pubsub start): {e}"));
        self.child = Some(child);

        let probe = format!("{}/topics", self.url());
        let started = Instant::now();
        let mut ticks = tokio::time::interval(POLL_INTERVAL * 5);
        loop {
            ticks.tick().await;
            if let Ok(r) = self.http.get(&probe).send().await
                && r.status().is_success()
            {
                return;
            }
            // An emulator that exits (e.g. the port was taken) will never answer.
            let exited = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() || started.elapsed() > EMULATOR_START_TIMEOUT {
                let why = match exited {
                    Some(status) => format!("exited with {status}"),
                    None => format!("did not answer within {EMULATOR_START_TIMEOUT:?}"),
                };
                let tail = std::fs::read_to_string(&self.log).unwrap_or_default();
                panic!("the Pub/Sub emulator on {} {why}; its log ({}):\n{tail}", self.host, self.log.display());
            }
        }
    }

    /// `http://HOST/v1/projects/PROJECT`, the base of the REST API.
    pub fn url(&self) -> String {
        format!("http://{}/v1/projects/{}", self.host, self.project)
    }

    /// `projects/PROJECT/topics/TOPIC`, the name clients use.
    pub fn topic_path(&self, topic: &str) -> String {
        format!("projects/{}/topics/{topic}", self.project)
    }

    /// `projects/PROJECT/subscriptions/SUBSCRIPTION`, the name clients use.
    pub fn subscription_path(&self, subscription: &str) -> String {
        format!("projects/{}/subscriptions/{subscription}", self.project)
    }

    pub async fn create_topic(&self, topic: &str) {
        let r = self.http.put(format!("{}/topics/{topic}", self.url())).send().await.unwrap();
        assert!(r.status().is_success(), "create topic {topic}: {}", r.text().await.unwrap());
    }

    /// Sends `body` to the emulator's REST API at `path` (under `projects/PROJECT/`,
    /// e.g. `topics/T` or `schemas?schemaId=S`) with `method`; panics if it is
    /// refused. Returns the answer. For what has no helper of its own: schemas, a
    /// topic's schema settings.
    pub async fn rest(&self, method: reqwest::Method, path: &str, body: &serde_json::Value) -> serde_json::Value {
        let r = self
            .http
            .request(method.clone(), format!("{}/{path}", self.url()))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let ok = r.status().is_success();
        let text = r.text().await.unwrap_or_default();
        assert!(ok, "{method} {path}: {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method} {path}: {e}: {text}"))
    }

    /// A subscription with a 10 s ack deadline.
    pub async fn create_subscription(&self, topic: &str, subscription: &str, ordered: bool) {
        self.create_subscription_with(topic, subscription, ordered, 10).await;
    }

    /// A subscription with the given ack deadline (the emulator accepts 10 to 600 s):
    /// how long a message leased to a consumer that went away waits before redelivery.
    pub async fn create_subscription_with(
        &self,
        topic: &str,
        subscription: &str,
        ordered: bool,
        ack_deadline_seconds: u32,
    ) {
        let body = serde_json::json!({
            "topic": self.topic_path(topic),
            "ackDeadlineSeconds": ack_deadline_seconds,
            "enableMessageOrdering": ordered,
        });
        self.put_subscription(subscription, &body).await;
    }

    /// Creates `subscription` with the REST body given (any setting the emulator
    /// takes: push config, exactly-once, …); panics if it is refused. Returns the
    /// subscription as the emulator answers it.
    pub async fn put_subscription(&self, subscription: &str, body: &serde_json::Value) -> serde_json::Value {
        self.rest(reqwest::Method::PUT, &format!("subscriptions/{subscription}"), body).await
    }

    /// `subscription` as the emulator reports it (REST's JSON: `filter`,
    /// `retryPolicy`, `enableExactlyOnceDelivery`, …).
    pub async fn subscription(&self, subscription: &str) -> serde_json::Value {
        let r = self.http.get(format!("{}/subscriptions/{subscription}", self.url())).send().await.unwrap();
        let ok = r.status().is_success();
        let text = r.text().await.unwrap_or_default();
        assert!(ok, "get subscription {subscription}: {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("get subscription {subscription}: {e}: {text}"))
    }

    /// Changes `subscription` by hand, as a person would in the console: the fields of
    /// `changes` named in `mask` (REST's `updateMask`, e.g. `retryPolicy`).
    pub async fn update_subscription(&self, subscription: &str, changes: serde_json::Value, mask: &str) {
        let body = serde_json::json!({ "subscription": changes, "updateMask": mask });
        let r = self
            .http
            .patch(format!("{}/subscriptions/{subscription}", self.url()))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let ok = r.status().is_success();
        assert!(ok, "update subscription {subscription} ({mask}): {}", r.text().await.unwrap_or_default());
    }

    /// Pulls what is there now (up to 1,000) and acks it.
    pub async fn pull(&self, subscription: &str) -> Vec<serde_json::Value> {
        let received = self.pull_now(subscription).await;
        if !received.is_empty() {
            let ack_ids: Vec<_> = received.iter().map(|m| m["ackId"].clone()).collect();
            let body = serde_json::json!({ "ackIds": ack_ids }).to_string();
            let r = self
                .http
                .post(format!("{}/subscriptions/{subscription}:acknowledge", self.url()))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "acknowledge on {subscription}: {}", r.text().await.unwrap());
        }
        received.into_iter().map(|m| m["message"].clone()).collect()
    }

    /// Pulls what is there now (up to 1,000) and nacks it, as a consumer that cannot
    /// store it would: each such delivery counts as an attempt where the subscription
    /// has a dead-letter policy. Returns the messages' `deliveryAttempt`s.
    pub async fn pull_and_nack(&self, subscription: &str) -> Vec<i64> {
        let received = self.pull_now(subscription).await;
        if !received.is_empty() {
            let ack_ids: Vec<_> = received.iter().map(|m| m["ackId"].clone()).collect();
            let body = serde_json::json!({ "ackIds": ack_ids, "ackDeadlineSeconds": 0 }).to_string();
            let r = self
                .http
                .post(format!("{}/subscriptions/{subscription}:modifyAckDeadline", self.url()))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "nack on {subscription}: {}", r.text().await.unwrap());
        }
        received.iter().map(|m| m["deliveryAttempt"].as_i64().unwrap_or(0)).collect()
    }

    /// One pull with `returnImmediately` (up to 1,000), not acked: the received
    /// messages, `{ackId, message, …}` each.
    async fn pull_now(&self, subscription: &str) -> Vec<serde_json::Value> {
        let body = serde_json::json!({ "maxMessages": 1000, "returnImmediately": true }).to_string();
        let r = self
            .http
            .post(format!("{}/subscriptions/{subscription}:pull", self.url()))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("pull on {subscription}: {e}"));
        let status = r.status();
        let text = r.text().await.unwrap();
        assert!(status.is_success(), "pull on {subscription} answered {status}: {text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["receivedMessages"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for PubSubEmulator {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_group(&mut child);
        }
    }
}

/// SIGKILLs the process group `child` leads and reaps `child`. The gcloud wrapper
/// leaves its Java child running if only the wrapper dies, hence the group.
fn kill_group(child: &mut std::process::Child) {
    let group = format!("-{}", child.id());
    let _ = std::process::Command::new("kill").args(["-KILL", "--", &group]).status();
    let _ = child.wait();
}
