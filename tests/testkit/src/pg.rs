//! PostgreSQL for tests: [`TestPg`], a fresh database per test on the local cluster,
//! dropped with the value; the cluster must be reachable, or the test fails loudly.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sqlx::Connection as _;

/// Admin connection used to create and drop the per-test databases. Trust auth as the
/// `postgres` superuser on the local cluster (see `scripts/ensure-postgres`).
pub const DEFAULT_PG_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// Prefix of every database made by [`TestPg`]; the full name is
/// `inlet_t_<pid>_<counter>_<random>`.
const TEST_DB_PREFIX: &str = "inlet_t_";

/// How long to wait for the admin connection before declaring PostgreSQL unreachable.
const PG_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The admin URL: `INLET_TEST_PG_ADMIN_URL` if set, else [`DEFAULT_PG_ADMIN_URL`].
pub fn pg_admin_url() -> String {
    std::env::var("INLET_TEST_PG_ADMIN_URL")
        .ok()
        .filter(|url| !url.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_PG_ADMIN_URL.to_owned())
}

/// A fresh, empty PostgreSQL database for one test, dropped (with `FORCE`) when this
/// value is dropped. Set `INLET_TEST_KEEP_DB=1` to keep it for inspection.
pub struct TestPg {
    /// Connection URL of the fresh database.
    pub url: String,
    name: String,
    admin_url: String,
}

impl TestPg {
    /// Creates a fresh database on the cluster named by [`pg_admin_url`].
    ///
    /// Panics with a loud message if PostgreSQL cannot be reached.
    pub async fn new() -> TestPg {
        Self::with_admin_url(&pg_admin_url()).await
    }

    /// Creates a fresh database through the given admin (superuser) URL.
    pub async fn with_admin_url(admin_url: &str) -> TestPg {
        let mut admin = connect_admin(admin_url).await;
        sweep_stale_databases(&mut admin).await;

        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "{TEST_DB_PREFIX}{}_{}_{:08x}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
            fastrand::u32(..)
        );
        let create = format!("CREATE DATABASE \"{name}\"");
        // Concurrent CREATE DATABASE can briefly collide on the template database
        // (SQLSTATE 55006, object_in_use): retry a few times.
        let mut tries = 0;
        let mut backoff = tokio::time::interval(Duration::from_millis(20));
        loop {
            match sqlx::raw_sql(&create).execute(&mut admin).await {
                Ok(_) => break,
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55006") && tries < 50 => {
                    tries += 1;
                    backoff.tick().await;
                }
                Err(e) => panic!("TestPg: cannot create database {name} via {admin_url}: {e}"),
            }
        }
        let _ = admin.close().await;

        let url = url_with_database(admin_url, &name);
        TestPg { url, name, admin_url: admin_url.to_owned() }
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Opens a plain connection to the test database.
    pub async fn connect(&self) -> sqlx::PgConnection {
        sqlx::PgConnection::connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("TestPg: cannot connect to {}: {e}", self.url))
    }
}

impl Drop for TestPg {
    fn drop(&mut self) {
        if std::env::var_os("INLET_TEST_KEEP_DB").is_some_and(|v| !v.is_empty() && v != "0") {
            eprintln!("TestPg: keeping database {} (INLET_TEST_KEEP_DB is set)", self.url);
            return;
        }
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        // Drop may run inside a tokio runtime (where block_on is forbidden) or outside
        // one: a thread with its own small runtime works in both cases.
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(async move {
                let mut admin = tokio::time::timeout(PG_CONNECT_TIMEOUT, sqlx::PgConnection::connect(&admin_url))
                    .await
                    .map_err(|_| std::io::Error::other("timed out connecting"))?
                    .map_err(std::io::Error::other)?;
                sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                    .execute(&mut admin)
                    .await
                    .map_err(std::io::Error::other)?;
                let _ = admin.close().await;
                Ok::<(), std::io::Error>(())
            })
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("TestPg: could not drop database {}: {e}", self.name),
            Err(_) => eprintln!("TestPg: dropping database {} panicked", self.name),
        }
    }
}

pub(crate) async fn connect_admin(admin_url: &str) -> sqlx::PgConnection {
    let unreachable = |why: String| -> ! {
        panic!(
            "\n\n*** PostgreSQL is NOT reachable at {admin_url}: {why}\n\
             *** The integration tests need a real PostgreSQL server (trust auth, superuser).\n\
             *** Start it with `scripts/ensure-postgres`, or point INLET_TEST_PG_ADMIN_URL\n\
             *** at a cluster you own. Tests are never skipped for a missing service.\n\n"
        )
    };
    match tokio::time::timeout(PG_CONNECT_TIMEOUT, sqlx::PgConnection::connect(admin_url)).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => unreachable(e.to_string()),
        Err(_) => unreachable(format!("no connection after {PG_CONNECT_TIMEOUT:?}")),
    }
}

/// Once per test process: drop databases left behind by test processes that no longer
/// exist (killed runs never reach `Drop`). No `FORCE`: a database still in use is kept.
async fn sweep_stale_databases(admin: &mut sqlx::PgConnection) {
    static SWEPT: AtomicBool = AtomicBool::new(false);
    if SWEPT.swap(true, Ordering::SeqCst) {
        return;
    }
    let names: Vec<String> =
        match sqlx::query_scalar("SELECT datname FROM pg_database WHERE datname LIKE 'inlet\\_t\\_%'")
            .fetch_all(&mut *admin)
            .await
        {
            Ok(names) => names,
            Err(_) => return,
        };
    for name in names {
        let Some(pid) = name
            .strip_prefix(TEST_DB_PREFIX)
            .and_then(|rest| rest.split('_').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let _ = sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS \"{name}\"")).execute(&mut *admin).await;
    }
}

/// Replaces the database in a `postgres://user@host:port/db?params` URL.
fn url_with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let authority_end = base[scheme_end..].find('/').map(|i| scheme_end + i).unwrap_or(base.len());
    let mut out = format!("{}/{database}", &base[..authority_end]);
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}

/// A PostgreSQL role for one test (roles belong to the cluster, not to a database),
/// dropped with what it was granted in the database at `db_url`. The test creates it.
pub struct TestRole {
    pub name: String,
    pub db_url: String,
}

impl TestRole {
    /// `url` (a test database's, as the superuser) for this role instead.
    pub fn url(&self, url: &str) -> String {
        let as_role = url.replacen("postgres://postgres@", &format!("postgres://{}@", self.name), 1);
        assert_ne!(as_role, url, "a URL of the superuser: {url}");
        as_role
    }
}

impl Drop for TestRole {
    fn drop(&mut self) {
        let (name, db_url) = (self.name.clone(), self.db_url.clone());
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let mut db = sqlx::PgConnection::connect(&db_url).await?;
                sqlx::raw_sql(&format!("DROP OWNED BY \"{name}\"")).execute(&mut db).await?;
                db.close().await?;
                let mut admin = sqlx::PgConnection::connect(&pg_admin_url()).await?;
                sqlx::raw_sql(&format!("DROP ROLE IF EXISTS \"{name}\"")).execute(&mut admin).await?;
                admin.close().await
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop the test role {}: {dropped:?}", self.name);
        }
    }
}
