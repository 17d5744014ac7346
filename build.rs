//! Records the commit the binary is built from, for `inlet --version` and the
//! `inlet_build_info` metric: `INLET_BUILD_COMMIT` when the builder sets it (a build
//! from a source archive, an image build), else what git says of the checkout, else
//! "unknown". Cargo runs this again when the checkout's HEAD moves.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-env-changed=INLET_BUILD_COMMIT");
    let commit = match std::env::var("INLET_BUILD_COMMIT") {
        Ok(given) if !given.trim().is_empty() => given.trim().to_string(),
        _ => from_git().unwrap_or_else(|| "unknown".to_string()),
    };
    println!("cargo::rustc-env=INLET_COMMIT={commit}");
}

/// The short commit of HEAD, with the files whose change moves HEAD registered for a
/// rerun. Uncommitted changes are not marked: cargo would not run this again when a
/// file is edited, so such a mark would go stale either way.
fn from_git() -> Option<String> {
    let git_dir = PathBuf::from(git(&["rev-parse", "--git-dir"])?);
    let common_dir = PathBuf::from(git(&["rev-parse", "--git-common-dir"])?);
    watch(&git_dir.join("HEAD"));
    watch(&common_dir.join("packed-refs"));
    if let Ok(head) = std::fs::read_to_string(git_dir.join("HEAD"))
        && let Some(reference) = head.trim().strip_prefix("ref: ")
    {
        watch(&common_dir.join(reference));
    }
    git(&["rev-parse", "--short=12", "HEAD"])
}

fn watch(path: &Path) {
    if path.exists() {
        println!("cargo::rerun-if-changed={}", path.display());
    }
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}
