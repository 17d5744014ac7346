//! A PostgreSQL cluster of a test's own, for crashing it: [`PgCluster`].

use std::path::PathBuf;
use std::time::Duration;

use sqlx::Connection as _;

use crate::pg::connect_admin;
use crate::ports::free_port;

/// How long `pg_ctl start` may take (crash recovery included) before the test fails.
const PG_CLUSTER_START_TIMEOUT: Duration = Duration::from_secs(120);

/// A PostgreSQL cluster of the test's own: `initdb` into a temp dir, `pg_ctl` on a free
/// port of 127.0.0.1 (trust auth, superuser `postgres`), so a test can crash it
/// ([`PgCluster::crash`]: `pg_ctl stop -m immediate`, the postmaster and every backend
/// killed without a checkpoint) and bring it back on the same port and data
/// ([`PgCluster::start`], which runs crash recovery). Run as root, the tools run as the
/// `postgres` user (`runuser`), since PostgreSQL refuses to run as root. The binaries
/// come from `INLET_PG_BIN` if set, else the newest `/usr/lib/postgresql/*/bin`, else
/// `PATH`. Stopped (immediately) and removed on drop.
///
/// `fsync` is off: a crash here is a process crash, not a power cut, so what was
/// written to the kernel survives it (and the test stays fast on a loaded machine).
pub struct PgCluster {
    pub port: u16,
    bin: PathBuf,
    dir: tempfile::TempDir,
}

impl PgCluster {
    /// `initdb` and a first start; panics loudly (with the server log) if either fails.
    pub fn init() -> PgCluster {
        let bin = pg_bin_dir();
        let dir = tempfile::Builder::new().prefix("inlet-pg-cluster-").tempdir().expect("tempdir for a cluster");
        if running_as_root() {
            let status = std::process::Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .expect("run chown");
            assert!(status.success(), "chown {} to postgres: {status}", dir.path().display());
        }
        let cluster = PgCluster { port: free_port(), bin, dir };
        let out = cluster
            .tool("initdb")
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-instructions", "-D"])
            .arg(cluster.data())
            .output()
            .unwrap_or_else(|e| panic!("cannot run initdb: {e}"));
        assert!(
            out.status.success(),
            "initdb failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.start();
        cluster
    }

    /// `postgres://postgres@127.0.0.1:PORT/DATABASE`
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates a database (call while the cluster runs).
    pub async fn create_database(&self, name: &str) {
        let mut admin = connect_admin(&self.url("postgres")).await;
        sqlx::raw_sql(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut admin)
            .await
            .unwrap_or_else(|e| panic!("create database {name} on the private cluster: {e}"));
        let _ = admin.close().await;
    }

    /// Starts the cluster (again) on its port and data and waits until it accepts
    /// connections; after a [`crash`](Self::crash) that includes crash recovery.
    pub fn start(&self) {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=off -c full_page_writes=off -c max_connections=300",
            self.port,
            self.dir.path().display()
        );
        let out = self
            .tool("pg_ctl")
            .args(["start", "-w", "-t", &PG_CLUSTER_START_TIMEOUT.as_secs().to_string(), "-D"])
            .arg(self.data())
            .arg("-l")
            .arg(self.log_path())
            .args(["-o", &options])
            .output()
            .unwrap_or_else(|e| panic!("cannot run pg_ctl start: {e}"));
        assert!(
            out.status.success(),
            "pg_ctl start failed ({}): {}{}\n--- server log ---\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(self.log_path()).unwrap_or_default()
        );
    }

    /// Crashes the cluster: `pg_ctl stop -m immediate` (every server process gets
    /// SIGQUIT and exits without a checkpoint; open connections break). Returns once
    /// it is down.
    pub fn crash(&self) {
        let out = self
            .tool("pg_ctl")
            .args(["stop", "-m", "immediate", "-w", "-D"])
            .arg(self.data())
            .output()
            .unwrap_or_else(|e| panic!("cannot run pg_ctl stop: {e}"));
        assert!(
            out.status.success(),
            "pg_ctl stop -m immediate failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The server log (every start appends to it).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A command for one of the cluster's tools, as `postgres` when we are root.
    fn tool(&self, name: &str) -> std::process::Command {
        let path = self.bin.join(name);
        let mut cmd = if running_as_root() {
            let mut cmd = std::process::Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(path);
            cmd
        } else {
            std::process::Command::new(path)
        };
        cmd.stdin(std::process::Stdio::null());
        cmd
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = self.tool("pg_ctl").args(["stop", "-m", "immediate", "-D"]).arg(self.data()).output();
    }
}

fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
}

/// Where `initdb` and `pg_ctl` are: `INLET_PG_BIN`, else the newest
/// `/usr/lib/postgresql/*/bin`, else whatever `PATH` finds (an empty path).
fn pg_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("INLET_PG_BIN").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin)| bin.join("initdb").is_file())
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).unwrap_or_default()
}
