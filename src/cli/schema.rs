//! `inlet migrate` and `inlet schema status`: the inbox schema as an explicit step —
//! the command line's side of [`crate::inbox::schema`].

use std::process::ExitCode;
use std::time::Duration;

use super::{Output, view};
use crate::inbox::schema::{self, Comparison, Migration, RecordTable, SchemaRecord};
use crate::inbox::{self, InstanceLock, StoreError};

/// One migration as `inlet migrate` reports it.
#[derive(Debug, serde::Serialize)]
struct Step {
    version: i64,
    name: &'static str,
    checksum: String,
    /// Runs outside a transaction, statement by statement (PostgreSQL).
    outside_transaction: bool,
    /// The SQL (`--dry-run` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    sql: Option<&'static str>,
}

impl Step {
    fn of(m: &Migration, with_sql: bool) -> Step {
        Step {
            version: m.version,
            name: m.name,
            checksum: m.checksum(),
            outside_transaction: m.outside_transaction,
            sql: with_sql.then_some(m.sql),
        }
    }
}

/// A pending migration as `inlet migrate --dry-run` heads its SQL: which, its checksum,
/// and how it runs when that is not in the run's transaction.
fn heading(m: &Migration) -> String {
    let mut line = format!("-- version {} ({}), sha256 {}", m.version, m.name, m.checksum());
    if m.outside_transaction {
        line.push_str(
            "\n-- runs outside a transaction: the versions before it commit first, then each statement below \
             commits on its own, and the version is recorded after the last",
        );
    }
    line
}

/// `inlet migrate --json`.
#[derive(Debug, serde::Serialize)]
struct Migrated {
    dry_run: bool,
    /// The schema version before.
    from: i64,
    /// The schema version after (`--dry-run`: what it would be).
    to: i64,
    /// The migrations applied (`--dry-run`: that would be, with their SQL).
    applied: Vec<Step>,
}

