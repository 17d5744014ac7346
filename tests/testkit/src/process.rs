//! Inlet as a process: [`InletProcess`], a real `inlet run` with its log, signalled,
//! killed and waited for by tests.

use std::path::PathBuf;
use std::time::Duration;

use crate::paths::inlet_bin;
use crate::wait::{poll_blocking, wait_until};

/// Lines of a process log printed when a test fails.
const LOG_TAIL_LINES: usize = 40;

/// A real `inlet run CONFIG` process, stdout and stderr in one log file in a temp dir
/// of its own, `RUST_LOG=inlet=debug`. Dropping it kills it (SIGKILL) and waits; if the
/// test is panicking, the tail of the log is printed and the log kept.
pub struct InletProcess {
    /// `INLET_INSTANCE` if `spawn` was given one (then it is also the lease owner),
    /// else `pid N`.
    pub name: String,
    /// `http://LISTEN`: push endpoint, admin API, health. LISTEN is `--listen` if given,
    /// else the routing file's `[server] listen` (default `127.0.0.1:8080`).
    pub base: String,
    child: std::process::Child,
    /// Set once the child has been reaped: from then on its pid may be someone else's.
    exited: Option<std::process::ExitStatus>,
    /// A panic of ours already showed the log's tail: `Drop` need not repeat it.
    tail_shown: std::cell::Cell<bool>,
    log: PathBuf,
    dir: Option<tempfile::TempDir>,
}

impl InletProcess {
    /// The process id (for /proc readings).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts `inlet run config`. `envs` are set after the defaults (`RUST_LOG`,
    /// `NO_COLOR=1`), so they may override them; `INLET_INSTANCE` is not inherited from
    /// the test's environment, only taken from `envs`.
    pub fn spawn(config: &std::path::Path, envs: &[(&str, &str)]) -> InletProcess {
        Self::spawn_with_args(config, &[], envs)
    }

