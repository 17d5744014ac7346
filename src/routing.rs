//! Routes as they run: a route's configuration with its loaded plugin, its target
//! and the signal that wakes its relay when a new entry is stored.
//!
//! A route's plugin can be replaced while the route runs ([`Route::reload_plugin`]):
//! callers take an `Arc` of the current version for the whole of one call sequence,
//! so in-flight calls finish on the version they started with.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::Notify;

use crate::config::{Config, RouteConfig};
use crate::plugin::{Plugin, PluginLoadError};
use crate::target::{Clients, Target};

pub struct Route {
    pub config: RouteConfig,
    plugin: RwLock<Arc<Plugin>>,
    /// Digest of the last version that failed to load, so it is reported once.
    last_failed: Mutex<Option<String>>,
    /// Size and modification time of the plugin file when last read.
    file_stamp: Mutex<Option<(u64, Option<std::time::SystemTime>)>>,
    pub target: Target,
    /// Notified after an entry of this route is committed.
    pub stored: Notify,
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

    /// Loads the plugin file again if its content changed. A version that does not
    /// load is refused and the running one keeps serving. Unless `forced`, a file
    /// whose size and modification time are as last seen is not read at all.
    pub fn reload_plugin(&self, cache: Option<&Path>, forced: bool) -> Result<Reload, PluginLoadError> {
        let path = self.config.plugin.clone();
        let stamp = std::fs::metadata(&path).ok().map(|m| (m.len(), m.modified().ok()));
        {
            let mut seen = self.file_stamp.lock().expect("stamp lock");
            if !forced && stamp.is_some() && *seen == stamp {
                return Ok(Reload::Unchanged);
            }
            *seen = stamp;
        }
        let bytes = std::fs::read(&path).map_err(|source| PluginLoadError::Read { path: path.clone(), source })?;
        let digest = crate::inbox::digest_hex(&bytes);
        if digest == self.plugin().digest() {
            return Ok(Reload::Unchanged);
        }
        let mut last_failed = self.last_failed.lock().expect("reload lock");
        if last_failed.as_deref() == Some(digest.as_str()) {
            return Ok(Reload::StillBroken);
        }
        match Plugin::from_bytes(&path, &bytes, self.config.limits.clone(), cache) {
            Ok(plugin) => {
                *self.plugin.write().expect("plugin lock") = plugin;
                *last_failed = None;
                Ok(Reload::Swapped { digest })
            }
            Err(e) => {
                *last_failed = Some(digest);
                Err(e)
            }
        }
    }
}

impl Route {
    /// Loads a route's plugin and builds its target.
    pub fn load(config: RouteConfig, clients: &Clients, cache: Option<&Path>) -> Result<Route, PluginLoadError> {
        let plugin = Plugin::load(&config.plugin, config.limits.clone(), cache)?;
        Ok(Route {
            target: Target::new(config.name.as_str(), &config.target, clients),
            config,
            plugin: RwLock::new(plugin),
            last_failed: Mutex::new(None),
            file_stamp: Mutex::new(None),
            stored: Notify::new(),
        })
    }
}

/// Every route of a configuration, by name.
pub struct Routes {
    by_name: BTreeMap<String, Arc<Route>>,
    cache: Option<PathBuf>,
    clients: Clients,
}

impl Routes {
    /// Loads every route's plugin; reports every plugin that fails, not just the first.
    pub fn load(config: &Config, cache: Option<&Path>, clients: Clients) -> Result<Routes, Vec<PluginLoadError>> {
        Routes::empty(cache, clients).next(config).map(|(routes, _)| routes)
    }

    /// No routes yet; `next` fills them in, compiling plugins through `cache`.
    pub fn empty(cache: Option<&Path>, clients: Clients) -> Routes {
        Routes { by_name: BTreeMap::new(), cache: cache.map(Path::to_path_buf), clients }
    }

    /// The routes of a new configuration: a route whose configuration did not change
    /// is kept as it runs (same plugin version, same wake-up signal); others are
    /// loaded afresh. Also returns the names of the routes that are new or changed.
    pub fn next(&self, config: &Config) -> Result<(Routes, Vec<String>), Vec<PluginLoadError>> {
        let mut by_name = BTreeMap::new();
        let mut fresh = Vec::new();
        let mut errors = Vec::new();
        for rc in &config.routes {
            let name = rc.name.to_string();
            match self.by_name.get(&name) {
                Some(running) if running.config == *rc => {
                    by_name.insert(name, Arc::clone(running));
                }
                _ => match Route::load(rc.clone(), &self.clients, self.cache.as_deref()) {
                    Ok(route) => {
                        by_name.insert(name.clone(), Arc::new(route));
                        fresh.push(name);
                    }
                    Err(e) => errors.push(e),
                },
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok((Routes { by_name, cache: self.cache.clone(), clients: self.clients.clone() }, fresh))
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
        }
        out
    }
}
