//! Inlet in this process: [`start_on_sqlite`] starts it on a fresh SQLite inbox.

use std::path::PathBuf;
use std::time::Duration;

/// An Inlet instance started in this process on a fresh SQLite inbox in a folder of
/// its own, listening on a free port, polling every 20 ms.
pub struct Instance {
    pub running: inlet::app::Running,
    /// The routing file; `dir` holds it and the inbox.
    pub config: PathBuf,
    pub dir: tempfile::TempDir,
}

impl Instance {
    /// `http://127.0.0.1:PORT`
    pub fn base(&self) -> String {
        format!("http://{}", self.running.addr)
    }
}

/// Starts Inlet with the given `[[route]]` tables; `tune` adjusts the options (a
/// manual clock, reload timing, …) before the start.
pub async fn start_on_sqlite(routes: &str, tune: impl FnOnce(&mut inlet::app::Options)) -> Instance {
    start_on_sqlite_with_env(routes, &|name| std::env::var(name).ok(), tune).await
}

/// Like [`start_on_sqlite`], with `${NAME}` in the routing file read from `env`
/// instead of the process's environment (which a test must not change while others
/// run).
pub async fn start_on_sqlite_with_env(
    routes: &str,
    env: &dyn Fn(&str) -> Option<String>,
    tune: impl FnOnce(&mut inlet::app::Options),
) -> Instance {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("inlet.toml");
    let text = format!("[store]\nurl = \"sqlite://inbox.db\"\n\n{routes}");
    std::fs::write(&config, &text).expect("write the routing file");
    let loaded = inlet::config::Config::from_str(&config, &text, env)
        .unwrap_or_else(|e| panic!("test routing file is invalid:\n{e}"));
    let mut options = inlet::app::Options {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        poll: Duration::from_millis(20),
        ..inlet::app::Options::default()
    };
    tune(&mut options);
    let running = inlet::app::start(&loaded, options).await.expect("inlet starts");
    Instance { running, config, dir }
}
