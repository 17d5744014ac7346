//! `inlet inbox backup` against a real `inlet run` on SQLite under a push load: the
//! copy passes `PRAGMA integrity_check`, holds every entry whose push was answered 200
//! before the backup began (and before the time it says it is consistent as of), and
//! opens as an inbox again. A second backup to the same file is refused and leaves it
//! as it was; a PostgreSQL inbox is refused with a pointer to pg_dump.

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use inlet_testkit::paths::plugin_path;
use inlet_testkit::pg::TestPg;
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use inlet_testkit::push::push_work_order;
use inlet_testkit::recording_target::RecordingTarget;
use inlet_testkit::wait::wait_until;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

/// Pushers at once.
const PUSHERS: usize = 4;

/// `inlet --config CONFIG ARGS…`: stdout, stderr and the exit code.
fn cli(config: &Path, args: &[&str]) -> (String, String, Option<i32>) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inlet"))
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .expect("run inlet");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.code(),
    )
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

/// An entry whose push was answered 200: its id and when the answer arrived.
#[derive(Clone, Copy, Debug)]
struct Acked {
    entry: i64,
    at_ms: i64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_push_load_is_whole_and_holds_every_acked_entry() {
    let dir = tempfile::tempdir().unwrap();
    let target = RecordingTarget::start().await;
    let config = dir.path().join("inlet.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"sqlite://inbox.db\"\n\n[[route]]\nname = \"orders\"\nplugin = \"{}\"\n\
             source = {{ kind = \"push\" }}\ntarget = {{ kind = \"http\", url = \"http://{}\", timeout = \"5s\" }}\n",
            plugin_path("work_order").display(),
            target.addr()
        ),
    )
    .unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut inlet = InletProcess::spawn_with_args(&config, &["--listen", &listen, "--poll", "50ms"], &[]);
    inlet.wait_healthy(WAIT).await;

    // The load: pushers on keys of their own until told to stop, each 200 recorded
    // with the time its answer arrived.
    let acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut pushers = tokio::task::JoinSet::new();
    for p in 0..PUSHERS {
        let (acked, stop, base) = (Arc::clone(&acked), Arc::clone(&stop), inlet.base.clone());
        pushers.spawn(async move {
            let http = reqwest::Client::new();
            let mut seq = 0;
            while !stop.load(Ordering::Relaxed) {
                seq += 1;
                let (status, body) = push_work_order(&http, &base, "orders", &format!("p{p}"), seq).await;
                assert_eq!(status, 200, "push p{p}/{seq}: {body}");
                let at_ms = now_ms();
                let answer: Value = serde_json::from_str(&body).unwrap();
                let entry = answer["entry"].as_i64().unwrap_or_else(|| panic!("no entry id in {answer}"));
                acked.lock().unwrap().push(Acked { entry, at_ms });
            }
        });
    }
    wait_until("pushes to pile up", WAIT, || async { acked.lock().unwrap().len() >= 2_000 }).await;

    // Everything acked up to here was committed before the backup began.
    let before: Vec<Acked> = acked.lock().unwrap().clone();
    let file = dir.path().join("backups").join("inbox-1.db");
    std::fs::create_dir(dir.path().join("backups")).unwrap();
    let (out, err, code) =
        tokio::task::block_in_place(|| cli(&config, &["--json", "inbox", "backup", file.to_str().unwrap()]));
    let during = acked.lock().unwrap().len() - before.len();
    stop.store(true, Ordering::Relaxed);
    while let Some(done) = pushers.join_next().await {
        done.expect("a pusher failed");
    }
    assert_eq!(code, Some(0), "inlet inbox backup failed:\n{out}{err}");
    let report: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}):\n{out}"));
    // How much the load overlapped the backup is up to the scheduler; it is shown,
    // not asserted (the pushers never paused for it).
    println!("backed up {} entries while {during} more pushes were answered", report["entries"]);
    assert_eq!(report["file"], file.display().to_string(), "{report}");
    assert_eq!(report["bytes"].as_u64(), Some(std::fs::metadata(&file).unwrap().len()), "{report}");
    assert!(!dir.path().join("backups/inbox-1.db.partial").exists(), "no partial copy is left");

