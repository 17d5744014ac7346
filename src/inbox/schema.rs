//! The inbox schema as a versioned, recorded thing: the migrations this binary
//! embeds, what a database records about the ones applied to it (`inlet_schema`: the
//! version, when, by which binary, the SHA-256 of its SQL), and how the two compare.
//!
//! Migrating is an explicit step. `inlet migrate` applies what is pending;
//! `inlet run --migrate auto` (the default) does the same at start; `--migrate check`
//! and every other command that opens the inbox only compare, and refuse an older
//! schema instead of changing it. A schema newer than this binary knows is refused by
//! everyone, unless each newer migration declares that this binary's schema may run on
//! it ([`Migration::compatible_from`]): the expand half of expand-then-contract, see
//! UPGRADING.md.
//!
//! On PostgreSQL a run holds an advisory lock (instances starting together migrate
//! once) and a `lock_timeout`, so a migration that meets a table held by someone else
//! fails within it instead of queueing every later query on that table behind itself.
//! The migrations of a run apply in one transaction, all or none, except one declared
//! [`Migration::outside_transaction`] (an index built `CONCURRENTLY`): the migrations
//! before it commit first, it runs alone, statement by statement, each committed on its
//! own, and is recorded after its last; the ones after it apply in a transaction again.

use std::fmt;
use std::time::Duration;

use super::{Store, StoreError};

/// The binary that applies a migration, as `inlet_schema` records it.
pub const BINARY: &str = concat!("inlet ", env!("CARGO_PKG_VERSION"));

/// How long a PostgreSQL migration waits for a lock before it gives up (`--lock-timeout`).
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// One migration embedded in the binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    pub version: i64,
    /// What it is about (its file name without backend and number).
    pub name: &'static str,
    pub sql: &'static str,
    /// The oldest schema version a binary may know and still run on a database this
    /// migration was applied to: its own version (a binary must know it), or an older
    /// one for a migration that only adds what older binaries ignore (expand).
    pub compatible_from: i64,
    /// Runs outside a transaction, statement by statement (PostgreSQL; see
    /// [`Migration::outside_transaction`]).
    pub outside_transaction: bool,
}

impl Migration {
    /// A migration only binaries that know it may run on.
    pub const fn new(version: i64, name: &'static str, sql: &'static str) -> Migration {
        Migration { version, name, sql, compatible_from: version, outside_transaction: false }
    }

    /// Declares that binaries knowing schema `version` (older than this one) run on it
    /// too: for a migration that only adds (UPGRADING.md, expand then contract).
    pub const fn compatible_from(self, version: i64) -> Migration {
        Migration { compatible_from: version, ..self }
    }

    /// Declares that it runs outside a transaction, for what PostgreSQL refuses to run
    /// inside one: `CREATE INDEX CONCURRENTLY`, which builds an index while the table
    /// takes writes. The migrations before it commit first; it runs alone, each
    /// statement committed on its own, and is recorded after its last. A failure leaves
    /// what its finished statements did, so each statement must be one that running
    /// again completes (`DROP INDEX CONCURRENTLY IF EXISTS x` before
    /// `CREATE INDEX CONCURRENTLY x`, which a failed build leaves INVALID): the lint in
    /// `inbox/lint.rs` holds it to that. PostgreSQL only: SQLite runs every migration of
    /// a run in its one transaction, and the lint refuses this on SQLite's list.
    pub const fn outside_transaction(self) -> Migration {
        Migration { outside_transaction: true, ..self }
    }

    /// The SHA-256 of its SQL, as recorded when it is applied.
    pub fn checksum(&self) -> String {
        super::digest_hex(self.sql.as_bytes())
    }
}

/// The migrations this binary embeds for the store a URL names (`None`: not a store
/// URL), oldest first.
pub fn known(url: &str) -> Option<&'static [Migration]> {
    if url.starts_with("sqlite:") {
        Some(super::sqlite::MIGRATIONS)
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Some(super::postgres::MIGRATIONS)
    } else {
        None
    }
}

