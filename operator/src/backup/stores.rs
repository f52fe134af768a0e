//! A store opened for a backup, a restore or a copy: one connection of either backend, the
//! source read in one snapshot, the target written in one transaction. A SQLite source is
//! first copied (`VACUUM INTO`) into a private file and that copy migrated to this release's
//! schema, so the source itself is never changed; a PostgreSQL source must be at this release's
//! schema already (the catalogue is this release's).

use super::backend::pg;
use super::file::{self, FileError};
use super::serving::sqlite_path;
use crate::store::db::sql::{open_pg, open_sqlite};
use crate::store::db::DbError;
use sqlx::Connection;

/// One connection to a store.
pub enum Conn {
    Sqlite(sqlx::SqliteConnection),
    Pg(sqlx::PgConnection),
}

/// Runs the same function of the backend module on whichever connection this is.
macro_rules! on {
    ($conn:expr, $f:ident ( $($arg:expr),* )) => {
        match $conn {
            Conn::Sqlite(c) => $crate::backup::backend::sqlite::$f(c, $($arg),*).await,
            Conn::Pg(c) => $crate::backup::backend::pg::$f(c, $($arg),*).await,
        }
    };
}
pub(crate) use on;

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{0}")]
    File(#[from] FileError),
    #[error("{0}")]
    Db(#[from] DbError),
    #[error("{0}")]
    Sql(#[from] sqlx::Error),
    #[error(
        "the store at {url} is at another schema than this release's (its migrations {theirs:?}, this release's {ours:?}): \
         use the fleet-controller of the release that serves it"
    )]
    Schema { url: String, theirs: Vec<i64>, ours: Vec<i64> },
    #[error("unsupported database URL {0:?}: use sqlite://PATH or postgres://USER@HOST/DB")]
    Url(String),
}

pub fn is_pg(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// This release's migrations of PostgreSQL.
fn pg_versions() -> Vec<i64> {
    sqlx::migrate!("./migrations/postgres").iter().map(|m| m.version).collect()
}

/// The source `url` read in one snapshot (the read transaction is open). A SQLite source is
/// read through a migrated copy in `scratch`.
pub async fn open_source(url: &str, scratch: &std::path::Path) -> Result<Conn, OpenError> {
    if let Some(path) = sqlite_path(url) {
        let copy = scratch.join("source.sqlite");
        file::vacuum_into(&mut file::open_store(&path).await?, &copy).await?;
        let mut c = migrated_sqlite(&copy).await?;
        sqlx::query("BEGIN").execute(&mut c).await?;
        return Ok(Conn::Sqlite(c));
    }
    if !is_pg(url) {
        return Err(OpenError::Url(crate::config::redact(url)));
    }
    let mut c = sqlx::PgConnection::connect(url).await?;
    let theirs = pg::migrations(&mut c).await?;
    if theirs != pg_versions() {
        return Err(OpenError::Schema { url: crate::config::redact(url), theirs, ours: pg_versions() });
    }
    pg::begin_snapshot(&mut c).await?;
    Ok(Conn::Pg(c))
}

/// A SQLite file migrated to this release's schema (created when missing), then one
/// connection to it.
pub async fn migrated_sqlite(path: &std::path::Path) -> Result<sqlx::SqliteConnection, OpenError> {
    let url = format!("sqlite://{}", path.display());
    open_sqlite(&url).await?.close().await;
    Ok(file::open_store(path).await?)
}

/// The target `url`, created and migrated to this release's schema when it is new.
pub async fn open_target(url: &str) -> Result<Conn, OpenError> {
    if let Some(path) = sqlite_path(url) {
        return Ok(Conn::Sqlite(migrated_sqlite(&path).await?));
    }
    if !is_pg(url) {
        return Err(OpenError::Url(crate::config::redact(url)));
    }
    open_pg(url, "fleet-controller-store").await?.close().await;
    Ok(Conn::Pg(sqlx::PgConnection::connect(url).await?))
}

/// Closes the connection (a SQLite one checkpoints its WAL into the file as it closes).
pub async fn close(c: Conn) -> Result<(), sqlx::Error> {
    match c {
        Conn::Sqlite(c) => c.close().await,
        Conn::Pg(c) => c.close().await,
    }
}
