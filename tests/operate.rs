//! Repairs an operator makes on a bad night, end to end on a real SQLite file and a
//! real PostgreSQL database: a poison entry parked at the head of its key under
//! `block-key` discarded with a reason (API and CLI), so the key's later entries are
//! delivered; every repair in the audit log. Requests are real HTTP with real
//! tokens; the target is a real HTTP server playing Camunda 7.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use inlet::app::{self, Running};
use inlet::config::Config;
use inlet::inbox::{Entry, Status, Store};
use inlet_testkit::camunda::{FakeCamunda, Reply};
use inlet_testkit::paths::plugin_path;
use inlet_testkit::pg::TestPg;
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use inlet_testkit::push::{push_envelope, push_work_order};
use inlet_testkit::wait::{wait_for, wait_until};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);
const VIEWER: &str = "viewer-token-0123456789";
const OPS_WO: &str = "ops-wo-token-0123456789";
const ROOT: &str = "root-token-0123456789ab";

#[derive(Clone, Copy, Debug)]
enum Backend {
    Sqlite,
    Postgres,
}

/// An instance in this process: routes `wo` and `other` (work-order plugin, HTTP
/// target, per-key order, `block-key`), admin tokens from files.
struct Ops {
    running: Option<Running>,
    base: String,
    store: Arc<dyn Store>,
    config: PathBuf,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
    _pg: Option<TestPg>,
}

fn route(name: &str, target: &str) -> String {
    format!(
        "[[route]]\nname = \"{name}\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\n\
         target = {{ kind = \"http\", url = \"{target}\", timeout = \"2s\" }}\nordering = \"per-key\"\nparked = \"block-key\"\n\n",
        plugin_path("work_order").display()
    )
}

/// A viewer, an operator of route `wo` only, and an admin; secrets in files.
fn tokens(dir: &Path) -> String {
    for (file, secret) in [("viewer.token", VIEWER), ("ops.token", OPS_WO), ("root.token", ROOT)] {
        std::fs::write(dir.join(file), secret).unwrap();
    }
    "[admin]\n\
     [[admin.token]]\nname = \"viewer\"\nrole = \"viewer\"\nsecret_file = \"viewer.token\"\n\
     [[admin.token]]\nname = \"ops-wo\"\nrole = \"operator\"\nsecret_file = \"ops.token\"\nroutes = [\"wo\"]\n\
     [[admin.token]]\nname = \"root\"\nrole = \"admin\"\nsecret_file = \"root.token\"\n\n"
        .into()
}

impl Ops {
    async fn start(backend: Backend, target: &str) -> Ops {
        let dir = tempfile::tempdir().unwrap();
        let (url, pg) = match backend {
            Backend::Sqlite => (format!("sqlite://{}", dir.path().join("inbox.db").display()), None),
            Backend::Postgres => {
                let pg = TestPg::new().await;
                (pg.url.clone(), Some(pg))
            }
        };
        let config = dir.path().join("inlet.toml");
        let text = format!(
            "[store]\nurl = \"{url}\"\n\n{}{}{}",
            tokens(dir.path()),
            route("wo", target),
            route("other", target)
        );
        std::fs::write(&config, text).unwrap();
        let loaded = Config::load(&config).unwrap_or_else(|e| panic!("test routing file is invalid:\n{e}"));
        let options = app::Options {
            listen: Some("127.0.0.1:0".parse().unwrap()),
            poll: Duration::from_millis(20),
            reload_every: None,
            ..app::Options::default()
        };
        let running = app::start(&loaded, options).await.expect("inlet starts");
        Ops {
            base: format!("http://{}", running.addr),
            store: Arc::clone(&running.shared.store),
            running: Some(running),
            config,
            http: reqwest::Client::new(),
            _dir: dir,
            _pg: pg,
        }
    }

    /// Pushes work order `seq` of `key` to `route`; the entry's id.
    async fn push(&self, route: &str, key: &str, seq: u32) -> i64 {
        let (_, answer) = push_work_order(&self.http, &self.base, route, key, seq).await;
        let answer: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(answer["outcome"], "inserted", "{answer}");
        answer["entry"].as_i64().unwrap()
    }

    async fn entry(&self, id: i64) -> Entry {
        self.store.get(id).await.unwrap().expect("the entry exists")
    }

