//! Promotion and rollback of a route's candidate plugin, one step each, for the admin
//! API, the console and the CLI alike.
//!
//! The routing file stays the source of truth: a step is an edit of the route's
//! `plugin`, `candidate` and `previous` lines in the file that declares it
//! ([`crate::config::edit`]), and every instance applies it the way it applies any
//! change of that file (its reload timer, SIGHUP, `POST /api/reload`). Before the file
//! is written, the version that is to serve is loaded as the route would load it (its
//! pin checked, compiled, started once), so a step never leaves the file naming a
//! build that cannot serve. The caller records the step in the audit log.

use std::path::{Path, PathBuf};

use crate::config::edit::{self, EditError, Step};
use crate::config::{PluginFile, RouteConfig};
use crate::plugin::PluginLoadError;

/// What a step changed.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Stepped {
    pub route: String,
    /// `promote` or `rollback`.
    pub step: &'static str,
    /// The routing file that was rewritten, as the configuration names it.
    pub file: PathBuf,
    /// The plugin that serves now, as the file spells its path.
    pub serving: String,
    /// Its SHA-256.
    pub serving_sha256: String,
    /// The version it replaced, as the file spells its path.
    pub replaced: String,
}

impl Stepped {
    /// The audit log's detail: what serves now and what it replaced.
    pub fn detail(&self) -> String {
        format!(
            "{} now serves (sha256 {}), replacing {}; {}",
            self.serving,
            self.serving_sha256,
            self.replaced,
            self.file.display()
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error("route `{route}` has no candidate to promote: name one with `candidate = {{ path = \"…\", sha256 = \"…\" }}` in {}", .file.display())]
    NoCandidate { route: String, file: PathBuf },
    #[error("route `{route}` has no previous version to roll back to: `previous` is written by a promotion ({})", .file.display())]
    NoPrevious { route: String, file: PathBuf },
    #[error("the version that would serve does not load, so the routing file was left as it is: {0}")]
    Plugin(#[from] PluginLoadError),
    #[error("{}: {source}", .file.display())]
    Edit { file: PathBuf, source: EditError },
    #[error("could not read or write {}: {source}", .file.display())]
    Io { file: PathBuf, source: std::io::Error },
}

impl RolloutError {
    /// Whether the route's file is not in a state the step applies to (a conflict),
    /// rather than a failure to carry it out.
    pub fn is_conflict(&self) -> bool {
        matches!(self, RolloutError::NoCandidate { .. } | RolloutError::NoPrevious { .. } | RolloutError::Plugin(_))
    }
}

/// Promotes the route's candidate (or rolls back to its previous version, with
/// `Step::Rollback`): checks the version that is to serve, then rewrites the route's
/// lines in its routing file. Blocking (it compiles): call from a blocking thread.
pub fn step(route: &RouteConfig, step: Step, cache: Option<&Path>) -> Result<Stepped, RolloutError> {
    let name = route.name.to_string();
    let file = route.file.clone();
    let next: &PluginFile = match step {
        Step::Promote => {
            route.candidate.as_ref().ok_or(RolloutError::NoCandidate { route: name.clone(), file: file.clone() })?
        }
        Step::Rollback => {
            route.previous.as_ref().ok_or(RolloutError::NoPrevious { route: name.clone(), file: file.clone() })?
        }
    };
    let (digest, loaded) = crate::plugin::load::load_file(next, &route.limits, cache, false);
    loaded?;
    let io = |source| RolloutError::Io { file: file.clone(), source };
    let text = std::fs::read_to_string(&file).map_err(io)?;
    let edited = edit::apply(&text, &name, step).map_err(|source| RolloutError::Edit { file: file.clone(), source })?;
    write_in_place(&file, &edited).map_err(io)?;
    Ok(Stepped {
        route: name,
        step: match step {
            Step::Promote => "promote",
            Step::Rollback => "rollback",
        },
        file,
        serving: next.shown.display().to_string(),
        serving_sha256: digest.unwrap_or_default(),
        replaced: route.plugin_shown.display().to_string(),
    })
}

/// Replaces a file's content at once: written beside it, then renamed over it, so a
/// reload never reads half a file. The file keeps its permissions.
fn write_in_place(path: &Path, text: &str) -> std::io::Result<()> {
    let permissions = std::fs::metadata(path)?.permissions();
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".inlet-edit");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, text)?;
    std::fs::set_permissions(&tmp, permissions)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}
