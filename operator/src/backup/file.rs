//! SQLite store files as a backup writes and a restore replaces them: opened as they are (no
//! migration: a live store is another release's to migrate), copied consistently with `VACUUM
//! INTO`, written into a private directory beside their destination and moved into place
//! whole, at mode 0600 — a backup holds the nodes' token hashes and the sealed PATs.

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, SqliteConnection};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("{path}: {error}")]
    Sql { path: String, error: sqlx::Error },
    #[error("{path} is not a Fleet store (it has no {missing} table)")]
    NotAStore { path: String, missing: &'static str },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FileError + '_ {
    move |error| FileError::Io { path: path.display().to_string(), error }
}

fn sql(path: &Path) -> impl FnOnce(sqlx::Error) -> FileError + '_ {
    move |error| FileError::Sql { path: path.display().to_string(), error }
}

/// A connection to the SQLite store at `path`, which must exist and be a Fleet store. Nothing
/// is migrated; a read inside it sees one instant (SQLite's WAL gives a reader a snapshot).
pub async fn open_store(path: &Path) -> Result<SqliteConnection, FileError> {
    if !path.is_file() {
        return Err(FileError::Io { path: path.display().to_string(), error: std::io::ErrorKind::NotFound.into() });
    }
    let opts = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
        .map_err(sql(path))?
        .busy_timeout(Duration::from_secs(30));
    let mut c = opts.connect().await.map_err(sql(path))?;
    for table in ["_sqlx_migrations", "nodes"] {
        let found: Option<String> =
            sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' AND name = $1")
                .bind(table)
                .fetch_optional(&mut c)
                .await
                .map_err(sql(path))?;
        if found.is_none() {
            return Err(FileError::NotAStore { path: path.display().to_string(), missing: table });
        }
    }
    Ok(c)
}

/// Writes a consistent, compact copy of the store `c` reads into `dest` (which must not exist):
/// one read transaction, so a controller writing meanwhile changes nothing in it.
pub async fn vacuum_into(c: &mut SqliteConnection, dest: &Path) -> Result<(), FileError> {
    sqlx::query("VACUUM INTO $1").bind(dest.display().to_string()).execute(&mut *c).await.map_err(sql(dest))?;
    Ok(())
}

/// A private directory (0700) beside `dest`, on its file system, so a file written in it is
/// moved onto `dest` by a rename.
pub fn private_beside(dest: &Path) -> Result<tempfile::TempDir, FileError> {
    let dir = dest.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    tempfile::Builder::new().prefix(".fleet-").tempdir_in(dir).map_err(io(dir))
}

/// Moves the finished `file` onto `dest` at mode 0600: its data synced first, the directory
/// after, so a crash leaves either the old file or the whole new one.
pub fn put_in_place(file: &Path, dest: &Path) -> Result<(), FileError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600)).map_err(io(file))?;
    std::fs::File::open(file).and_then(|f| f.sync_all()).map_err(io(file))?;
    std::fs::rename(file, dest).map_err(io(dest))?;
    sync_dir(dest)
}

fn sync_dir(path: &Path) -> Result<(), FileError> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// Moves the store at `store` (with its `-wal` and `-shm` files) aside to
/// `<store>.replaced-<stamp>`, where SQLite still finds them together; returns where.
pub fn set_aside(store: &Path, stamp: &str) -> Result<Option<PathBuf>, FileError> {
    if !store.exists() {
        return Ok(None);
    }
    let aside = PathBuf::from(format!("{}.replaced-{stamp}", store.display()));
    for suffix in ["-wal", "-shm", ""] {
        let from = PathBuf::from(format!("{}{suffix}", store.display()));
        if from.exists() {
            std::fs::rename(&from, format!("{}{suffix}", aside.display())).map_err(io(&from))?;
        }
    }
    sync_dir(store)?;
    Ok(Some(aside))
}

/// Closes a connection to a file this process wrote (a backup, a restore's copy) as one file:
/// in rollback-journal mode, its WAL checkpointed into it, nothing beside it.
pub async fn close_as_one_file(mut c: SqliteConnection, path: &Path) -> Result<(), FileError> {
    use sqlx::Connection;
    sqlx::query("PRAGMA journal_mode = DELETE").execute(&mut c).await.map_err(sql(path))?;
    c.close().await.map_err(sql(path))
}
