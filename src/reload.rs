//! Changes while running: new routing files or plugin files are validated and
//! swapped in; a broken one is refused with a clear error and what runs keeps running.
//!
//! Checked every few seconds (by content digest over every routing file of the
//! directory, so touching a file does nothing, and adding or removing one counts), at
//! once on SIGHUP, and on `POST /api/reload`. A change that touches the store or the
//! listener is refused: those need a restart. Route changes apply per route:
//! unchanged routes keep running untouched; a changed or removed route's relay stops
//! claiming and finishes what it has in flight; new and changed routes start. A route
//! whose settings or plugin do not load refuses only itself: its running version (if
//! any) keeps serving, else it stays out, reported once per cause (log, metric,
//! `/api/routes`); one refused for its plugin is tried again whenever that plugin file
//! changes. A plugin file that is not the build its route pins is refused the same way
//! (and counted in `inlet_plugin_digest_mismatch_total`): the pinned version keeps
//! serving until the file is put back or the pin names the new build. Team files are
//! checked against the grants of the shared file as it is now: a variable no longer
//! granted refuses the file and stops its running routes.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;

use crate::config::Config;
use crate::plugin::PluginLoadError;
use crate::routing::{Reload, Routes};
use crate::shared::{Seen, Shared};
use crate::telemetry::{Metrics, OutcomeLabel};

/// One digest over the routing files (names and contents), so an added, changed or
/// removed file of a directory is a new version. Read as one version of the directory
/// (see [`crate::config::read_version`]), as the reload that follows reads it.
fn config_digest(shared: &Shared) -> Option<String> {
    let path = shared.config.lock().expect("config lock").path.clone();
    let mut all = Vec::new();
    for (file, bytes) in crate::config::read_version(&path).ok()? {
        all.extend_from_slice(file.to_string_lossy().as_bytes());
        all.push(0);
        all.extend_from_slice(crate::inbox::digest_hex(&bytes).as_bytes());
        all.push(b'\n');
    }
    Some(crate::inbox::digest_hex(&all))
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
    let config = reload_config(shared, forced).await;
    let plugins = reload_plugins(shared, forced).await;
    let refused = problems_view(&shared.routes());
    json!({ "routing_file": config, "plugins": plugins, "refused": refused })
}

async fn reload_config(shared: &Arc<Shared>, forced: bool) -> Value {
    let Some(digest) = config_digest(shared) else {
        return json!({ "result": "unreadable" });
    };
    let (applied, refused) = with_seen(shared, |s| (s.applied.clone(), s.refused.clone()));
    if applied.as_deref() == Some(digest.as_str()) {
        if !shared.routes().awaits_plugin_fix() {
            return json!({ "result": "unchanged" });
        }
        // The files are as applied, but a refused route may have a fixed plugin now.
        let config = shared.config.lock().expect("config lock").clone();
        return match apply_routes(shared, &config, forced).await {
            Ok(v) if v["added"].as_array().is_some_and(|a| !a.is_empty()) => v,
            Ok(_) => json!({ "result": "unchanged" }),
            Err(error) => json!({ "result": "refused", "error": error }),
        };
    }
    if refused.as_deref() == Some(digest.as_str()) {
        return json!({ "result": "refused", "error": "same refused version as before" });
    }
    match apply_config(shared, forced).await {
        Ok(v) => {
            with_seen(shared, |s| {
                s.applied = Some(digest);
                s.refused = None;
            });
            shared.metrics.config_reloads.get_or_create(&OutcomeLabel { outcome: "ok" }).inc();
            v
        }
        Err(error) => {
            tracing::error!(%error, "new routing files refused; the running configuration stays");
            with_seen(shared, |s| s.refused = Some(digest));
            shared.metrics.config_reloads.get_or_create(&OutcomeLabel { outcome: "refused" }).inc();
            json!({ "result": "refused", "error": error })
        }
    }
}

async fn apply_config(shared: &Arc<Shared>, forced: bool) -> Result<Value, String> {
    let old = shared.config.lock().expect("config lock").clone();
    let new = Config::load_partial(&old.path).map_err(|e| e.to_string())?;
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
    let v = apply_routes(shared, &new, forced).await?;
    *shared.config.lock().expect("config lock") = new;
    tracing::info!(added = %v["added"], changed = %v["changed"], removed = %v["removed"], "routing files applied");
    Ok(v)
}