/// The columns of `inlet_schema` besides `version` and `applied_at`, which Inlet
/// before 0.1's explicit migrations did not record; added by the next migrate.
pub(crate) const RECORD_COLUMNS: [(&str, &str); 3] =
    [("binary_version", "TEXT"), ("checksum", "TEXT"), ("compatible_from", "BIGINT")];

/// `inlet_schema` as first created; [`RECORD_COLUMNS`] are added to it, on a fresh
/// database too, so every database ends with the same table whatever its history.
pub(crate) const CREATE_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS inlet_schema (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)";

/// What a database records about its schema.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SchemaRecord {
    pub table: RecordTable,
    /// Applied migrations, oldest first.
    pub applied: Vec<Applied>,
}

/// The state of `inlet_schema` itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordTable {
    /// No `inlet_schema`: nothing was ever applied.
    Missing,
    /// Versions only: written by an Inlet that did not record binaries and checksums
    /// (the next `inlet migrate` adds the columns; earlier rows stay without them).
    VersionsOnly,
    Complete,
}

/// One applied migration, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Applied {
    pub version: i64,
    pub applied_at: i64,
    /// `None`: applied before Inlet recorded it.
    pub binary_version: Option<String>,
    pub checksum: Option<String>,
    pub compatible_from: Option<i64>,
}

impl SchemaRecord {
    /// The schema version: the newest applied migration, 0 for none.
    pub fn version(&self) -> i64 {
        self.applied.iter().map(|a| a.version).max().unwrap_or(0)
    }
}

/// A recorded checksum that is not the one of this binary's migration of that version.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Mismatch {
    pub version: i64,
    pub recorded: String,
    pub expected: String,
}

/// How a recorded schema stands to the migrations a binary knows.
#[derive(Debug, Clone, Copy)]
pub struct Comparison<'a> {
    pub known: &'a [Migration],
    pub record: &'a SchemaRecord,
}

impl Comparison<'_> {
    /// The newest version this binary knows.
    pub fn latest(&self) -> i64 {
        self.known.iter().map(|m| m.version).max().unwrap_or(0)
    }

    /// This binary's migrations the database has not had, oldest first.
    pub fn pending(&self) -> Vec<&Migration> {
        let current = self.record.version();
        self.known.iter().filter(|m| m.version > current).collect()
    }

    /// Recorded checksums that differ from this binary's SQL of the same version. A
    /// version recorded without a checksum (by an earlier Inlet) is not one.
    pub fn mismatches(&self) -> Vec<Mismatch> {
        self.record
            .applied
            .iter()
            .filter_map(|a| {
                let known = self.known.iter().find(|m| m.version == a.version)?;
                let recorded = a.checksum.as_ref()?;
                let expected = known.checksum();
                (*recorded != expected).then(|| Mismatch { version: a.version, recorded: recorded.clone(), expected })
            })
            .collect()
    }

    /// Refuses a schema newer than this binary knows, unless every newer migration
    /// declared this binary's schema compatible (one recorded without a declaration is
    /// taken as needing a binary that knows it).
    pub fn refuse_newer(&self) -> Result<(), SchemaError> {
        let (found, latest) = (self.record.version(), self.latest());
        if found <= latest {
            return Ok(());
        }
        let compatible = self
            .record
            .applied
            .iter()
            .filter(|a| a.version > latest)
            .all(|a| a.compatible_from.unwrap_or(a.version) <= latest);
        if compatible { Ok(()) } else { Err(SchemaError::Newer { found, latest }) }
    }

    /// Refuses a schema older than this binary's (`inlet migrate` would change it).
    pub fn refuse_older(&self) -> Result<(), SchemaError> {
        let pending: Vec<i64> = self.pending().iter().map(|m| m.version).collect();
        if pending.is_empty() {
            return Ok(());
        }
        Err(SchemaError::Older { found: self.record.version(), latest: self.latest(), pending })
    }

    /// Refuses to migrate on top of SQL other than this binary's.
    pub fn refuse_mismatches(&self) -> Result<(), SchemaError> {
        let mismatches = self.mismatches();
        if mismatches.is_empty() { Ok(()) } else { Err(SchemaError::ChecksumMismatch(mismatches)) }
    }
}

