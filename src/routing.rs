//! Routes as they run: a route's configuration with its loaded plugin, its target
//! and the signal that wakes its relay when a new entry is stored.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use tokio::sync::Notify;

use crate::config::{Config, RouteConfig};
use crate::plugin::{Plugin, PluginLoadError};
use crate::target::Target;

pub struct Route {
    pub config: RouteConfig,
    pub plugin: Arc<Plugin>,
    pub target: Target,
    /// Notified after an entry of this route is committed.
    pub stored: Notify,
}

impl Route {
    pub fn name(&self) -> &str {
        self.config.name.as_str()
    }
}

/// Every route of a configuration, by name.
pub struct Routes {
    by_name: BTreeMap<String, Arc<Route>>,
}

impl Routes {
    /// Loads every route's plugin; reports every plugin that fails, not just the first.
    pub fn load(config: &Config, cache: Option<&Path>) -> Result<Routes, Vec<PluginLoadError>> {
        let client = Target::client();
        let mut by_name = BTreeMap::new();
        let mut errors = Vec::new();
        for rc in &config.routes {
            match Plugin::load(&rc.plugin, rc.limits.clone(), cache) {
                Ok(plugin) => {
                    let route = Route {
                        target: Target::new(rc.name.as_str(), &rc.target, &client),
                        config: rc.clone(),
                        plugin,
                        stored: Notify::new(),
                    };
                    by_name.insert(rc.name.to_string(), Arc::new(route));
                }
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() { Ok(Routes { by_name }) } else { Err(errors) }
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Route>> {
        self.by_name.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.by_name.values()
    }
}
