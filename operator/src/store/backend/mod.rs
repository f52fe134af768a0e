//! The two backends of the store (SPEC §3.5, §3.9): SQLite, the single-replica default, and
//! PostgreSQL, for several replicas behind one Service. Their SQL is one file, `queries.rs`,
//! compiled once against each driver's types: the statements are the same text, each driver
//! keeps its own types (booleans, blobs) and placeholders, and nothing is written twice.

pub mod sqlite {
    pub type DB = sqlx::Sqlite;
    pub type Conn = sqlx::SqliteConnection;
    pub type Pool = sqlx::SqlitePool;
    /// SQLite has one writer at a time; there is no lease to lock.
    const FOR_SHARE: &str = "";
    include!("queries.rs");
}

pub mod pg {
    pub type DB = sqlx::Postgres;
    pub type Conn = sqlx::PgConnection;
    pub type Pool = sqlx::PgPool;
    const FOR_SHARE: &str = " FOR SHARE";
    include!("queries.rs");
}