/// What opening the inbox does about its schema (`inlet run --migrate`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum MigrateMode {
    /// Apply pending migrations, then run (creates a missing SQLite file).
    #[default]
    Auto,
    /// Run only on a schema that is exactly this binary's (or newer and declared
    /// compatible); change nothing.
    Check,
    /// Neither migrate nor check, except that a newer schema is still refused.
    Off,
}

/// Why the schema stops a command.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("{}", older(*found, *latest, pending))]
    Older { found: i64, latest: i64, pending: Vec<i64> },
    #[error(
        "the inbox schema is at version {found}, newer than this binary ({BINARY}) knows (up to version {latest}): \
         run an Inlet that knows version {found}"
    )]
    Newer { found: i64, latest: i64 },
    #[error("{}", mismatched(.0))]
    ChecksumMismatch(Vec<Mismatch>),
    #[error(
        "inbox schema migration {step} could not take its locks within the lock timeout ({}): another session \
         holds a lock on a table it changes (see pg_locks){}; {}. Try again once it is released, or raise \
         --lock-timeout",
        humantime::format_duration(*timeout),
        if step.outside_transaction() {
            ", or a transaction older than its concurrent build still runs (see pg_stat_activity)"
        } else {
            ""
        },
        left(step, *kept)
    )]
    LockTimeout { step: Step, timeout: Duration, kept: Kept },
    #[error("inbox schema migration {step} failed, {}: {error}", left(step, *kept))]
    Failed { step: Step, error: sqlx::Error, kept: Kept },
}

/// What a failed migration run leaves applied besides the step that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// Nothing: everything of the run before the failure was in the transaction that
    /// rolled back.
    Nothing,
    /// The versions committed before a migration that runs outside a transaction, up
    /// to this one.
    UpTo(i64),
}

/// What a failed run left, for its error.
fn left(step: &Step, kept: Kept) -> String {
    let before = match kept {
        Kept::Nothing => None,
        Kept::UpTo(version) => {
            Some(format!("the versions before it were applied and stay (the schema is at version {version})"))
        }
    };
    match (step.outside_transaction(), before) {
        (false, None) => "nothing was applied".to_string(),
        (false, Some(before)) => format!("it was not applied; {before}"),
        (true, before) => format!(
            "it runs outside a transaction, so what its statements did before the failure stays (an index a \
             concurrent build left INVALID among it), and it is not recorded; each of its statements completes \
             what an earlier try left, so run `inlet migrate` again{}",
            before.map(|b| format!("; {b}")).unwrap_or_default()
        ),
    }
}

fn older(found: i64, latest: i64, pending: &[i64]) -> String {
    let pending: Vec<String> = pending.iter().map(i64::to_string).collect();
    let state = if found == 0 {
        "the inbox has no schema yet".to_string()
    } else {
        format!("the inbox schema is at version {found}")
    };
    format!(
        "{state}, this binary ({BINARY}) needs version {latest}: run `inlet migrate` first (pending: {}); \
         nothing was changed",
        pending.join(", ")
    )
}

fn mismatched(mismatches: &[Mismatch]) -> String {
    let each: Vec<String> = mismatches
        .iter()
        .map(|m| {
            format!(
                "version {} (recorded sha256 {}, this binary's {})",
                m.version,
                short(&m.recorded),
                short(&m.expected)
            )
        })
        .collect();
    format!(
        "the inbox schema was migrated with SQL other than this binary's for {}: refusing to migrate on top of it \
         (`inlet schema status` shows every version)",
        each.join(", ")
    )
}

/// The first 12 hex digits of a checksum, for people.
pub fn short(checksum: &str) -> &str {
    &checksum[..checksum.len().min(12)]
}

