//! `inlet inbox backup`: an online, consistent copy of a SQLite inbox.
//!
//! A SQLite inbox runs in WAL mode: committed rows may live in `FILE-wal` for a while,
//! so copying `FILE` by hand (even with the `-wal` beside it, taken a moment later)
//! can give a copy that lacks acked rows or is corrupt. `VACUUM INTO` reads the
//! database in one read transaction, which in WAL mode blocks no writer, and writes
//! what that snapshot holds into a new file: every row committed before the backup
//! began, and nothing half-written. Inlet keeps taking pushes meanwhile.
//!
//! The copy is written beside the destination (`FILE.partial`), checked (SQLite's
//! `quick_check`, the entries counted), switched to the rollback journal so it is one
//! self-contained file, flushed to disk (SQLite does not sync what `VACUUM INTO`
//! writes), and only then renamed to its name: a file under the name asked for is a
//! whole backup. The name is claimed first, with an exclusive create, so an existing
//! file is never overwritten, not even by a backup racing this one; an empty file
//! under that name is a backup that was interrupted.
//!
//! PostgreSQL has its own tools for this (`pg_dump`, base backups with WAL
//! archiving); a backup of it is refused with a pointer to them.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use sqlx::Connection as _;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteJournalMode};

use crate::clock::Millis;

/// A backup that was written.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Backup {
    /// The inbox file that was copied.
    pub source: PathBuf,
    /// The backup file.
    pub file: PathBuf,
    /// Entries (rows of `inbox_entry`) in the backup.
    pub entries: i64,
    /// The backup's size in bytes.
    pub bytes: u64,
    /// When the copy's snapshot began (ms since the epoch): the backup holds every
    /// entry committed, and so every message acked, before this time. Restoring it
    /// loses what was acked after, unless the broker delivers that again (RUNBOOK.md,
    /// "Backups and restore").
    pub consistent_at: Millis,
}

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error(
        "`inlet inbox backup` copies a SQLite inbox; this inbox is on PostgreSQL ({url}): \
         back it up with pg_dump, or with base backups and WAL archiving \
         (RUNBOOK.md, \"Backups and restore\")"
    )]
    Postgres { url: String },
    #[error("store url `{url}` is neither sqlite:// nor postgres://")]
    UnsupportedUrl { url: String },
    #[error("no SQLite inbox at {}: nothing to back up", path.display())]
    NoInbox { path: PathBuf },
    #[error("{} exists; a backup never overwrites a file: name a new one", path.display())]
    Exists { path: PathBuf },
    #[error("the backup file name {} is not UTF-8, which SQLite needs", path.display())]
    NotUtf8 { path: PathBuf },
    // `error`, not `source`: the message quotes it, so a chain printer must not
    // print it again.
    #[error("cannot write the backup {}: {error}", path.display())]
    Io { path: PathBuf, error: std::io::Error },
    #[error("the backup of {} failed: {error}", from.display())]
    Database { from: PathBuf, error: sqlx::Error },
    #[error("the copy {} fails SQLite's quick_check: {problem}", path.display())]
    Damaged { path: PathBuf, problem: String },
}

/// Copies the inbox at `url` (a SQLite URL, as `[store] url` resolves it) into a new
/// file `dest`, while Inlet may be running on it.
pub async fn backup(url: &str, dest: &Path) -> Result<Backup, BackupError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Err(BackupError::Postgres { url: crate::redact::url(url) });
    }
    if !url.starts_with("sqlite:") {
        return Err(BackupError::UnsupportedUrl { url: crate::redact::url(url) });
    }
    let options = super::sqlite::connect_options(url)
        .map_err(|error| BackupError::Database { from: PathBuf::from(url), error })?
        .create_if_missing(false);
    let source = options.get_filename().to_path_buf();
    if !source.is_file() {
        return Err(BackupError::NoInbox { path: source });
    }
    let dest = absolute(dest)?;
    let partial = partial_name(&dest);
    // Claim the name: from here on it is ours to fill (or to remove on failure).
    create_new(&dest)?;
    // `VACUUM INTO` writes into a file that does not exist or is empty: created here
    // exclusively, so a stray file of that name is refused, not overwritten.
    if let Err(e) = create_new(&partial) {
        let _ = std::fs::remove_file(&dest);
        return Err(e);
    }
    let result = copy_checked(options, &source, &dest, &partial).await;
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
        let _ = std::fs::remove_file(&dest);
    }
    result
}