/// Puts the routes of `config` in place (see [`Routes::next`]) and reports them.
async fn apply_routes(shared: &Arc<Shared>, config: &Config, forced: bool) -> Result<Value, String> {
    let current = shared.routes();
    let (routes, fresh) = {
        let (current, config) = (Arc::clone(&current), config.clone());
        tokio::task::spawn_blocking(move || current.next(&config, forced)).await.map_err(|e| e.to_string())?
    };
    let before: Vec<String> = current.iter().map(|r| r.name().to_string()).collect();
    let removed: Vec<String> = before.iter().filter(|n| routes.get(n).is_none()).cloned().collect();
    let (changed, added): (Vec<String>, Vec<String>) = fresh.iter().cloned().partition(|n| before.contains(n));
    let routes = Arc::new(routes);
    shared.replace_routes(Arc::clone(&routes), &fresh);
    report(shared, &routes);
    Ok(json!({
        "result": "applied",
        "added": added,
        "changed": changed,
        "removed": removed,
        "refused": problems_view(&routes),
    }))
}

/// Logs and counts each refused route or file once per cause, and sets `route_up`.
pub(crate) fn report(shared: &Shared, routes: &Routes) {
    let m = &shared.metrics;
    m.route_up.clear();
    for route in routes.iter() {
        m.route_up.get_or_create(&Metrics::route(route.name())).set(1);
    }
    let mut files_refused = 0;
    for p in routes.problems() {
        let file = p.file.display().to_string();
        match (&p.route, p.running) {
            (Some(route), false) => {
                m.route_up.get_or_create(&Metrics::route(route)).set(0);
            }
            (None, _) => files_refused += 1,
            _ => {}
        }
        if !p.new {
            continue;
        }
        let route = p.route.as_deref().unwrap_or("");
        if let Some(r) = &p.route {
            m.route_load_failures.get_or_create(&Metrics::route(r)).inc();
            if p.digest_mismatch {
                m.plugin_digest_mismatch.get_or_create(&Metrics::route(r)).inc();
            }
        }
        if p.running {
            tracing::error!(route, file, error = %p.error, "changed route refused; its running version keeps serving");
        } else {
            tracing::error!(route, file, error = %p.error, "route refused; the other routes run without it");
        }
    }
    m.routing_files_refused.set(files_refused);
}

/// The refused routes and files as the admin API shows them.
pub(crate) fn problems_view(routes: &Routes) -> Value {
    let list: Vec<Value> = routes
        .problems()
        .iter()
        .map(|p| json!({ "route": p.route, "file": p.file.display().to_string(), "error": p.error, "running": p.running }))
        .collect();
    Value::Array(list)
}

async fn reload_plugins(shared: &Arc<Shared>, forced: bool) -> Value {
    let routes = shared.routes();
    let results = tokio::task::spawn_blocking(move || routes.reload_plugins(forced)).await.unwrap_or_default();
    let mut out = serde_json::Map::new();
    for (route, r) in results {
        let not_pinned_build = matches!(r, Err(PluginLoadError::DigestMismatch { .. }));
        let (label, v) = match r {
            Ok(Reload::Unchanged) => (None, json!({ "result": "unchanged" })),
            Ok(Reload::Swapped { digest }) => (Some("ok"), json!({ "result": "reloaded", "sha256": digest })),
            Ok(Reload::StillBroken) => (None, json!({ "result": "refused", "error": "same broken version as before" })),
            Err(e) => (Some("refused"), json!({ "result": "refused", "error": e.to_string() })),
        };
        if let Some(outcome) = label {
            shared.metrics.plugin_reloads.get_or_create(&Metrics::outcome(&route, outcome)).inc();
        }
        if not_pinned_build {
            shared.metrics.plugin_digest_mismatch.get_or_create(&Metrics::route(&route)).inc();
        }
        out.insert(route, v);
    }
    Value::Object(out)
}