/// Which part of a migration run an error belongs to.
#[derive(Debug, Clone)]
pub enum Step {
    /// Creating or completing `inlet_schema`.
    Record,
    Version {
        version: i64,
        name: &'static str,
        /// Run outside a transaction, statement by statement.
        outside_transaction: bool,
    },
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Record => f.write_str("of the schema table inlet_schema"),
            Step::Version { version, name, .. } => write!(f, "{version} ({name})"),
        }
    }
}

impl Step {
    fn outside_transaction(&self) -> bool {
        matches!(self, Step::Version { outside_transaction: true, .. })
    }

    /// The error of a statement of this step: a lock not granted within the lock
    /// timeout (SQLSTATE 55P03, lock_not_available) is told apart; an outage stays an
    /// outage.
    pub(crate) fn failed(self, lock_timeout: Duration, kept: Kept, error: sqlx::Error) -> StoreError {
        match &error {
            sqlx::Error::Database(db) if db.code().as_deref() == Some("55P03") => {
                SchemaError::LockTimeout { step: self, timeout: lock_timeout, kept }.into()
            }
            _ if super::is_unavailable(&error) => StoreError::Unavailable(error),
            _ => SchemaError::Failed { step: self, error, kept }.into(),
        }
    }
}

/// Compares the schema with this binary's and acts as `mode` says: `Auto` migrates
/// what is pending (refusing a schema migrated with other SQL), `Check` refuses an
/// older schema, `Off` warns about one. A newer schema is refused in every mode.
pub async fn prepare(store: &dyn Store, mode: MigrateMode, lock_timeout: Duration) -> Result<(), StoreError> {
    let record = store.schema_record().await?;
    let cmp = Comparison { known: store.migrations(), record: &record };
    cmp.refuse_newer()?;
    if record.version() > cmp.latest() {
        tracing::warn!(
            schema = record.version(),
            binary = cmp.latest(),
            "the inbox schema is newer than this binary knows; its newer migrations declare this binary compatible"
        );
    }
    match mode {
        MigrateMode::Auto => {
            cmp.refuse_mismatches()?;
            // Nothing is written (no lock taken) when there is nothing to do.
            if !cmp.pending().is_empty() || record.table != RecordTable::Complete {
                let applied = store.migrate(lock_timeout).await?;
                if !applied.is_empty() {
                    let versions: Vec<i64> = applied.iter().map(|m| m.version).collect();
                    tracing::info!(?versions, backend = store.backend(), "applied inbox schema migrations");
                }
            }
        }
        MigrateMode::Check => {
            cmp.refuse_older()?;
            warn_mismatches(&cmp);
        }
        MigrateMode::Off => {
            if let Err(older) = cmp.refuse_older() {
                tracing::warn!(%older, "--migrate off: starting on an older inbox schema");
            }
            warn_mismatches(&cmp);
        }
    }
    Ok(())
}

fn warn_mismatches(cmp: &Comparison<'_>) {
    for m in cmp.mismatches() {
        tracing::warn!(
            version = m.version,
            recorded = short(&m.recorded),
            binary = short(&m.expected),
            "inbox schema version was applied from SQL other than this binary's (`inlet schema status`)"
        );
    }
}

