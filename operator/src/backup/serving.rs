//! Whether a controller serves a store (docs/operations.md#backup-and-restore): a restore or
//! an offline copy must not change a store under a running controller, which would go on with
//! what it holds in memory and write it back over the restored rows.
//!
//! On SQLite the controller holds an exclusive lock on a file beside the store,
//! `<store>.serving`, for as long as it serves (taken at start: a second controller on the same
//! file does not start either). The kernel lets the lock go when the process ends, however it
//! ends, so a crashed controller never leaves a stale lock. On PostgreSQL a store is served
//! while a replica holds the leader lease.

use super::backend::pg;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
use std::path::{Path, PathBuf};

/// What refuses a restore or a copy, or a second controller on one SQLite store.
#[derive(Debug, thiserror::Error)]
pub enum Served {
    #[error(
        "a controller serves this store ({holder}; lock {lock}): stop it first (kubectl scale deploy/<release>-fleet-controller --replicas=0, \
         or docker compose stop fleet-controller)"
    )]
    Sqlite { lock: String, holder: String },
    #[error(
        "a controller serves this store: replica {holder} holds the lease for {secs:.0} s more; stop every replica first \
         (kubectl scale deploy/<release>-fleet-controller --replicas=0), then try again"
    )]
    Postgres { holder: String, secs: f64 },
    #[error("cannot use the lock file {path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("{0}")]
    Db(#[from] crate::store::db::DbError),
    #[error("{0}")]
    Sql(#[from] sqlx::Error),
}

/// The file of a `sqlite://PATH` URL (its query string left out); `None` for another URL or an
/// in-memory database.
pub fn sqlite_path(url: &str) -> Option<PathBuf> {
    let path = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:"))?;
    let path = path.split('?').next().unwrap_or(path);
    (!path.is_empty() && path != ":memory:").then(|| PathBuf::from(path))
}

fn lock_path(store: &Path) -> PathBuf {
    let mut name = store.as_os_str().to_owned();
    name.push(".serving");
    PathBuf::from(name)
}

/// The lock a controller holds on its SQLite store while it serves.
#[derive(Debug)]
pub struct ServeLock {
    _file: File,
}

impl ServeLock {
    /// Takes the lock of the store at `url`, or says who holds it; `None` for PostgreSQL.
    pub fn take(url: &str) -> Result<Option<ServeLock>, Served> {
        let Some(store) = sqlite_path(url) else { return Ok(None) };
        let path = lock_path(&store);
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| io(&path, e))?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io(&path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(held(&path)),
            Err(TryLockError::Error(e)) => return Err(io(&path, e)),
        }
        let who = format!("pid {} since {}\n", std::process::id(), crate::clock::rfc3339_ms(crate::clock::now_ms()));
        file.set_len(0).and_then(|()| file.write_all(who.as_bytes())).map_err(|e| io(&path, e))?;
        Ok(Some(ServeLock { _file: file }))
    }
}

fn io(path: &Path, error: std::io::Error) -> Served {
    Served::Io { path: path.display().to_string(), error }
}

fn held(path: &Path) -> Served {
    let holder = std::fs::read_to_string(path).map(|s| s.trim().to_string()).unwrap_or_default();
    let holder = if holder.is_empty() { "a running process".to_string() } else { holder };
    Served::Sqlite { lock: path.display().to_string(), holder }
}

/// Refuses when a controller serves the store at `url`.
pub async fn refuse_if_served(url: &str) -> Result<(), Served> {
    if sqlite_path(url).is_some() {
        // Taken and let go at once: only a serving controller holds it for longer.
        drop(ServeLock::take(url)?);
        return Ok(());
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(url).await?;
        let held = pg::lease_held(&mut c).await.ok().flatten();
        if let Some((holder, secs)) = held {
            return Err(Served::Postgres { holder, secs });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_naming_the_first_and_a_dropped_lock_is_free() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/fleet.sqlite", dir.path().display());
        let held = ServeLock::take(&url).unwrap().expect("a SQLite store has a lock");
        let e = ServeLock::take(&url).unwrap_err().to_string();
        assert!(
            e.contains("a controller serves this store") && e.contains(&format!("pid {}", std::process::id())),
            "{e}"
        );
        assert!(e.contains("fleet.sqlite.serving"), "{e}");
        drop(held);
        assert!(ServeLock::take(&url).unwrap().is_some(), "free once the holder is gone");
        assert!(ServeLock::take("postgres://u@h/db").unwrap().is_none());
    }

    #[test]
    fn the_file_of_a_sqlite_url() {
        assert_eq!(sqlite_path("sqlite:///data/fleet.sqlite?mode=rwc"), Some(PathBuf::from("/data/fleet.sqlite")));
        assert_eq!(sqlite_path("sqlite://rel/f.sqlite"), Some(PathBuf::from("rel/f.sqlite")));
        assert_eq!(sqlite_path("sqlite::memory:"), None);
        assert_eq!(sqlite_path("postgres://h/db"), None);
    }
}
