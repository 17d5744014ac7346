//! Routes as they run: a route's configuration with its loaded plugin, its target
//! and the signal that wakes its relay when a new entry is stored.
//!
//! A route's plugin can be replaced while the route runs ([`Route::reload_plugin`]):
//! callers take an `Arc` of the current version for the whole of one call sequence,
//! so in-flight calls finish on the version they started with.
//!
//! A route may pin its plugin's SHA-256 (`RouteConfig::plugin_sha256`): a file with
//! another digest is refused before it is compiled, at start (the route stays out)
//! and while running (the pinned version it runs keeps serving), so what serves is
//! exactly the build the team tested.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::Notify;

use crate::config::{Config, ConfigErrorKind, PushAuth, RouteConfig};
use crate::delivery::{Clients, Target};
use crate::plugin::{Plugin, PluginLoadError, load};
use crate::shadow::Shadow;
use crate::telemetry::Metrics;

/// The routes serving now, replaced whole when a reload applies new routing files:
/// a reader takes the set as it is and keeps it for as long as it works with it.
pub struct RouteTable(RwLock<Arc<Routes>>);

impl RouteTable {
    pub fn new(routes: Arc<Routes>) -> RouteTable {
        RouteTable(RwLock::new(routes))
    }

    /// The routes as they are now.
    pub fn get(&self) -> Arc<Routes> {
        Arc::clone(&self.0.read().expect("routes lock"))
    }

    pub fn set(&self, routes: Arc<Routes>) {
        *self.0.write().expect("routes lock") = routes;
    }
}

pub struct Route {
    pub config: RouteConfig,
    plugin: RwLock<Arc<Plugin>>,
    /// The last version of the file that was refused, so it is reported once (and
    /// shown until the file changes again).
    last_failed: Mutex<Option<FailedVersion>>,
    /// Size and modification time of the plugin file when last read.
    file_stamp: Mutex<Option<(u64, Option<std::time::SystemTime>)>>,
    pub target: Target,
    /// Notified after an entry of this route is committed.
    pub stored: Notify,
    /// The candidate plugin run in shadow, when the route names one.
    shadow: Option<Shadow>,
    /// The claim-check store, when the route names one.
    fetcher: Option<crate::claim_check::Fetcher>,
}

/// A version of a route's plugin file that was refused.
#[derive(Debug, Clone)]
struct FailedVersion {
    digest: String,
    error: String,
}

/// What a reload did.
#[derive(Debug, PartialEq, Eq)]
pub enum Reload {
    Unchanged,
    /// The new version is in place.
    Swapped {
        digest: String,
    },
    /// The same broken version as last time; already reported.
    StillBroken,
}

impl Route {
    pub fn name(&self) -> &str {
        self.config.name.as_str()
    }

    /// The plugin version to use for one call sequence.
    pub fn plugin(&self) -> Arc<Plugin> {
        Arc::clone(&self.plugin.read().expect("plugin lock"))
    }

    /// The route's shadow, when it names a candidate that runs: the serving path
    /// offers it copies of its inputs and answers.
    pub fn shadow(&self) -> Option<&Shadow> {
        self.shadow.as_ref().filter(|s| s.running())
    }

    /// The claim-check store the route fetches referenced payloads from, if any.
    pub fn fetcher(&self) -> Option<&crate::claim_check::Fetcher> {
        self.fetcher.as_ref()
    }

    /// The route's shadow whatever its candidate's state (for its report).
    pub fn shadow_report(&self) -> Option<crate::shadow::Report> {
        self.shadow.as_ref().map(Shadow::report)
    }

    /// Why the plugin file as it is now does not serve (it does not load, or it is
    /// not the pinned build), while the version before it does; `None` when the file
    /// is what runs.
    pub fn refused_file(&self) -> Option<String> {
        self.last_failed.lock().expect("reload lock").as_ref().map(|f| f.error.clone())
    }

