//! Fleet's own life (docs/operations.md#backup-and-restore): a consistent copy of a store
//! while a controller serves it (`backup`), a store replaced by such a copy (`restore`), a
//! store copied into an empty one of either backend (`copy`), and a store marked as restored
//! by other means (`mark_restored`, after a PostgreSQL restore with the operator's own tools).
//! A restored store is older than the fleet; the controller itself heals that
//! (docs/behaviour.md#a-store-older-than-the-fleet), and these commands mark it so it starts
//! at once. The pieces: the catalogue of tables (`tables`), rows and checksums (`rows`), the SQL
//! per backend (`backend`), SQLite files (`file`), opening stores (`stores`), the copy itself
//! (`copy`), the summary a backup prints (`summary`), the lock of a served store (`serving`)
//! and the names of scheduled backups (`schedule`).

mod backend;
pub mod copy;
pub mod file;
mod rows;
pub mod schedule;
pub mod serving;
pub mod stores;
pub mod summary;
pub mod tables;

use crate::clock;
use crate::store::records::catch_up::{CatchUp, KEY as CATCH_UP_KEY};
use backend::sqlite;
use copy::{CopyError, TableCopy};
use serving::{refuse_if_served, sqlite_path, Served};
use std::path::{Path, PathBuf};
use stores::{is_pg, Conn, OpenError};
use summary::Summary;

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("{0}")]
    Open(#[from] OpenError),
    #[error("{0}")]
    Copy(#[from] CopyError),
    #[error("{0}")]
    File(#[from] file::FileError),
    #[error("{0}")]
    Served(#[from] Served),
    #[error("{0}")]
    Db(#[from] crate::store::db::DbError),
    #[error("{0}")]
    Sql(#[from] sqlx::Error),
    #[error("{0}")]
    Usage(String),
}

/// What a backup wrote.
#[derive(Debug)]
pub struct Written {
    pub file: PathBuf,
    pub bytes: u64,
    pub summary: Summary,
}

/// Writes a consistent copy of the store at `url` to `out` (mode 0600), while a controller
/// may serve it: SQLite with `VACUUM INTO`, PostgreSQL read in one repeatable-read snapshot
/// into a SQLite file of the same tables. The copy is stamped with the time it was taken.
pub async fn backup(url: &str, out: &Path) -> Result<Written, BackupError> {
    let private = file::private_beside(out)?;
    let tmp = private.path().join("backup.sqlite");
    let taken = clock::now_ms();
    if let Some(path) = sqlite_path(url) {
        file::vacuum_into(&mut file::open_store(&path).await?, &tmp).await?;
    } else if is_pg(url) {
        let mut src = stores::open_source(url, private.path()).await?;
        let mut dst = Conn::Sqlite(stores::migrated_sqlite(&tmp).await?);
        copy::rows(&mut src, &mut dst, false).await?;
        stores::close(dst).await?;
    } else {
        return Err(OpenError::Url(crate::config::redact(url)).into());
    }
    let mut c = file::open_store(&tmp).await?;
    sqlite::put_kv(&mut c, summary::TAKEN_KEY, &taken.to_string()).await?;
    let summary = summary::of(&mut c, taken).await?;
    file::close_as_one_file(c, &tmp).await?;
    file::put_in_place(&tmp, out)?;
    let bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    Ok(Written { file: out.to_path_buf(), bytes, summary })
}

/// What a restore did.
#[derive(Debug)]
pub struct Restored {
    pub summary: Summary,
    /// Where the replaced SQLite store was moved.
    pub set_aside: Option<PathBuf>,
    /// The tables written into PostgreSQL.
    pub tables: Vec<TableCopy>,
}

/// Replaces the store at `url` with the backup `from`, refused while a controller serves it.
/// The backup is left as it is: a copy of it is migrated to this release's schema and marked
/// as restored, then put in place of a SQLite store (the old one moved aside), or written into
/// PostgreSQL in one transaction that empties its tables first.
pub async fn restore(from: &Path, url: &str) -> Result<Restored, BackupError> {
    let mut backup = file::open_store(from).await?;
    let summary = summary::of(&mut backup, clock::now_ms()).await?;
    refuse_if_served(url).await?;
    let beside = sqlite_path(url).unwrap_or_else(|| std::env::temp_dir().join("fleet-restore"));
    let private = file::private_beside(&beside)?;
    let tmp = private.path().join("restored.sqlite");
    file::vacuum_into(&mut backup, &tmp).await?;
    stores::close(Conn::Sqlite(backup)).await?;
    let mut c = stores::migrated_sqlite(&tmp).await?;
    sqlite::put_kv(&mut c, CATCH_UP_KEY, &catch_up_mark(summary.taken_ms)).await?;
    sqlite::delete_kv(&mut c, summary::TAKEN_KEY).await?;
    if let Some(path) = sqlite_path(url) {
        file::close_as_one_file(c, &tmp).await?;
        let set_aside = file::set_aside(&path, &clock::rfc3339_ms(clock::now_ms()).replace(':', ""))?;
        file::put_in_place(&tmp, &path)?;
        return Ok(Restored { summary, set_aside, tables: Vec::new() });
    }
    if !is_pg(url) {
        return Err(OpenError::Url(crate::config::redact(url)).into());
    }
    sqlx::query("BEGIN").execute(&mut c).await?;
    let mut dst = stores::open_target(url).await?;
    let tables = copy::rows(&mut Conn::Sqlite(c), &mut dst, true).await?;
    stores::close(dst).await?;
    Ok(Restored { summary, set_aside: None, tables })
}

/// Marks the store at `url`, restored by other means than `restore`, as older than the fleet.
pub async fn mark_restored(url: &str) -> Result<(), BackupError> {
    refuse_if_served(url).await?;
    let mut c = stores::open_target(url).await?;
    stores::on!(&mut c, put_kv(CATCH_UP_KEY, &catch_up_mark(None)))?;
    stores::close(c).await?;
    Ok(())
}

/// The mark the controller starts its catch-up from (docs/behaviour.md#a-store-older-than-the-fleet).
fn catch_up_mark(taken_ms: Option<i64>) -> String {
    CatchUp::restored(clock::now_ms(), taken_ms).to_json()
}

/// Copies every row of the store at `from` into the empty store at `to` (either backend, both
/// offline), then checks the two alike table by table.
pub async fn copy_store(from: &str, to: &str) -> Result<Vec<TableCopy>, BackupError> {
    if from == to {
        return Err(BackupError::Usage("--from and --to name the same store".into()));
    }
    refuse_if_served(from).await?;
    refuse_if_served(to).await?;
    let scratch = tempfile::tempdir().map_err(|e| BackupError::Usage(format!("a temporary directory: {e}")))?;
    let mut src = stores::open_source(from, scratch.path()).await?;
    let mut dst = stores::open_target(to).await?;
    copy::refuse_unless_empty(&mut dst).await?;
    let tables = copy::rows(&mut src, &mut dst, false).await?;
    stores::close(dst).await?;
    Ok(tables)
}
