//! The two backends of the store (docs/behaviour.md#the-store, docs/behaviour.md#high-availability): SQLite, the single-replica default, and
//! PostgreSQL, for several replicas behind one Service. Their SQL is one file, `queries.rs`,
//! compiled once against each driver's types: the statements are the same text, each driver
//! keeps its own types (booleans, blobs) and placeholders, and nothing is written twice. This
//! module also opens (and migrates) either pool, and picks the fence a leader write carries.

use super::error::DbError;
use super::rows::Fence;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use std::str::FromStr;
use std::time::Duration;

/// The pool of the backend the URL named.
#[derive(Clone)]
pub enum Pool {
    Sqlite(sqlx::SqlitePool),
    Pg(sqlx::PgPool),
}

/// Runs the same query function of the backend module on whichever pool this is.
macro_rules! on {
    ($pool:expr, $f:ident ( $($arg:expr),* )) => {
        match $pool {
            Pool::Sqlite(p) => sqlite::$f(p, $($arg),*).await,
            Pool::Pg(p) => pg::$f(p, $($arg),*).await,
        }
    };
}
pub(crate) use on;

/// The fence a leader write on `pool` carries: none on SQLite; on PostgreSQL the lease held,
/// and a refusal when none is.
pub fn fence_of(pool: &Pool, held: &parking_lot::RwLock<Option<Fence>>) -> Result<Option<Fence>, DbError> {
    match pool {
        Pool::Sqlite(_) => Ok(None),
        Pool::Pg(_) => held.read().clone().map(Some).ok_or(DbError::NotLeader),
    }
}

/// Each SQLite connection's page cache, in KiB (`PRAGMA cache_size` takes KiB as a negative
/// number). SQLite's default is 2,000 KiB a connection, and all four connections fill theirs
/// (~9 MB of heap at 3,000 nodes): the controller reads its tables once at start and then
/// writes, and the pages it reads again come from the kernel's cache as fast. A transaction
/// larger than the cache spills its pages to the WAL before it commits, which is what the WAL
/// is for.
pub const SQLITE_CACHE_KIB: u32 = 256;

pub async fn open_sqlite(url: &str) -> Result<sqlx::SqlitePool, DbError> {
    if let Some(path) = url.strip_prefix("sqlite://") {
        let path = path.split('?').next().unwrap_or(path);
        if let Some(dir) = std::path::Path::new(path).parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| DbError::Other(format!("cannot create {}: {e}", dir.display())))?;
            }
        }
    }
    let opts = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        // FULL: a commit is on disk before it is acknowledged, so a `201` for a join
        // survives a power loss (docs/behaviour.md#hardening). With WAL and the group commit it costs little
        // (docs/performance.md#durability).
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(10))
        .foreign_keys(true)
        .pragma("cache_size", format!("-{SQLITE_CACHE_KIB}"));
    // Four connections, not one: PAT writes and a pass's batch overlap their non-SQLite
    // work, although SQLite still takes one writer at a time (a cold start converges about a
    // fifth sooner).
    let pool = SqlitePoolOptions::new().max_connections(4).connect_with(opts).await?;
    let mut migrations = sqlx::migrate!("./migrations/sqlite");
    migrations.set_ignore_missing(true);
    migrations.run(&pool).await?;
    Ok(pool)
}

/// Migrations a newer release applied and this one does not know are passed over
/// (`set_ignore_missing` at each open below): they only add (docs/operations.md#versions-and-upgrades),
/// so a replica of the older release still runs beside a newer one during a rolling upgrade,
/// and after a rollback.
///
/// Sessions of one replica's pool: the notification listener holds one for good; the group
/// commit, the pass, the report flusher, the follower's reads and the joins of a fleet coming
/// up at once each hold one for a transaction. With the leader's advisory lock (a session of
/// its own), three replicas take 49 of PostgreSQL's default 100.
pub const PG_CONNECTIONS: u32 = 16;

pub async fn open_pg(url: &str, replica: &str) -> Result<sqlx::PgPool, DbError> {
    // Every session names its replica (`pg_stat_activity.application_name`), so a follower can
    // end all the sessions of a leader whose lease expired (`lease::end_expired_holder`).
    let mut opts = sqlx::postgres::PgConnectOptions::from_str(url)?;
    if !replica.is_empty() {
        opts = opts.application_name(replica);
    }
    let replica = replica.to_string();
    // A connection attempt gives up after 5 s, so a replica whose database is away says so
    // (`/readyz` 503) instead of hanging its requests.
    let pool = PgPoolOptions::new()
        .max_connections(PG_CONNECTIONS)
        .acquire_timeout(Duration::from_secs(5))
        .after_connect(move |conn, _| {
            let replica = replica.clone();
            Box::pin(async move {
                sqlx::query("SELECT set_config('fleet.replica', $1, false)").bind(replica).execute(conn).await?;
                Ok(())
            })
        })
        .connect_with(opts)
        .await?;
    // Replicas starting together migrate one at a time: sqlx takes an advisory lock.
    let mut migrations = sqlx::migrate!("./migrations/postgres");
    migrations.set_ignore_missing(true);
    migrations.run(&pool).await?;
    Ok(pool)
}

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