    async fn wait_status(&self, id: i64, status: Status) -> Entry {
        wait_for(&format!("entry {id} to be {status}"), WAIT, || async {
            Some(self.entry(id).await).filter(|e| e.status == status)
        })
        .await
    }

    /// `POST path` with `body` as `token`: the status and the JSON answer.
    async fn post(&self, path: &str, token: &str, body: Value) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, serde_json::from_str(&r.text().await.unwrap()).unwrap())
    }

    /// The audit log as (actor, action, subject, outcome).
    async fn audit(&self) -> Vec<(String, String, String, String)> {
        let lines = self.store.list_audit(None, 1000).await.unwrap();
        lines.into_iter().map(|a| (a.actor, a.action, a.subject, a.outcome)).collect()
    }

    /// `inlet inbox ARGS` on this instance's routing file, as user `carla`.
    fn cli(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(env!("CARGO_BIN_EXE_inlet"))
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .env("USER", "carla")
            .env_remove("RUST_LOG")
            .output()
            .unwrap()
    }

    async fn stop(mut self) {
        self.running.take().unwrap().stop().await;
    }
}

fn line(actor: &str, action: &str, subject: String, outcome: &str) -> (String, String, String, String) {
    (actor.into(), action.into(), subject, outcome.into())
}

/// The first delivery of key `poison` (and `poison-2`) is refused for good (two
/// executions match: parked at once); everything else is correlated.
async fn camunda_with_poison() -> FakeCamunda {
    FakeCamunda::with_behaviour(
        |key, attempt| {
            if key.starts_with("poison") && attempt == 1 { Reply::SeveralMatch } else { Reply::Ok }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignoring_a_parked_head_releases_its_key_with_a_record_on_sqlite() {
    ignoring_a_parked_head_releases_its_key_with_a_record(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignoring_a_parked_head_releases_its_key_with_a_record_on_postgres() {
    ignoring_a_parked_head_releases_its_key_with_a_record(Backend::Postgres).await;
}

async fn ignoring_a_parked_head_releases_its_key_with_a_record(backend: Backend) {
    let camunda = camunda_with_poison().await;
    let ops = Ops::start(backend, &camunda.url()).await;
    let mut ids = Vec::new();
    for seq in 1..=3 {
        ids.push(ops.push("wo", "poison", seq).await);
    }
    let head = ops.wait_status(ids[0], Status::Parked).await;
    assert!(head.last_error.as_deref().unwrap().contains("2 executions match"), "{:?}", head.last_error);
    for id in &ids[1..] {
        assert_eq!(ops.entry(*id).await.status, Status::Open, "later entries wait behind the parked head");
    }

    // Who may, and what it applies to.
    let ignore = |id: i64| format!("/api/entries/{id}/ignore");
    let reason = json!({ "reason": "duplicate of order 4711, closed by hand" });
    let (status, body) = ops.post(&ignore(ids[0]), VIEWER, reason.clone()).await;
    assert_eq!(status, 403, "a viewer may not discard: {body}");
    let (status, body) = ops.post(&ignore(ids[0]), OPS_WO, json!({ "reason": " " })).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("`reason` must not be empty")));
    let (status, body) = ops.post(&ignore(ids[1]), OPS_WO, reason.clone()).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["status"], "OPEN", "only PARKED entries are ignored: {body}");
    assert_eq!(ops.entry(ids[1]).await.status, Status::Open);

    let (status, body) = ops.post(&ignore(ids[0]), OPS_WO, reason.clone()).await;
    assert_eq!((status, body), (200, json!({ "entry": ids[0], "action": "ignore", "status": "IGNORED" })));
    wait_until("the key's later entries are delivered, in order", WAIT, || async {
        camunda.correlated_seqs("poison") == vec![2, 3]
    })
    .await;
    let ignored = ops.entry(ids[0]).await;
    assert_eq!(ignored.status, Status::Ignored);
    let error = ignored.last_error.unwrap();
    assert!(error.starts_with("ignored by hand: duplicate of order 4711, closed by hand (it was parked: "), "{error}");
    assert!(error.contains("2 executions match"), "the parking error is kept: {error}");
    assert!(ignored.finished_at.is_some(), "finished: retention deletes it in time");
    let (status, body) = ops.post(&ignore(ids[0]), OPS_WO, reason).await;
    assert_eq!((status, &body["status"]), (409, &json!("IGNORED")), "{body}");

    // The CLI does the same, as `cli:<user>`.
    let cli_head = ops.push("wo", "poison-2", 1).await;
    let cli_next = ops.push("wo", "poison-2", 2).await;
    ops.wait_status(cli_head, Status::Parked).await;
    let out = ops.cli(&["inbox", "ignore", &cli_head.to_string(), "--reason", "sent twice by the vendor"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("ignored {cli_head}\n"));
    ops.wait_status(cli_next, Status::Done).await;
    let out = ops.cli(&["inbox", "ignore", &cli_next.to_string(), "--reason", "x"]);
    assert_eq!(out.status.code(), Some(1));
    let expected = format!("error: entry {cli_next} is DONE; ignore applies to PARKED entries\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), expected);

    let subject = |id: i64| format!("entry {id}");
    assert_eq!(
        ops.audit().await,
        vec![
            line("ops-wo", "ignore", subject(ids[1]), "conflict"),
            line("ops-wo", "ignore", subject(ids[0]), "ok"),
            line("ops-wo", "ignore", subject(ids[0]), "conflict"),
            line("cli:carla", "ignore", subject(cli_head), "ok"),
            line("cli:carla", "ignore", subject(cli_next), "conflict"),
        ],
        "every ignore, done or refused with 409, is audited; the 403 and 400 are not"
    );
    let detail = ops.store.list_audit(None, 10).await.unwrap()[1].detail.clone();
    assert_eq!(detail.as_deref(), Some("duplicate of order 4711, closed by hand"));
    ops.stop().await;
}

/// `inlet run` processes sharing one inbox: the same routing file (routes `wo` and
/// `other`, tokens from files), each on its own port, polling every 50 ms.
struct Fleet {
    processes: Vec<InletProcess>,
    config: PathBuf,
    store: Arc<dyn Store>,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
    _pg: Option<TestPg>,
}

impl Fleet {
    async fn start(backend: Backend, instances: usize, target: &str) -> Fleet {
        let dir = tempfile::tempdir().unwrap();
        let (url, pg) = match backend {
            Backend::Sqlite => (format!("sqlite://{}", dir.path().join("inbox.db").display()), None),
            Backend::Postgres => {
                let pg = TestPg::new().await;
                (pg.url.clone(), Some(pg))
            }
        };
        let config = dir.path().join("inlet.toml");
        let text = format!(
            "[store]\nurl = \"{url}\"\n\n{}{}{}",
            tokens(dir.path()),
            route("wo", target),
            route("other", target)
        );
        std::fs::write(&config, text).unwrap();
        let mut processes = Vec::new();
        for i in 0..instances {
            let listen = format!("127.0.0.1:{}", free_port());
            let name = format!("inlet-{i}");
            let args = ["--listen", listen.as_str(), "--poll", "50ms"];
            processes.push(InletProcess::spawn_with_args(&config, &args, &[("INLET_INSTANCE", &name)]));
        }
        for p in &mut processes {
            p.wait_healthy(WAIT).await;
        }
        let store = inlet::inbox::open(&url, 2).await.unwrap();
        Fleet { processes, config, store, http: reqwest::Client::new(), _dir: dir, _pg: pg }
    }

    /// Pushes work order `seq` of `key` to `route` through instance `via`; the entry id.
    async fn push(&self, via: usize, route: &str, key: &str, seq: u32) -> i64 {
        let data = format!(r#"{{"workOrderId":"{key}","completedItems":{seq},"completionTimestamp":"t"}}"#);
        let envelope = push_envelope(data.as_bytes(), &[], &format!("{route}-{key}-{seq}"));
        let url = format!("{}/push/{route}", self.processes[via].base);
        let answer: Value = serde_json::from_str(
            &self
                .http
                .post(url)
                .header("content-type", "application/json")
                .body(envelope.to_string())
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
        )
        .unwrap();
        assert_eq!(answer["outcome"], "inserted", "ingest goes on: {answer}");
        answer["entry"].as_i64().unwrap()
    }

    async fn call(
        &self,
        via: usize,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self.http.request(method, format!("{}{path}", self.processes[via].base)).bearer_auth(token);
        if let Some(body) = body {
            req = req.header("content-type", "application/json").body(body.to_string());
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        (status, serde_json::from_str(&r.text().await.unwrap()).unwrap())
    }

    /// `inlet ARGS --config FILE` as user `carla`.
    fn cli(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(env!("CARGO_BIN_EXE_inlet"))
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .env("USER", "carla")
            .env_remove("RUST_LOG")
            .output()
            .unwrap()
    }

    async fn metrics(&self, via: usize) -> String {
        self.http.get(format!("{}/metrics", self.processes[via].base)).send().await.unwrap().text().await.unwrap()
    }
}

/// Lines of a process log that mention route `wo` and say `what`.
fn wo_lines(log: &str, what: &str) -> usize {
    log.lines().filter(|l| l.contains(what) && l.contains("wo")).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_route_is_claimed_by_no_instance_while_ingest_goes_on_on_postgres() {
    a_paused_route_is_claimed_by_no_instance_while_ingest_goes_on(Backend::Postgres, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_route_is_claimed_by_no_instance_while_ingest_goes_on_on_sqlite() {
    a_paused_route_is_claimed_by_no_instance_while_ingest_goes_on(Backend::Sqlite, 1).await;
}

async fn a_paused_route_is_claimed_by_no_instance_while_ingest_goes_on(backend: Backend, instances: usize) {
    use reqwest::Method;
    let camunda = FakeCamunda::start().await;
    let fleet = Fleet::start(backend, instances, &camunda.url()).await;
    let last = instances - 1;
    fleet.push(0, "wo", "before", 1).await;
    wait_until("route wo delivers", WAIT, || async { camunda.correlated_seqs("before") == vec![1] }).await;

    // Who may pause what.
    let reason = json!({ "reason": "engine maintenance until 11:00" });
    let pause = |route: &str| format!("/api/routes/{route}/pause");
    let (status, body) = fleet.call(0, Method::POST, &pause("wo"), VIEWER, Some(reason.clone())).await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = fleet.call(0, Method::POST, &pause("other"), OPS_WO, Some(reason.clone())).await;
    assert_eq!((status, body), (404, json!({ "error": "no route named `other`", "route": "other" })), "not its route");
    let (status, body) = fleet.call(0, Method::POST, &pause("wo"), OPS_WO, Some(json!({ "reason": "" }))).await;
    assert_eq!(status, 400, "a reason is required: {body}");
    let (status, body) = fleet.call(0, Method::POST, "/api/routes/wo/resume", OPS_WO, None).await;
    assert_eq!((status, body), (409, json!({ "error": "route `wo` is not paused", "route": "wo" })));

    let (status, paused) = fleet.call(0, Method::POST, &pause("wo"), OPS_WO, Some(reason.clone())).await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["route"], "wo");
    assert_eq!(
        (paused["paused"]["by"].as_str(), paused["paused"]["reason"].as_str()),
        (Some("ops-wo"), Some("engine maintenance until 11:00"))
    );
    let (status, body) = fleet.call(last, Method::POST, &pause("wo"), OPS_WO, Some(reason)).await;
    assert_eq!(status, 409, "{body}");
    assert!(body["error"].as_str().unwrap().starts_with("route `wo` is already paused (by ops-wo at "), "{body}");

    // Every instance sees the pause within its poll interval and says so.
    for p in &fleet.processes {
        wait_until(&format!("{} reports route wo paused", p.name), WAIT, || async {
            wo_lines(&p.log(), "route paused: not claiming") == 1
        })
        .await;
    }

    // Ingest goes on through every instance; the entries wait.
    let skipped_before: Vec<usize> =
        fleet.processes.iter().map(|p| wo_lines(&p.log(), "route paused; not claiming")).collect();
    let mut held = Vec::new();
    for seq in 1..=4 {
        held.push(fleet.push(seq as usize % instances, "wo", "held", seq).await);
    }
    fleet.push(last, "other", "free", 1).await;
    wait_until("the other route still delivers", WAIT, || async { camunda.correlated_seqs("free") == vec![1] }).await;
    // Each relay has looked twice since the entries were committed, and claimed none.
    for (p, before) in fleet.processes.iter().zip(&skipped_before) {
        wait_until(&format!("{} skips route wo twice more", p.name), WAIT, || async {
            wo_lines(&p.log(), "route paused; not claiming") >= before + 2
        })
        .await;
    }
    assert_eq!(camunda.deliveries_for("held").len(), 0, "nothing of a paused route is delivered");
    for id in &held {
        let e = fleet.store.get(*id).await.unwrap().unwrap();
        assert_eq!((e.status, e.attempts), (Status::Open, 0), "entry {id} waits unclaimed");
    }
    for i in 0..instances {
        let metrics = fleet.metrics(i).await;
        assert!(metrics.contains("inlet_route_paused{route=\"wo\"} 1"), "{metrics}");
        assert!(metrics.contains("inlet_route_paused{route=\"other\"} 0"), "{metrics}");
    }
    let (_, routes) = fleet.call(last, Method::GET, "/api/routes", VIEWER, None).await;
    let shown =
        |name: &str| routes["routes"].as_array().unwrap().iter().find(|r| r["name"] == name).unwrap()["paused"].clone();
    assert_eq!(shown("wo")["by"], "ops-wo", "{routes}");
    assert_eq!(shown("other"), Value::Null, "{routes}");
    let out = fleet.cli(&["route", "list"]);
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let wo = table.lines().find(|l| l.starts_with("wo ")).unwrap_or_else(|| panic!("no wo row: {table}"));
    assert!(wo.contains("by ops-wo at ") && wo.contains(": engine maintenance until 11:00"), "{table}");
    assert_eq!(wo.split_whitespace().nth(1), Some("4"), "four OPEN entries wait: {table}");
    let out = fleet.cli(&["route", "list", "--json"]);
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed["routes"][1]["name"], "wo", "{listed}");
    assert_eq!(listed["routes"][1]["paused"]["by"], "ops-wo", "{listed}");

    // Resumed from the command line: every instance claims again, in order.
    let out = fleet.cli(&["route", "pause", "nope", "--reason", "x"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: no route named `nope` in "), "{out:?}");
    let out = fleet.cli(&["route", "resume", "wo"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "resumed wo\n");
    wait_until("the held entries are delivered in order", WAIT, || async {
        camunda.correlated_seqs("held") == vec![1, 2, 3, 4]
    })
    .await;
    for p in &fleet.processes {
        wait_until(&format!("{} reports route wo resumed", p.name), WAIT, || async {
            wo_lines(&p.log(), "route resumed: claiming again") == 1
        })
        .await;
    }
    let (_, audit) = fleet.call(0, Method::GET, "/api/audit", ROOT, None).await;
    let lines: Vec<(&str, &str, &str, &str)> = audit["audit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["actor"].as_str().unwrap(),
                a["action"].as_str().unwrap(),
                a["subject"].as_str().unwrap(),
                a["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        lines,
        [
            ("ops-wo", "resume", "route wo", "conflict"),
            ("ops-wo", "pause", "route wo", "ok"),
            ("ops-wo", "pause", "route wo", "conflict"),
            ("cli:carla", "resume", "route wo", "ok"),
        ],
        "{audit}"
    );
}

/// The operator actions themselves (`inlet::operate`), for what neither transport
/// shows: a repair job's plan, and the audit of a repair of an entry that is not there
/// (the API answers 404 before it acts; the command line acts and is refused).
mod actions {
    use inlet::clock::{Clock, ManualClock};
    use inlet::inbox::{NewEntry, Status};
    use inlet::operate::{EntryRepair, Inputs, JobPlan, Operator, Reason, Refusal, Relays, RepairAction};

    #[test]
    fn a_job_plan_takes_a_rate_in_bounds_and_the_reason_park_and_ignore_need() {
        for rate in [0, inlet::operate::jobs::MAX_RATE + 1] {
            let refused = JobPlan::new(RepairAction::Requeue, None, rate, Inputs::Flags).unwrap_err();
            assert_eq!(refused.to_string(), format!("--rate must be between 1 and {}", inlet::operate::jobs::MAX_RATE));
        }
        let refused = JobPlan::new(RepairAction::Ignore, Some("  "), 1, Inputs::Json).unwrap_err();
        assert_eq!(refused.to_string(), "ignore needs a `reason`", "a blank reason is none");
        let refused = JobPlan::new(RepairAction::Park, None, 1, Inputs::Flags).unwrap_err();
        assert_eq!(refused.to_string(), "park needs --reason");
        assert!(JobPlan::new(RepairAction::Requeue, None, inlet::operate::jobs::MAX_RATE, Inputs::Json).is_ok());
        let refused = Reason::new(" \t", Inputs::Flags).unwrap_err();
        assert_eq!(refused.to_string(), "--reason must not be empty");
    }

    #[tokio::test]
    async fn every_repair_that_reaches_the_store_is_audited_even_of_a_missing_entry() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            inlet::inbox::open(&format!("sqlite://{}", dir.path().join("inbox.db").display()), 2).await.unwrap();
        let clock = ManualClock::new(1_785_578_400_000);
        let open = NewEntry {
            route: "wo".into(),
            dedup_key: "m-1".into(),
            decoded: None,
            raw_data: b"{}".to_vec(),
            attributes: vec![],
            message_id: "m-1".into(),
            publish_time: None,
            delivery_attempt: None,
            status: Status::Open,
            last_error: None,
        };
        let id = store.insert(&open, clock.now()).await.unwrap().id();
        let ops = Operator::new(store.as_ref(), clock.as_ref(), Relays::Elsewhere, "cli:carla");

        let ignore = EntryRepair::Ignore(Reason::new("sent twice", Inputs::Flags).unwrap());
        let refused = ops.repair(id, &ignore).await.unwrap_err();
        assert!(matches!(refused, Refusal::NotApplicable { now: Status::Open, .. }), "{refused:?}");
        let park = EntryRepair::Park(Reason::new("  waiting for the vendor ", Inputs::Flags).unwrap());
        let done = ops.repair(id, &park).await.unwrap();
        assert_eq!((done.entry, done.status), (id, Status::Parked));
        let parked = store.get(id).await.unwrap().unwrap();
        assert_eq!(parked.last_error.as_deref(), Some("parked by hand: waiting for the vendor"));
        let refused = ops.repair(999_999, &EntryRepair::Requeue).await.unwrap_err();
        assert_eq!(refused.to_string(), "no entry 999999");

        let audit: Vec<_> = store
            .list_audit(None, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|a| (a.action, a.route, a.subject, a.outcome, a.detail))
            .collect();
        let line = |action: &str, route: Option<&str>, subject: String, outcome: &str, detail: Option<&str>| {
            (action.to_string(), route.map(str::to_string), subject, outcome.to_string(), detail.map(str::to_string))
        };
        assert_eq!(
            audit,
            [
                line("ignore", Some("wo"), format!("entry {id}"), "conflict", Some("sent twice")),
                line("park", Some("wo"), format!("entry {id}"), "ok", Some("waiting for the vendor")),
                line("requeue", None, "entry 999999".into(), "conflict", None),
            ]
        );
    }
}

/// A replay window through the admin API, with its access rules: a viewer may list
/// and read windows but not open one; a team's operator opens one on its own route only
/// (another route is not there for it); the pushed redelivery of a message published
/// inside the window is stored again (`replayed`), once, and every other redelivery is
/// a duplicate; the window lists the entry it made; closing it ends that; both steps
/// are audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_window_opened_over_the_api_takes_one_redelivery_as_a_new_entry() {
    let camunda = FakeCamunda::start().await;
    let ops = Ops::start(Backend::Sqlite, &camunda.url()).await;
    let inside = inlet_testkit::push::push_envelope(
        br#"{"workOrderId":"k","completedItems":1,"completionTimestamp":"t"}"#,
        &[],
        "wo-k-1",
    );
    let published = inside["message"]["publishTime"].as_str().unwrap().to_string();
    // Publish times are milliseconds: the next envelope's is later than the window's end.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let outside = inlet_testkit::push::push_envelope(
        br#"{"workOrderId":"k","completedItems":2,"completionTimestamp":"t"}"#,
        &[],
        "wo-k-2",
    );
    let push = async |envelope: &Value| {
        let r = inlet_testkit::push::send_push(&ops.http, &ops.base, "wo", envelope).await;
        let answer: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
        (answer["outcome"].as_str().unwrap().to_string(), answer["entry"].as_i64().unwrap())
    };
    let (first, original) = push(&inside).await;
    assert_eq!(first, "inserted");
    assert_eq!(push(&outside).await.0, "inserted");
    ops.wait_status(original, Status::Done).await;

    let at = inlet::pubsub_client::parse_time(&published).unwrap();
    let to = humantime::format_rfc3339_millis(at + Duration::from_millis(1)).to_string();
    let body = json!({ "from": published, "to": to, "reason": "redo order k after the fix" });
    let (status, refused) = ops.post("/api/routes/wo/replays", VIEWER, body.clone()).await;
    assert_eq!(status, 403, "a viewer may not open a window: {refused}");
    // Bad input changes nothing and says which field.
    for (bad, field) in [
        (json!({ "from": "yesterday", "to": to, "reason": "r" }), "from"),
        (json!({ "from": published, "to": published, "reason": "r" }), "before its end"),
        (json!({ "from": published, "to": to, "open_for": "8d", "reason": "r" }), "at most 7 days"),
        (json!({ "from": published, "to": to, "open_for": "soon", "reason": "r" }), "open_for"),
        (json!({ "from": published, "to": to, "reason": "  " }), "reason"),
        (json!({ "from": published, "to": to, "reason": "r", "extra": 1 }), "extra"),
    ] {
        let (status, refused) = ops.post("/api/routes/wo/replays", OPS_WO, bad.clone()).await;
        assert!(matches!(status, 400 | 422), "{bad}: {status} {refused}");
        assert!(refused["error"].as_str().unwrap().contains(field), "{bad}: {refused}");
    }
    let (status, refused) = ops.post("/api/routes/other/replays", OPS_WO, body.clone()).await;
    assert_eq!(status, 404, "another team's route is not there for this token: {refused}");
    let (status, window) = ops.post("/api/routes/wo/replays", OPS_WO, body.clone()).await;
    assert_eq!(status, 200, "{window}");
    let id = window["id"].as_i64().unwrap();
    assert_eq!((window["route"].as_str(), window["opened_by"].as_str()), (Some("wo"), Some("ops-wo")), "{window}");
    let (status, refused) = ops.post("/api/routes/wo/replays", OPS_WO, body).await;
    assert_eq!(status, 409, "an overlapping window: {refused}");

    let (outcome, replayed) = push(&inside).await;
    assert_eq!(outcome, "replayed", "the redelivery inside the window is stored again");
    assert_ne!(replayed, original);
    assert_eq!(push(&inside).await, ("duplicate".to_string(), original), "once per window");
    assert_eq!(push(&outside).await.0, "duplicate", "published after the window");
    ops.wait_status(replayed, Status::Done).await;
    assert_eq!(camunda.correlated_seqs("k"), [1, 2, 1], "the replayed message delivered again");

    let get = async |path: &str, token: &str| {
        let r = ops.http.get(format!("{}{path}", ops.base)).bearer_auth(token).send().await.unwrap();
        (r.status().as_u16(), serde_json::from_str::<Value>(&r.text().await.unwrap()).unwrap())
    };
    let (status, made) = get(&format!("/api/replays/{id}"), VIEWER).await;
    assert_eq!(status, 200, "{made}");
    assert_eq!(made["window"]["taken"], 1, "{made}");
    assert_eq!(made["entries"], json!([{ "entry": replayed, "original": original }]));
    let (status, listed) = get("/api/routes/wo/replays", VIEWER).await;
    assert_eq!((status, listed["windows"].as_array().map(Vec::len)), (200, Some(1)), "{listed}");

    let (status, closed) = ops.post(&format!("/api/replays/{id}/close"), OPS_WO, json!({})).await;
    assert_eq!(status, 200, "{closed}");
    assert!(closed["closed_at"].is_i64(), "{closed}");
    let (status, refused) = ops.post(&format!("/api/replays/{id}/close"), OPS_WO, json!({})).await;
    assert_eq!(status, 404, "closed already: {refused}");
    let audit: Vec<(String, String)> =
        ops.audit().await.into_iter().filter(|l| l.1.starts_with("replay")).map(|l| (l.1, l.3)).collect();
    assert_eq!(
        audit,
        [
            ("replay-open".to_string(), "ok".to_string()),
            ("replay-open".to_string(), "conflict".to_string()),
            ("replay-close".to_string(), "ok".to_string()),
            ("replay-close".to_string(), "conflict".to_string()),
        ]
    );
    ops.stop().await;
}