    // Whole, and holding every acked entry.
    let options = sqlx::sqlite::SqliteConnectOptions::new().filename(&file).read_only(true);
    let pool = sqlx::SqlitePool::connect_with(options).await.expect("open the backup");
    let check: Vec<String> = sqlx::query_scalar("PRAGMA integrity_check").fetch_all(&pool).await.unwrap();
    assert_eq!(check, ["ok"], "integrity_check of the backup");
    let ids: HashSet<i64> =
        sqlx::query_scalar("SELECT id FROM inbox_entry").fetch_all(&pool).await.unwrap().into_iter().collect();
    assert_eq!(Some(ids.len() as u64), report["entries"].as_u64(), "the entries it reported: {report}");
    let missing: Vec<i64> = before.iter().map(|a| a.entry).filter(|id| !ids.contains(id)).collect();
    assert!(missing.is_empty(), "{} entries acked before the backup began are missing: {missing:?}", missing.len());
    let consistent_at = report["consistent_at"].as_i64().unwrap_or_else(|| panic!("no consistent_at in {report}"));
    let all = acked.lock().unwrap().clone();
    let acked_earlier: Vec<&Acked> = all.iter().filter(|a| a.at_ms < consistent_at).collect();
    assert!(acked_earlier.len() >= before.len(), "the time it is consistent as of is after the backup began");
    let missing: Vec<i64> = acked_earlier.iter().map(|a| a.entry).filter(|id| !ids.contains(id)).collect();
    assert!(missing.is_empty(), "entries acked before consistent_at {consistent_at} are missing: {missing:?}");
    let journal: String = sqlx::query_scalar("PRAGMA journal_mode").fetch_one(&pool).await.unwrap();
    assert_eq!(journal, "delete", "the backup is one file, no -wal beside it");
    pool.close().await;

    // A second backup to the same file is refused; the first is left as it was.
    let bytes = std::fs::read(&file).unwrap();
    let (out, err, code) = cli(&config, &["inbox", "backup", file.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(err.contains("exists; a backup never overwrites a file"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), bytes, "the existing backup is untouched");

    // Restored in place of an inbox, it opens as one: the same entries.
    let restored = tempfile::tempdir().unwrap();
    std::fs::copy(&file, restored.path().join("inbox.db")).unwrap();
    let restored_config = restored.path().join("inlet.toml");
    std::fs::write(&restored_config, "[store]\nurl = \"sqlite://inbox.db\"\n").unwrap();
    let (out, err, code) = cli(&restored_config, &["--json", "inbox", "list", "--route", "orders", "--limit", "1"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let listing: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}):\n{out}"));
    assert_eq!(listing["matching"].as_u64(), Some(ids.len() as u64), "{listing}");

    // The text form says what a person needs: entries, size, and the time to seek to.
    let (out, err, code) = cli(&config, &["inbox", "backup", dir.path().join("backups/inbox-2.db").to_str().unwrap()]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains(" entries, ") && out.contains("holds everything committed before 20"), "{out}");
    assert!(inlet.sigterm_and_wait(WAIT).success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_inbox_is_refused_with_a_pointer_to_pg_dump() {
    let pg = TestPg::new().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("inlet.toml");
    std::fs::write(&config, format!("[store]\nurl = \"{}\"\n", pg.url)).unwrap();
    let file = dir.path().join("inbox.db");
    let (out, err, code) = tokio::task::block_in_place(|| cli(&config, &["inbox", "backup", file.to_str().unwrap()]));
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(err.contains("pg_dump") && err.contains("RUNBOOK.md"), "{err}");
    assert!(!file.exists(), "nothing is written");
}