/// Creates the schema as an Inlet from before recorded migrations would have left it at
/// `version`: `inlet_schema` with versions only, and the embedded migrations `1..=version`
/// applied, each in a transaction of its own or, declared so, outside one. For upgrade
/// tests.
#[doc(hidden)]
pub async fn create_as_of(url: &str, version: i64) -> Result<(), StoreError> {
    use sqlx::Connection as _;
    let known = known(url).ok_or_else(|| StoreError::UnsupportedUrl(crate::redact::url(url)))?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    macro_rules! apply {
        ($conn:expr) => {{
            let mut conn = $conn;
            sqlx::query(CREATE_TABLE).execute(&mut conn).await?;
            let record = "INSERT INTO inlet_schema (version, applied_at) VALUES ($1, $2)";
            for m in known.iter().filter(|m| m.version <= version) {
                if m.outside_transaction && url.starts_with("postgres") {
                    for statement in super::sql_text::statements(m.sql) {
                        sqlx::raw_sql(statement.text).execute(&mut conn).await?;
                    }
                    sqlx::query(record).bind(m.version).bind(now).execute(&mut conn).await?;
                } else {
                    let mut tx = conn.begin().await?;
                    sqlx::raw_sql(m.sql).execute(&mut *tx).await?;
                    sqlx::query(record).bind(m.version).bind(now).execute(&mut *tx).await?;
                    tx.commit().await?;
                }
            }
            conn.close().await?;
        }};
    }
    if url.starts_with("sqlite:") {
        apply!(sqlx::SqliteConnection::connect_with(&super::sqlite::connect_options(url)?).await?);
    } else {
        apply!(sqlx::PgConnection::connect(url).await?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(version: i64, checksum: Option<&str>, compatible_from: Option<i64>) -> Applied {
        Applied {
            version,
            applied_at: 0,
            binary_version: None,
            checksum: checksum.map(str::to_string),
            compatible_from,
        }
    }

    const KNOWN: &[Migration] = &[Migration::new(1, "one", "SELECT 1"), Migration::new(2, "two", "SELECT 2")];

    fn record(applied: Vec<Applied>) -> SchemaRecord {
        SchemaRecord { table: RecordTable::Complete, applied }
    }

    #[test]
    fn older_schemas_name_what_is_pending_and_newer_ones_both_versions() {
        let r = record(vec![applied(1, None, None)]);
        let cmp = Comparison { known: KNOWN, record: &r };
        let older = cmp.refuse_older().unwrap_err().to_string();
        assert!(older.contains("at version 1") && older.contains("needs version 2"), "{older}");
        assert!(older.contains("`inlet migrate`") && older.contains("pending: 2"), "{older}");
        assert!(cmp.refuse_newer().is_ok());

        let r = record(vec![applied(1, None, None), applied(2, None, None), applied(3, None, None)]);
        let cmp = Comparison { known: KNOWN, record: &r };
        let newer = cmp.refuse_newer().unwrap_err().to_string();
        assert!(newer.contains("at version 3") && newer.contains("up to version 2"), "{newer}");
        assert!(cmp.pending().is_empty());
    }

    #[test]
    fn a_newer_schema_runs_only_where_every_newer_migration_declares_this_one_compatible() {
        let with = |compat: Vec<Option<i64>>| {
            let mut applied_ = vec![applied(1, None, None), applied(2, None, None)];
            applied_.extend(compat.into_iter().enumerate().map(|(i, c)| applied(3 + i as i64, None, c)));
            record(applied_)
        };
        let ok = with(vec![Some(2)]);
        assert!(Comparison { known: KNOWN, record: &ok }.refuse_newer().is_ok());
        let two_ahead = with(vec![Some(2), Some(3)]);
        assert!(Comparison { known: KNOWN, record: &two_ahead }.refuse_newer().is_err());
        let undeclared = with(vec![None]);
        assert!(Comparison { known: KNOWN, record: &undeclared }.refuse_newer().is_err());
    }

    #[test]
    fn a_checksum_other_than_the_binarys_is_a_mismatch_and_a_missing_one_is_not() {
        let good = KNOWN[0].checksum();
        let r = record(vec![applied(1, Some(&good), None), applied(2, None, None)]);
        assert!(Comparison { known: KNOWN, record: &r }.mismatches().is_empty());
        let r = record(vec![applied(1, Some(&good), None), applied(2, Some("00ff"), None)]);
        let m = Comparison { known: KNOWN, record: &r }.mismatches();
        assert_eq!(m.len(), 1);
        assert_eq!((m[0].version, m[0].recorded.as_str()), (2, "00ff"));
        let refused = Comparison { known: KNOWN, record: &r }.refuse_mismatches().unwrap_err().to_string();
        assert!(refused.contains("version 2 (recorded sha256 00ff"), "{refused}");
    }
}