    /// Like [`spawn`](Self::spawn), with more arguments after `run CONFIG` (`--listen`,
    /// `--poll`, …).
    pub fn spawn_with_args(config: &std::path::Path, args: &[&str], envs: &[(&str, &str)]) -> InletProcess {
        let dir = tempfile::Builder::new().prefix("inlet-process-").tempdir().expect("tempdir for an inlet log");
        let log = dir.path().join("inlet.log");
        let out = std::fs::File::create(&log).expect("create the inlet log");
        let listen = match args.iter().position(|a| *a == "--listen") {
            Some(i) => args.get(i + 1).expect("--listen needs a value").to_string(),
            None => configured_listen(config),
        };
        let child = std::process::Command::new(inlet_bin())
            .arg("run")
            .arg(config)
            .args(args)
            .env("RUST_LOG", "inlet=debug")
            .env("NO_COLOR", "1")
            .env_remove("INLET_INSTANCE")
            .envs(envs.iter().copied())
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().expect("inlet log file"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start inlet run {}: {e}", config.display()));
        let name = envs
            .iter()
            .find(|(k, _)| *k == "INLET_INSTANCE")
            .map(|(_, v)| (*v).to_owned())
            .unwrap_or_else(|| format!("pid {}", child.id()));
        InletProcess {
            name,
            base: format!("http://{listen}"),
            child,
            exited: None,
            tail_shown: Default::default(),
            log,
            dir: Some(dir),
        }
    }

    /// Waits until `GET /healthz` answers 2xx; panics (with the log) if the process
    /// exits or `within` passes first.
    pub async fn wait_healthy(&mut self, within: Duration) {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().expect("http client");
        let url = format!("{}/healthz", self.base);
        let what = format!("inlet {} to answer GET {url}", self.name);
        wait_until(&what, within, || {
            self.assert_running();
            let (http, url) = (http.clone(), url.clone());
            async move { http.get(&url).send().await.is_ok_and(|r| r.status().is_success()) }
        })
        .await;
    }

    /// Panics, with the tail of the log, if the process has exited.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.try_exited() {
            panic!("inlet {} exited early with {status}\n{}", self.name, self.log_tail());
        }
    }

    /// Kills the process with SIGKILL (a crash: nothing is flushed, acked or handed
    /// back) and waits for it. Idempotent.
    pub fn sigkill(&mut self) {
        if self.exited.is_none() {
            let _ = self.child.kill();
            self.exited = Some(self.child.wait().unwrap_or_else(|e| panic!("wait for inlet {}: {e}", self.name)));
        }
    }

    /// Sends SIGTERM (a graceful stop) and waits for the exit; panics with the log if
    /// the process had already exited, or is still running after `within` (it is then
    /// killed).
    ///
    /// On a multi-thread runtime the wait leaves this worker's tasks to the others
    /// (`block_in_place`), so fakes in this process keep answering the deliveries Inlet
    /// finishes while it stops; on a current-thread runtime they would stall.
    pub fn sigterm_and_wait(&mut self, within: Duration) -> std::process::ExitStatus {
        self.signal("TERM");
        self.wait_exit(within)
    }

    /// Sends a signal (`TERM`, `INT`, as `kill -NAME` spells it) and returns at once;
    /// panics with the log if the process had already exited.
    pub fn signal(&mut self, name: &str) {
        if let Some(status) = self.try_exited() {
            panic!("inlet {} had already exited with {status} before SIG{name}\n{}", self.name, self.log_tail());
        }
        let pid = self.child.id().to_string();
        let sent = std::process::Command::new("kill").args([&format!("-{name}"), &pid]).status();
        assert!(sent.as_ref().is_ok_and(|s| s.success()), "kill -{name} {pid} (inlet {}): {sent:?}", self.name);
    }

    /// Waits for the process to exit (after a [`signal`](Self::signal)); panics with
    /// the log if it is still running after `within` (it is then killed). Leaves this
    /// worker's tasks to the others while it waits, as [`sigterm_and_wait`](Self::sigterm_and_wait).
    pub fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let multi_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        let mut wait = || poll_blocking(within, || self.try_exited());
        let exited = if multi_thread { tokio::task::block_in_place(wait) } else { wait() };
        exited.unwrap_or_else(|| {
            self.sigkill();
            panic!("inlet {} did not exit within {within:?} (killed)\n{}", self.name, self.log_tail());
        })
    }

    /// The whole log so far (stdout and stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_else(|e| panic!("read {}: {e}", self.log.display()))
    }

    /// The exit status, if the process has exited (reaping it).
    fn try_exited(&mut self) -> Option<std::process::ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().unwrap_or_else(|e| panic!("wait for inlet {}: {e}", self.name));
        }
        self.exited
    }

    /// The last lines of the log, headed by where the whole log is.
    fn log_tail(&self) -> String {
        self.tail_shown.set(true);
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(LOG_TAIL_LINES);
        format!(
            "----- inlet {} log (last {} of {} lines, {}) -----\n{}",
            self.name,
            lines.len() - from,
            lines.len(),
            self.log.display(),
            lines[from..].join("\n")
        )
    }
}

impl Drop for InletProcess {
    fn drop(&mut self) {
        self.sigkill();
        if std::thread::panicking() {
            if !self.tail_shown.get() {
                eprintln!("{}", self.log_tail());
            }
            // Keep the whole log for a look after the failed test.
            if let Some(dir) = self.dir.take() {
                eprintln!("----- inlet {} log kept at {} -----", self.name, dir.keep().join("inlet.log").display());
            }
        }
    }
}

/// `[server] listen` of a routing file, or Inlet's default; only to know where the
/// process will listen (the process itself reads the file).
fn configured_listen(config: &std::path::Path) -> String {
    let text = std::fs::read_to_string(config).unwrap_or_else(|e| panic!("read {}: {e}", config.display()));
    let file: toml::Table = toml::from_str(&text).unwrap_or_else(|e| panic!("{} is not TOML: {e}", config.display()));
    file.get("server").and_then(|s| s.get("listen")).and_then(|l| l.as_str()).unwrap_or("127.0.0.1:8080").to_owned()
}
