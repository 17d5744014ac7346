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

const MIGRATIONS: &[(i64, &str)] = &[(1, include_str!("sql/postgres_0001_inbox.sql"))];

/// Advisory lock key for migrations ("inlet" in ASCII).
const MIGRATION_LOCK: i64 = 0x696e6c6574;

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
        store.migrate().await?;
        Ok(store)
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(MIGRATION_LOCK).execute(&mut *tx).await?;
        sqlx::query("CREATE TABLE IF NOT EXISTS inlet_schema (version BIGINT PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())")
            .execute(&mut *tx)
            .await?;
        let current: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(version), 0)::BIGINT FROM inlet_schema")
            .fetch_one(&mut *tx)
            .await?;
        for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
            let fail = |error| StoreError::Migration { version: *version, error };
            sqlx::raw_sql(sql).execute(&mut *tx).await.map_err(fail)?;
            sqlx::query("INSERT INTO inlet_schema (version) VALUES ($1)")
                .bind(version)
                .execute(&mut *tx)
                .await
                .map_err(fail)?;
        }
        tx.commit().await?;
        Ok(())
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