    /// Loads the plugin file again if its content changed. A version that does not
    /// load, or is not the build the route pins, is refused and the running one keeps
    /// serving. Unless `forced`, a file whose size and modification time are as last
    /// seen is not read at all.
    pub fn reload_plugin(&self, cache: Option<&Path>, forced: bool) -> Result<Reload, PluginLoadError> {
        let path = self.config.plugin.clone();
        let shown = self.config.plugin_shown.clone();
        let stamp = std::fs::metadata(&path).ok().map(|m| (m.len(), m.modified().ok()));
        {
            let mut seen = self.file_stamp.lock().expect("stamp lock");
            if !forced && stamp.is_some() && *seen == stamp {
                return Ok(Reload::Unchanged);
            }
            *seen = stamp;
        }
        let bytes = load::read_file(&path).map_err(|source| PluginLoadError::Read { path: shown.clone(), source })?;
        let digest = crate::inbox::digest_hex(&bytes);
        let mut last_failed = self.last_failed.lock().expect("reload lock");
        if digest == self.plugin().digest() {
            // Back to the version that runs (say, the pinned build put back).
            *last_failed = None;
            return Ok(Reload::Unchanged);
        }
        if last_failed.as_ref().is_some_and(|f| f.digest == digest) {
            return Ok(Reload::StillBroken);
        }
        match load::compile(&shown, &bytes, &digest, self.config.plugin_sha256.as_deref(), &self.config.limits, cache) {
            Ok(plugin) => {
                *self.plugin.write().expect("plugin lock") = plugin;
                *last_failed = None;
                Ok(Reload::Swapped { digest })
            }
            Err(e) => {
                *last_failed = Some(FailedVersion { digest, error: e.to_string() });
                Err(e)
            }
        }
    }
}

impl Route {
    /// Loads a route's plugin and builds its target (and the shadow of its candidate).
    pub fn load(
        config: RouteConfig,
        clients: &Clients,
        cache: Option<&Path>,
        metrics: &Arc<Metrics>,
    ) -> Result<Route, PluginLoadError> {
        let bytes = load::read_file(&config.plugin)
            .map_err(|source| PluginLoadError::Read { path: config.plugin_shown.clone(), source })?;
        Route::from_bytes(config, &bytes, clients, cache, metrics)
    }

    /// Builds a route from its plugin's bytes, as read from `config.plugin`, and
    /// starts the shadow of its candidate if it names one.
    fn from_bytes(
        config: RouteConfig,
        bytes: &[u8],
        clients: &Clients,
        cache: Option<&Path>,
        metrics: &Arc<Metrics>,
    ) -> Result<Route, PluginLoadError> {
        let digest = crate::inbox::digest_hex(bytes);
        let plugin = load::compile(
            &config.plugin_shown,
            bytes,
            &digest,
            config.plugin_sha256.as_deref(),
            &config.limits,
            cache,
        )?;
        let shadow = config.candidate.as_ref().map(|candidate| {
            Shadow::start(config.name.as_str(), candidate, &config.limits, cache, Arc::clone(metrics))
        });
        Ok(Route {
            shadow,
            fetcher: config.fetch.clone().map(|f| crate::claim_check::Fetcher::new(f, clients.http.clone())),
            target: Target::new(config.name.as_str(), &config.target, clients),
            config,
            plugin: RwLock::new(plugin),
            last_failed: Mutex::new(None),
            file_stamp: Mutex::new(None),
            stored: Notify::new(),
        })
    }
}

/// Size and modification time of a file: the cheap "did it change" check.
type Stamp = Option<(u64, Option<std::time::SystemTime>)>;

fn stamp(path: &Path) -> Stamp {
    std::fs::metadata(path).ok().map(|m| (m.len(), m.modified().ok()))
}

/// A route (or a routing file) that is not running as its file says, and why.
#[derive(Debug, Clone)]
pub struct Problem {
    /// `None` for a routing file that could not be parsed far enough to name its routes.
    pub route: Option<String>,
    /// The routing file that declares it.
    pub file: PathBuf,
    pub error: String,
    /// An older version of the route still runs: only the change was refused.
    pub running: bool,
    /// First time this cause is reported (so it is logged and counted once).
    pub new: bool,
    /// What a push to the route must pass before it is told the route is refused
    /// (see [`crate::config::RefusedRoute::push_auth`]).
    pub push_auth: Option<Box<PushAuth>>,
    /// The plugin file is not the build the route pins (`inlet_plugin_digest_mismatch_total`).
    pub digest_mismatch: bool,
    /// For a route refused for its plugin: the configuration to retry with once the
    /// plugin file changes, and what the file was when it failed.
    retry: Option<Box<Retry>>,
}