/// The copy into `partial` (created empty), checked and synced, renamed over the
/// claimed `dest`.
async fn copy_checked(
    options: SqliteConnectOptions,
    source: &Path,
    dest: &Path,
    partial: &Path,
) -> Result<Backup, BackupError> {
    let db_error = |error| BackupError::Database { from: source.to_path_buf(), error };
    let into = partial.to_str().ok_or_else(|| BackupError::NotUtf8 { path: dest.to_path_buf() })?;
    let mut conn = SqliteConnection::connect_with(&options).await.map_err(db_error)?;
    let consistent_at = now_ms();
    sqlx::query("VACUUM INTO ?").bind(into).execute(&mut conn).await.map_err(db_error)?;
    conn.close().await.map_err(db_error)?;

    let copy_options =
        SqliteConnectOptions::new().filename(partial).create_if_missing(false).journal_mode(SqliteJournalMode::Delete);
    let copy_error = |error| BackupError::Database { from: partial.to_path_buf(), error };
    let mut copy = SqliteConnection::connect_with(&copy_options).await.map_err(copy_error)?;
    let check: Vec<String> = sqlx::query_scalar("PRAGMA quick_check").fetch_all(&mut copy).await.map_err(copy_error)?;
    if check != ["ok"] {
        return Err(BackupError::Damaged { path: partial.to_path_buf(), problem: check.join("; ") });
    }
    let entries: i64 =
        sqlx::query_scalar("SELECT count(*) FROM inbox_entry").fetch_one(&mut copy).await.map_err(copy_error)?;
    copy.close().await.map_err(copy_error)?;

    let io = |error| BackupError::Io { path: dest.to_path_buf(), error };
    std::fs::File::open(partial).and_then(|f| f.sync_all()).map_err(io)?;
    std::fs::rename(partial, dest).map_err(io)?;
    if let Some(dir) = dest.parent() {
        // The rename is durable once the folder is.
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
    }
    let bytes = std::fs::metadata(dest).map_err(io)?.len();
    Ok(Backup { source: source.to_path_buf(), file: dest.to_path_buf(), entries, bytes, consistent_at })
}

/// Creates `path` empty, failing if anything is there already.
fn create_new(path: &Path) -> Result<(), BackupError> {
    match std::fs::OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Err(BackupError::Exists { path: path.to_path_buf() }),
        Err(error) => Err(BackupError::Io { path: path.to_path_buf(), error }),
    }
}

/// `dest` from the root, so SQLite never reads it as a `file:` URI or relative to
/// anything but the caller's folder.
fn absolute(dest: &Path) -> Result<PathBuf, BackupError> {
    std::path::absolute(dest).map_err(|error| BackupError::Io { path: dest.to_path_buf(), error })
}

/// Where the copy is written before it gets its name: beside it, so the rename stays
/// within one file system.
fn partial_name(dest: &Path) -> PathBuf {
    let mut name = dest.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    dest.with_file_name(name)
}

fn now_ms() -> Millis {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as Millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn refuses_postgres_and_a_file_that_exists_and_a_missing_inbox() {
        let dir = tempfile::tempdir().unwrap();
        let pg = backup("postgres://u:secret@db/inlet", &dir.path().join("b.db")).await.unwrap_err();
        assert!(matches!(pg, BackupError::Postgres { .. }), "{pg}");
        assert!(pg.to_string().contains("pg_dump") && !pg.to_string().contains("secret"), "{pg}");

        let missing = format!("sqlite://{}", dir.path().join("none.db").display());
        let err = backup(&missing, &dir.path().join("b.db")).await.unwrap_err();
        assert!(matches!(err, BackupError::NoInbox { .. }), "{err}");
        assert!(!dir.path().join("none.db").exists(), "a backup creates no inbox");
        assert!(!dir.path().join("b.db").exists(), "nor a backup file");

        let url = format!("sqlite://{}", dir.path().join("inbox.db").display());
        drop(super::super::open(&url, 1).await.unwrap());
        std::fs::write(dir.path().join("taken.db"), b"keep me").unwrap();
        let err = backup(&url, &dir.path().join("taken.db")).await.unwrap_err();
        assert!(matches!(err, BackupError::Exists { .. }), "{err}");
        assert_eq!(std::fs::read(dir.path().join("taken.db")).unwrap(), b"keep me", "left as it was");
    }
}