/// `inlet migrate [--dry-run]`: applies what is pending under the SQLite inbox's
/// instance lock (so never beside a running instance); a dry run only reads, creates
/// nothing and takes no lock.
pub(super) async fn migrate(url: &str, dry_run: bool, lock_timeout: Duration, out: Output) -> anyhow::Result<ExitCode> {
    let known = schema::known(url).ok_or_else(|| StoreError::UnsupportedUrl(crate::redact::url(url)))?;
    if dry_run {
        let (record, missing) = match inbox::connect(url, 1, false).await {
            Ok(store) => (store.schema_record().await?, None),
            Err(StoreError::NoInbox(path)) => {
                (SchemaRecord { table: RecordTable::Missing, applied: Vec::new() }, Some(path))
            }
            Err(e) => return Err(e.into()),
        };
        let cmp = Comparison { known, record: &record };
        cmp.refuse_newer()?;
        cmp.refuse_mismatches()?;
        let pending = cmp.pending();
        let answer = Migrated {
            dry_run: true,
            from: record.version(),
            to: record.version().max(cmp.latest()),
            applied: pending.iter().map(|m| Step::of(m, true)).collect(),
        };
        out.show(&answer, || {
            if let Some(path) = &missing {
                println!("-- no inbox at {} yet: `inlet migrate` creates it", path.display());
            }
            if pending.is_empty() {
                println!("-- nothing to apply: the inbox schema is at version {}", record.version());
            }
            for m in &pending {
                println!("{}", heading(m));
                println!("{}", m.sql.trim_end());
                println!();
            }
            if !pending.is_empty() {
                println!("-- would take the inbox schema from version {} to {}", answer.from, answer.to);
            }
        })?;
        return Ok(ExitCode::SUCCESS);
    }
    let _held = InstanceLock::take(url, true)?;
    let store = inbox::connect(url, 2, true).await?;
    let from = store.schema_record().await?.version();
    let applied = store.migrate(lock_timeout).await?;
    let to = store.schema_record().await?.version();
    let answer = Migrated { dry_run: false, from, to, applied: applied.iter().map(|m| Step::of(m, false)).collect() };
    out.show(&answer, || {
        for m in &applied {
            println!("applied {} ({}), sha256 {}", m.version, m.name, schema::short(&m.checksum()));
        }
        let latest = known.iter().map(|m| m.version).max().unwrap_or(0);
        match (applied.is_empty(), to > latest) {
            (_, true) => println!(
                "nothing to apply: the inbox schema is at version {to}, newer than this binary's {latest}, which its \
                 newer migrations declare compatible"
            ),
            (true, false) => println!("nothing to apply: the inbox schema is at version {to}, this binary's"),
            (false, false) => println!("the inbox schema is at version {to} (was {from})"),
        }
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `inlet schema status --json`.
#[derive(Debug, serde::Serialize)]
struct Status {
    store: String,
    /// The schema version (0: none).
    version: i64,
    /// This binary, and the versions it knows.
    binary: &'static str,
    known: Vec<i64>,
    pending: Vec<i64>,
    /// Whether `inlet_schema` records binaries and checksums (`versions_only`: an
    /// earlier Inlet's table; the next `inlet migrate` completes it).
    record: RecordTable,
    /// Whether this binary runs on the schema as it is (`inlet run --migrate check`).
    current: bool,
    /// Why not, if not.
    #[serde(skip_serializing_if = "Option::is_none")]
    problem: Option<String>,
    versions: Vec<Version>,
}

/// One version, applied or known.
#[derive(Debug, serde::Serialize)]
struct Version {
    version: i64,
    /// `None`: a version this binary does not know.
    name: Option<&'static str>,
    /// `applied`, or `pending`.
    state: &'static str,
    applied_at: Option<i64>,
    applied_by: Option<String>,
    checksum: Option<String>,
    /// This binary's checksum of the version's SQL.
    expected_checksum: Option<String>,
    /// `matches`, `differs`, `not_recorded` (applied before Inlet recorded it), or
    /// `unknown` (a version this binary does not know, or not applied).
    checksum_state: &'static str,
}

/// `inlet schema status`: exit 0 when this binary runs on the schema as it is (exactly
/// its version, or newer and declared compatible, with no checksum differing), 1
/// otherwise.
pub(super) async fn status(url: &str, out: Output) -> anyhow::Result<ExitCode> {
    let store = inbox::connect(url, 1, false).await?;
    let record = store.schema_record().await?;
    let known = store.migrations();
    let cmp = Comparison { known, record: &record };
    let problem = cmp
        .refuse_newer()
        .and_then(|()| cmp.refuse_older())
        .and_then(|()| cmp.refuse_mismatches())
        .err()
        .map(|e| e.to_string());
    let mut versions: Vec<Version> = record
        .applied
        .iter()
        .map(|a| {
            let m = known.iter().find(|m| m.version == a.version);
            let expected = m.map(Migration::checksum);
            let checksum_state = match (&a.checksum, &expected) {
                (None, _) => "not_recorded",
                (Some(_), None) => "unknown",
                (Some(recorded), Some(expected)) if recorded == expected => "matches",
                (Some(_), Some(_)) => "differs",
            };
            Version {
                version: a.version,
                name: m.map(|m| m.name),
                state: "applied",
                applied_at: Some(a.applied_at),
                applied_by: a.binary_version.clone(),
                checksum: a.checksum.clone(),
                expected_checksum: expected,
                checksum_state,
            }
        })
        .collect();
    versions.extend(cmp.pending().into_iter().map(|m| Version {
        version: m.version,
        name: Some(m.name),
        state: "pending",
        applied_at: None,
        applied_by: None,
        checksum: None,
        expected_checksum: Some(m.checksum()),
        checksum_state: "unknown",
    }));
    let answer = Status {
        store: crate::redact::url(url),
        version: record.version(),
        binary: schema::BINARY,
        known: known.iter().map(|m| m.version).collect(),
        pending: cmp.pending().iter().map(|m| m.version).collect(),
        record: record.table,
        current: problem.is_none(),
        problem,
        versions,
    };
    out.show(&answer, || print_status(&answer))?;
    Ok(if answer.current { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn print_status(s: &Status) {
    let range = match (s.known.first(), s.known.last()) {
        (Some(first), Some(last)) => format!("{first}–{last}"),
        _ => "none".into(),
    };
    let pending: Vec<String> = s.pending.iter().map(i64::to_string).collect();
    println!("inbox: {}", s.store);
    println!(
        "schema version {}; this binary ({}) knows {range}; pending: {}",
        s.version,
        s.binary,
        if pending.is_empty() { "none".to_string() } else { pending.join(", ") }
    );
    if s.record == RecordTable::VersionsOnly {
        println!(
            "(recorded by an earlier Inlet without binaries and checksums; `inlet migrate` records them from now on)"
        );
    }
    println!("{:>7}  {:<18}  {:<8}  {:<24}  {:<14}  CHECKSUM (sha256)", "VERSION", "NAME", "STATE", "APPLIED", "BY");
    for v in &s.versions {
        let checksum = match (v.checksum_state, &v.checksum, &v.expected_checksum) {
            ("matches", Some(c), _) => format!("{} matches", schema::short(c)),
            ("differs", Some(c), Some(e)) => {
                format!("{} DIFFERS from this binary's {}", schema::short(c), schema::short(e))
            }
            ("not_recorded", ..) => "not recorded".into(),
            (_, Some(c), None) => format!("{} (version unknown to this binary)", schema::short(c)),
            (_, None, Some(e)) => format!("{} (this binary's)", schema::short(e)),
            _ => "-".into(),
        };
        println!(
            "{:>7}  {:<18}  {:<8}  {:<24}  {:<14}  {checksum}",
            v.version,
            v.name.unwrap_or("(unknown)"),
            v.state,
            v.applied_at.map_or_else(|| "-".into(), view::date),
            v.applied_by.as_deref().unwrap_or(if v.state == "applied" { "not recorded" } else { "-" }),
        );
    }
    if let Some(problem) = &s.problem {
        println!("{problem}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dry_run_says_which_migrations_run_outside_a_transaction() {
        let inside = Migration::new(10, "probe", "CREATE TABLE extra (id BIGINT);");
        assert_eq!(heading(&inside), format!("-- version 10 (probe), sha256 {}", inside.checksum()));
        let outside = Migration::new(
            11,
            "received",
            "DROP INDEX CONCURRENTLY IF EXISTS x;\nCREATE INDEX CONCURRENTLY x ON inbox_entry (received_at);",
        )
        .outside_transaction();
        let said = heading(&outside);
        assert!(said.starts_with(&format!("-- version 11 (received), sha256 {}\n", outside.checksum())), "{said}");
        assert!(said.contains("-- runs outside a transaction: the versions before it commit first"), "{said}");
        let json = serde_json::to_value(Step::of(&outside, true)).unwrap();
        assert_eq!(json["outside_transaction"], true);
        assert_eq!(serde_json::to_value(Step::of(&inside, false)).unwrap()["outside_transaction"], false);
    }
}