#[derive(Debug, Clone)]
struct Retry {
    config: RouteConfig,
    stamp: Stamp,
    digest: Option<String>,
}

impl Problem {
    /// Whether `other` is the same cause, already reported.
    fn same_cause(&self, other: &Problem) -> bool {
        self.route == other.route && self.file == other.file && self.error == other.error
    }
}

/// Every route of a configuration, by name, and the ones refused.
pub struct Routes {
    by_name: BTreeMap<String, Arc<Route>>,
    problems: Vec<Problem>,
    cache: Option<PathBuf>,
    clients: Clients,
    /// Where shadows count what they compare.
    metrics: Arc<Metrics>,
}

impl Routes {
    /// Loads every route's plugin. A route whose settings or plugin do not load is
    /// kept out and listed in [`Routes::problems`]; the others run.
    pub fn load(config: &Config, cache: Option<&Path>, clients: Clients, metrics: Arc<Metrics>) -> Routes {
        Routes::empty(cache, clients, metrics).next(config, true).0
    }

    /// No routes yet; `next` fills them in, compiling plugins through `cache`.
    pub fn empty(cache: Option<&Path>, clients: Clients, metrics: Arc<Metrics>) -> Routes {
        Routes { by_name: BTreeMap::new(), problems: Vec::new(), cache: cache.map(Path::to_path_buf), clients, metrics }
    }

    /// The routes of a new configuration: a route whose configuration did not change
    /// is kept as it runs (same plugin version, same wake-up signal); others are
    /// loaded afresh. A route that does not load keeps its running version if it has
    /// one, else is kept out; one refused for its plugin is tried again when the plugin
    /// file changed (any time if `forced`, else when its size or mtime moved). Also
    /// returns the names of the routes that are new or changed.
    pub fn next(&self, config: &Config, forced: bool) -> (Routes, Vec<String>) {
        let mut by_name = BTreeMap::new();
        let mut fresh = Vec::new();
        let mut problems = Vec::new();
        for rc in &config.routes {
            let name = rc.name.to_string();
            if let Some(running) = self.by_name.get(&name).filter(|r| r.config == *rc) {
                by_name.insert(name, Arc::clone(running));
                continue;
            }
            match self.try_load(rc, forced) {
                Ok(route) => {
                    by_name.insert(name.clone(), Arc::new(route));
                    fresh.push(name);
                }
                Err(problem) => problems.push(problem),
            }
        }
        // A variable the file is no longer granted stops its running version too: it
        // holds the value the platform took back.
        let mut revoked = Vec::new();
        for refused in &config.refused {
            let ungranted = refused.errors.0.iter().any(|e| matches!(e.kind, ConfigErrorKind::NotGranted { .. }));
            revoked.push(ungranted);
            problems.push(Problem {
                route: refused.name.as_ref().map(ToString::to_string),
                file: refused.file.clone(),
                error: refused.errors.to_string(),
                running: false,
                new: true,
                push_auth: refused.push_auth.clone().map(Box::new),
                digest_mismatch: false,
                retry: None,
            });
        }
        let loaded = problems.len() - revoked.len();
        // What was refused keeps its running version: by name, or, for a file that
        // could not name its routes, every route that file declared.
        for (i, p) in problems.iter_mut().enumerate() {
            p.running = false;
            if i >= loaded && revoked[i - loaded] {
                p.new = !self.problems.iter().any(|old| old.same_cause(p));
                continue;
            }
            let keep: Vec<&Arc<Route>> = match &p.route {
                Some(name) => self.by_name.get(name).into_iter().collect(),
                None => self.by_name.values().filter(|r| r.config.file == p.file).collect(),
            };
            for route in keep {
                if !by_name.contains_key(route.name()) {
                    by_name.insert(route.name().to_string(), Arc::clone(route));
                    p.running = true;
                }
            }
            p.new = !self.problems.iter().any(|old| old.same_cause(p));
        }
        let next = Routes {
            by_name,
            problems,
            cache: self.cache.clone(),
            clients: self.clients.clone(),
            metrics: Arc::clone(&self.metrics),
        };
        (next, fresh)
    }

