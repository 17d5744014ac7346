//! Plugin files as routes name them: read (surviving a ConfigMap swap), checked
//! against the route's pin and refused if they are not WebAssembly, then compiled.

use std::path::Path;
use std::sync::Arc;

use crate::config::{PluginFile, PluginLimits};
use crate::plugin::{Plugin, PluginLoadError};

/// Compiles a route's plugin, whose SHA-256 is `digest`; `pin` is the digest the route
/// requires, if any. `shown` names the file in messages, as the routing file spells
/// it. What [`refuse_before_compiling`] refuses is never compiled.
pub fn compile(
    shown: &Path,
    bytes: &[u8],
    digest: &str,
    pin: Option<&str>,
    limits: &PluginLimits,
    cache: Option<&Path>,
) -> Result<Arc<Plugin>, PluginLoadError> {
    refuse_before_compiling(shown, bytes, digest, pin)?;
    Plugin::from_bytes(shown, bytes, limits.clone(), cache)
}

/// What is refused before a plugin file is compiled: another build than the pinned
/// one, and a file that is not WebAssembly at all (before the compiler's error could
/// quote its first bytes: a team file may name any file as its plugin, a secret file
/// included).
fn refuse_before_compiling(shown: &Path, bytes: &[u8], digest: &str, pin: Option<&str>) -> Result<(), PluginLoadError> {
    if let Some(pinned) = pin.filter(|pinned| *pinned != digest) {
        return Err(PluginLoadError::DigestMismatch {
            path: shown.to_path_buf(),
            expected: pinned.to_string(),
            found: digest.to_string(),
        });
    }
    if !bytes.starts_with(b"\0asm") {
        let reason = "not a WebAssembly file (it does not begin with `\\0asm`)".to_string();
        return Err(PluginLoadError::Compile { path: shown.to_path_buf(), reason });
    }
    Ok(())
}

/// Loads a plugin file a route names besides its serving one (`candidate`,
/// `previous`): read, its pin checked, then compiled like [`compile`] does. `shadow`
/// charges its instances to the shadow budget (a candidate that runs in shadow).
/// Also returns the file's digest, when it could be read.
pub fn load_file(
    file: &PluginFile,
    limits: &PluginLimits,
    cache: Option<&Path>,
    shadow: bool,
) -> (Option<String>, Result<Arc<Plugin>, PluginLoadError>) {
    let bytes = match read_file(&file.path) {
        Ok(bytes) => bytes,
        Err(source) => return (None, Err(PluginLoadError::Read { path: file.shown.clone(), source })),
    };
    let digest = crate::inbox::digest_hex(&bytes);
    if let Err(refused) = refuse_before_compiling(&file.shown, &bytes, &digest, file.sha256.as_deref()) {
        return (Some(digest), Err(refused));
    }
    let loaded = if shadow {
        Plugin::candidate_from_bytes(&file.shown, &bytes, limits.clone(), cache)
    } else {
        Plugin::from_bytes(&file.shown, &bytes, limits.clone(), cache)
    };
    (Some(digest), loaded)
}

/// Reads a plugin file, once more if it vanished under the first read while its path
/// still names a file: kubelet swaps a ConfigMap by renaming `..data` to a new folder
/// and then removing the old one, so a read whose path went through the old `..data`
/// just before the removal finds nothing, while the same path already names the new
/// file.
pub fn read_file(path: &Path) -> std::io::Result<Vec<u8>> {
    match std::fs::read(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && path.is_file() => std::fs::read(path),
        read => read,
    }
}
