//! The backup's SQL per backend: `rows_sql.rs` compiled against each driver's types, as the
//! store's own SQL is (`store::db::sql`), and what differs between the two — how a read of a
//! whole store is made consistent, and what PostgreSQL's identity column needs after rows were
//! written with their own `seq`.

pub mod sqlite {
    pub type DB = sqlx::Sqlite;
    pub type Conn = sqlx::SqliteConnection;
    include!("rows_sql.rs");

    /// Deletes a `kv` row.
    pub async fn delete_kv(c: &mut Conn, key: &str) -> Result<(), DbError> {
        sqlx::query("DELETE FROM kv WHERE key = $1").bind(key).execute(&mut *c).await?;
        Ok(())
    }
}

pub mod pg {
    pub type DB = sqlx::Postgres;
    pub type Conn = sqlx::PgConnection;
    include!("rows_sql.rs");

    /// The versions of the migrations applied to the store.
    pub async fn migrations(c: &mut Conn) -> Result<Vec<i64>, DbError> {
        let sql = "SELECT version FROM _sqlx_migrations WHERE success ORDER BY version";
        Ok(sqlx::query_scalar(sql).fetch_all(&mut *c).await?)
    }

    /// A read of every table as of one instant, while writers go on: the snapshot of a
    /// repeatable-read transaction.
    pub async fn begin_snapshot(c: &mut Conn) -> Result<(), DbError> {
        sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY").execute(&mut *c).await?;
        Ok(())
    }

    /// The events' identity column goes on after the highest `seq` written.
    pub async fn resume_event_seq(c: &mut Conn) -> Result<(), DbError> {
        sqlx::query(
            "SELECT setval(pg_get_serial_sequence('events', 'seq'), GREATEST((SELECT MAX(seq) FROM events), 1), \
             (SELECT MAX(seq) FROM events) IS NOT NULL)",
        )
        .execute(&mut *c)
        .await?;
        Ok(())
    }

    /// The lease row, if a replica holds it now: (holder, seconds it still runs).
    pub async fn lease_held(c: &mut Conn) -> Result<Option<(String, f64)>, DbError> {
        let row: Option<(String, f64)> = sqlx::query_as(
            "SELECT holder, EXTRACT(EPOCH FROM expires_at - now())::float8 FROM leader_lease \
             WHERE name = $1 AND expires_at > now()",
        )
        .bind(crate::store::lease::NAME)
        .fetch_optional(&mut *c)
        .await?;
        Ok(row)
    }
}