    /// Loads one route, unless it is the same refused version as before (then the
    /// earlier problem again).
    fn try_load(&self, rc: &RouteConfig, forced: bool) -> Result<Route, Problem> {
        let name = rc.name.to_string();
        let before = self.problems.iter().find(|p| p.retry.as_ref().is_some_and(|r| r.config == *rc));
        let now = stamp(&rc.plugin);
        let unchanged = |p: &&Problem| p.retry.as_ref().is_some_and(|r| r.stamp == now && now.is_some());
        if let Some(p) = before.filter(|p| !forced && unchanged(p)) {
            return Err(p.clone());
        }
        let problem = |error: String, digest: Option<String>| Problem {
            route: Some(name.clone()),
            file: rc.file.clone(),
            error,
            running: false,
            new: true,
            push_auth: rc.push_auth.clone().map(Box::new),
            digest_mismatch: false,
            retry: Some(Box::new(Retry { config: rc.clone(), stamp: now, digest })),
        };
        let bytes = load::read_file(&rc.plugin).map_err(|source| {
            problem(PluginLoadError::Read { path: rc.plugin_shown.clone(), source }.to_string(), None)
        })?;
        let digest = crate::inbox::digest_hex(&bytes);
        if let Some(p) = before.filter(|p| p.retry.as_ref().and_then(|r| r.digest.as_deref()) == Some(digest.as_str()))
        {
            return Err(Problem {
                retry: Some(Box::new(Retry { config: rc.clone(), stamp: now, digest: Some(digest) })),
                ..p.clone()
            });
        }
        Route::from_bytes(rc.clone(), &bytes, &self.clients, self.cache.as_deref(), &self.metrics).map_err(|e| {
            Problem {
                digest_mismatch: matches!(e, PluginLoadError::DigestMismatch { .. }),
                ..problem(e.to_string(), Some(digest))
            }
        })
    }

    /// The folder plugins are compiled through.
    pub fn cache(&self) -> Option<&Path> {
        self.cache.as_deref()
    }

    /// Routes and files that are not running as their files say.
    pub fn problems(&self) -> &[Problem] {
        &self.problems
    }

    /// Why `name` is not running, if it is a refused route.
    pub fn refusal(&self, name: &str) -> Option<&Problem> {
        self.problems.iter().find(|p| !p.running && p.route.as_deref() == Some(name))
    }

    /// Whether some route waits for its plugin file to change (checked on every poll).
    pub fn awaits_plugin_fix(&self) -> bool {
        self.problems.iter().any(|p| p.retry.is_some())
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Route>> {
        self.by_name.get(name)
    }
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.by_name.values()
    }

    /// Reloads every plugin whose file changed; logs each outcome. Compiling is slow,
    /// so call this from a blocking thread.
    pub fn reload_plugins(&self, forced: bool) -> Vec<(String, Result<Reload, PluginLoadError>)> {
        let mut out = Vec::new();
        for route in self.by_name.values() {
            let result = route.reload_plugin(self.cache.as_deref(), forced);
            match &result {
                Ok(Reload::Swapped { digest }) => {
                    tracing::info!(
                        route = route.name(),
                        digest = &digest[..12],
                        "plugin reloaded; new calls use the new version"
                    )
                }
                Err(error) => {
                    tracing::error!(route = route.name(), %error, "new plugin version refused; the running version keeps serving")
                }
                Ok(_) => {}
            }
            out.push((route.name().to_string(), result));
            if let Some(shadow) = &route.shadow {
                shadow.reload(self.cache.as_deref(), forced);
            }
        }
        out
    }
}
