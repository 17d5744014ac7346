//! What this binary is: its version, the commit it was built from (`build.rs`), the
//! plugin contracts it speaks and the inbox schema versions it embeds. One source for
//! `inlet --version` and the `inlet_build_info` metric.

use std::sync::LazyLock;

use crate::inbox::schema;
use crate::plugin::CONTRACTS;

/// The crate version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit the binary was built from (`INLET_BUILD_COMMIT` or git at build time;
/// "unknown" for a build outside a checkout without it).
pub const COMMIT: &str = env!("INLET_COMMIT");

/// The newest schema version this binary embeds per store, as `postgres 9`.
pub fn schemas() -> Vec<(&'static str, i64)> {
    [("postgres", "postgres://"), ("sqlite", "sqlite:")]
        .into_iter()
        .map(|(store, url)| {
            let newest = schema::known(url).and_then(|m| m.last()).map_or(0, |m| m.version);
            (store, newest)
        })
        .collect()
}

/// The contract packages, comma separated.
pub fn contracts() -> String {
    CONTRACTS.iter().map(|c| c.package).collect::<Vec<_>>().join(", ")
}

/// `inlet -V`: one line.
pub static SHORT: LazyLock<String> =
    LazyLock::new(|| format!("{VERSION} (commit {COMMIT}, plugin contract {})", contracts()));

/// `inlet --version`: the line, then what a platform team checks before an upgrade.
pub static LONG: LazyLock<String> = LazyLock::new(|| {
    let schemas = schemas().iter().map(|(store, newest)| format!("{store} 1–{newest}")).collect::<Vec<_>>().join(", ");
    format!(
        "{VERSION}\n\
         commit:           {COMMIT}\n\
         plugin contracts: {}\n\
         inbox schema:     {schemas} (migrates a database from any of them to the newest; runs on the newest, \
         and on a newer one only where its migrations say so: `inlet schema status`)",
        contracts()
    )
});
