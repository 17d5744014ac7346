//! Repairs an operator makes on a bad night, end to end on a real SQLite file and a
//! real PostgreSQL database: a poison entry parked at the head of its key under
//! `block-key` discarded with a reason (API and CLI), so the key's later entries are
//! delivered; every repair in the audit log. Requests are real HTTP with real
//! tokens; the target is a real HTTP server playing Camunda 7.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::{FakeCamunda, Reply, TestPg, plugin_path, push_envelope, wait_for, wait_until};
use inlet::app::{self, Running};
use inlet::config::Config;
use inlet::inbox::{Entry, Status, Store};
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
        let data = format!(r#"{{"workOrderId":"{key}","completedItems":{seq},"completionTimestamp":"t"}}"#);
        let envelope = push_envelope(data.as_bytes(), &[], &format!("{route}-{key}-{seq}"));
        let r = self.http.post(format!("{}/push/{route}", self.base)).body(envelope.to_string()).send().await.unwrap();
        let answer: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
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
