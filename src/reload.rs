//! Changes while running: a new routing file or a new plugin file is validated and
//! swapped in; a broken one is refused with a clear error and what runs keeps running.
//!
//! Checked every few seconds (by content digest, so touching a file does nothing), at
//! once on SIGHUP, and on `POST /api/reload`. A routing-file change that touches the
//! store or the listener is refused: those need a restart. Route changes apply per
//! route: unchanged routes keep running untouched; a changed or removed route's relay
//! stops claiming and finishes what it has in flight; new and changed routes start.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;

use crate::app::Shared;
use crate::config::Config;
use crate::routing::Reload;
use crate::telemetry::{Metrics, OutcomeLabel};

/// Digests of the routing file: the one applied and the last one refused.
#[derive(Default)]
pub(crate) struct Seen {
    applied: Option<String>,
    refused: Option<String>,
}

fn config_digest(shared: &Shared) -> Option<String> {
    let path = shared.config.lock().expect("config lock").path.clone();
    std::fs::read(&path).ok().map(|b| crate::inbox::digest_hex(&b))
}

/// Runs until shutdown: checks every `every`, and at once on SIGHUP.
pub async fn watch(shared: Arc<Shared>, every: Option<Duration>, mut shutdown: watch::Receiver<bool>) {
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        let tick = async {
            match every {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        #[cfg(unix)]
        let hangup = async {
            match hup.as_mut() {
                Some(s) => s.recv().await,
                None => std::future::pending().await,
            }
        };
        #[cfg(not(unix))]
        let hangup = std::future::pending::<Option<()>>();
        let forced = tokio::select! {
            _ = tick => false,
            _ = hangup => {
                tracing::info!("SIGHUP: checking the routing file and plugins for new versions");
                true
            }
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        check(&shared, forced).await;
    }
}

fn with_seen<R>(shared: &Shared, f: impl FnOnce(&mut Seen) -> R) -> R {
    f(&mut shared.config_seen.lock().expect("seen lock"))
}

/// Records the routing file as it was when the instance started.
pub(crate) fn remember_applied(shared: &Shared) {
    let digest = config_digest(shared);
    with_seen(shared, |s| s.applied = digest);
}

/// Checks the routing file, then every plugin file (reading each in full, whatever
/// its timestamp); returns what happened, per route, as the admin API shows it.
pub async fn reload_now(shared: &Arc<Shared>) -> Value {
    check(shared, true).await
}

/// The timer's check reads a plugin file only when its size or modification time
/// moved, so a large plugin is not hashed every few seconds.
async fn check(shared: &Arc<Shared>, forced: bool) -> Value {
    let config = reload_config(shared).await;
    let plugins = reload_plugins(shared, forced).await;
    json!({ "routing_file": config, "plugins": plugins })
}

async fn reload_config(shared: &Arc<Shared>) -> Value {
    let Some(digest) = config_digest(shared) else {
        return json!({ "result": "unreadable" });
    };
    let (applied, refused) = with_seen(shared, |s| (s.applied.clone(), s.refused.clone()));
    if applied.as_deref() == Some(digest.as_str()) {
        return json!({ "result": "unchanged" });
    }
    if refused.as_deref() == Some(digest.as_str()) {
        return json!({ "result": "refused", "error": "same refused version as before" });
    }
    match apply_config(shared).await {
        Ok(v) => {
            with_seen(shared, |s| {
                s.applied = Some(digest);
                s.refused = None;
            });
            shared.metrics.config_reloads.get_or_create(&OutcomeLabel { outcome: "ok" }).inc();
            v
        }
        Err(error) => {
            tracing::error!(%error, "new routing file refused; the running configuration stays");
            with_seen(shared, |s| s.refused = Some(digest));
            shared.metrics.config_reloads.get_or_create(&OutcomeLabel { outcome: "refused" }).inc();
            json!({ "result": "refused", "error": error })
        }
    }
}

async fn apply_config(shared: &Arc<Shared>) -> Result<Value, String> {
    let old = shared.config.lock().expect("config lock").clone();
    let new = Config::load(&old.path).map_err(|e| e.to_string())?;
    if new.store != old.store {
        return Err("the store changed; that needs a restart".into());
    }
    if new.server != old.server {
        return Err("the server section changed; that needs a restart".into());
    }
    // Tokens and roles apply at once (the admin gate reads them per request); a
    // listener does not move while running.
    if new.admin.listen != old.admin.listen {
        return Err("[admin] listen changed; that needs a restart".into());
    }
    let current = shared.routes();
    let next = {
        let new = new.clone();
        tokio::task::spawn_blocking(move || current.next(&new))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|errors| errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))?
    };
    let (routes, fresh) = next;
    let before: Vec<String> = shared.routes().iter().map(|r| r.name().to_string()).collect();
    let removed: Vec<String> = before.iter().filter(|n| routes.get(n).is_none()).cloned().collect();
    let (changed, added): (Vec<String>, Vec<String>) = fresh.iter().cloned().partition(|n| before.contains(n));
    shared.replace_routes(Arc::new(routes), &fresh);
    *shared.config.lock().expect("config lock") = new;
    tracing::info!(?added, ?changed, ?removed, "routing file applied");
    Ok(json!({ "result": "applied", "added": added, "changed": changed, "removed": removed }))
}

async fn reload_plugins(shared: &Arc<Shared>, forced: bool) -> Value {
    let routes = shared.routes();
    let results = tokio::task::spawn_blocking(move || routes.reload_plugins(forced)).await.unwrap_or_default();
    let mut out = serde_json::Map::new();
    for (route, r) in results {
        let (label, v) = match r {
            Ok(Reload::Unchanged) => (None, json!({ "result": "unchanged" })),
            Ok(Reload::Swapped { digest }) => (Some("ok"), json!({ "result": "reloaded", "sha256": digest })),
            Ok(Reload::StillBroken) => (None, json!({ "result": "refused", "error": "same broken version as before" })),
            Err(e) => (Some("refused"), json!({ "result": "refused", "error": e.to_string() })),
        };
        if let Some(outcome) = label {
            shared.metrics.plugin_reloads.get_or_create(&Metrics::outcome(&route, outcome)).inc();
        }
        out.insert(route, v);
    }
    Value::Object(out)
}
