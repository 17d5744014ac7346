//! PostgreSQL: production, any number of instances on one database.
//!
//! Claims pick candidates with `FOR UPDATE SKIP LOCKED`, so instances never wait on
//! each other's rows; "no older unresolved entry with this key" is answered from a
//! partial index over unresolved rows only. Migrations run under an advisory lock so
//! instances starting together apply them once.

use std::time::Duration;

use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions, PgRow};

use super::StoreError;
use super::sqlstore::store_impl;

const MIGRATIONS: &[(i64, &str)] =
    &[(1, include_str!("sql/postgres_0001_inbox.sql")), (2, include_str!("sql/postgres_0002_audit.sql"))];

/// Serializes migrations across instances (the key is "inlet" in ASCII).
const MIGRATION_LOCK: &str = "SELECT pg_advisory_xact_lock(452824163700)";

pub struct PgStore {
    pool: PgPool,
}

impl PgStore {
    pub async fn open(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(Duration::from_secs(3))
            .connect(url)
            .await?;
        let store = PgStore { pool };
        store.migrate(MIGRATIONS, &[MIGRATION_LOCK]).await?;
        Ok(store)
    }
}

store_impl! {
    store: PgStore,
    backend: "postgres",
    pool: PgPool,
    conn: PgConnection,
    row: PgRow,
    claim_sql: concat!(
        "WITH picked AS (\n",
        include_str!("sql/claim_where.sql"),
        "    FOR UPDATE SKIP LOCKED\n)\nUPDATE inbox_entry SET\n",
        include_str!("sql/claim_set.sql"),
        "FROM picked WHERE inbox_entry.id = picked.id\nRETURNING inbox_entry.*"
    ),
    now_sql: "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT",
}
