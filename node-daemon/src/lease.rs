//! Busy leases (docs/behaviour.md#busy-replicas): how a replica says "busy until T" from
//! inside its container with nothing but what Fleet gives it. Each container gets a directory
//! of its own bound writable at [`TARGET`], and `FLEET_BUSY_FILE` names the file in it: the
//! agent writes a time there (RFC 3339 or Unix seconds) to say busy until then, and removes it
//! or writes nothing to say idle. The node reads the file without following a link, a regular
//! file of at most [`MAX_BYTES`], and counts only what was written since the container's
//! current run began: a lease never outlives the run, nor the container, whose directory goes
//! with it. Behind the Docker guard the directory is the guard's own and the guard reads it
//! for the node (`GET /fleet/v1/containers/{name}/busy`, [`crate::guard::busy`]).

use rustix::fs::{Mode, OFlags, CWD};
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Where a container finds its lease directory.
pub const TARGET: &str = "/run/fleet/busy";
/// The lease file in it.
pub const FILE: &str = "until";
/// The variable naming the lease file in the container.
pub const ENV: &str = "FLEET_BUSY_FILE";
/// The most a lease file holds; a longer one is no lease.
pub const MAX_BYTES: u64 = 64;
/// How far a file's time may lag the clock it is compared with: the kernel stamps files with
/// a coarse clock (a few milliseconds behind), and the guard says it in milliseconds.
const CLOCK_GRAIN: Duration = Duration::from_millis(50);
/// The lease directories under the node's state directory.
const DIR: &str = "leases";

/// What a lease file held, and when it was last written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub text: String,
    pub written: SystemTime,
}

/// `FLEET_BUSY_FILE=/run/fleet/busy/until`, the variable every container gets.
pub fn env_entry() -> String {
    format!("{ENV}={TARGET}/{FILE}")
}

/// Until when (Unix seconds) a lease says busy, at `now`: a time after now, as RFC 3339 or
/// Unix seconds; anything else (empty, past, unreadable) is idle. A time further ahead than
/// any hold may last is reported as that far (the controller's own cap), not as nonsense.
pub fn until(text: &str, now: SystemTime) -> Option<i64> {
    let text = text.trim();
    let secs = if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        text.parse::<i64>().unwrap_or(i64::MAX)
    } else {
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()?.unix_timestamp()
    };
    let now = unix_secs(now);
    (secs > now).then(|| secs.min(now + i64::from(fleet_api::rollout::MAX_BUSY_SECONDS)))
}

/// A lease as reported: busy until when (Unix seconds), counting only what was written since
/// `run_began` (when the node started the container's current run; `None` for a container
/// found running, whose lease counts whenever written).
pub fn busy_until(lease: Option<&Lease>, run_began: Option<SystemTime>, now: SystemTime) -> Option<i64> {
    let lease = lease?;
    if run_began.is_some_and(|t| lease.written + CLOCK_GRAIN < t) {
        return None;
    }
    until(&lease.text, now)
}

/// `secs` as the report carries it: RFC 3339 in UTC, whole seconds.
pub fn rfc3339(secs: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp(secs).unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

fn unix_secs(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// Reads the lease file of the directory `dir`: `None` when there is none. Nothing is
/// followed: the directory is opened without following a link, the file below it likewise and
/// without blocking (a FIFO), and only a regular file of at most [`MAX_BYTES`] is read.
pub fn read_in(dir: &Path) -> Result<Option<Lease>, String> {
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let dir_fd: OwnedFd = match rustix::fs::openat(CWD, dir, dir_flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    };
    let file_flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = match rustix::fs::openat(&dir_fd, FILE, file_flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(rustix::io::Errno::LOOP) => return Err(format!("{FILE} is a symbolic link")),
        Err(e) => return Err(format!("{FILE}: {e}")),
    };
    read_file(std::fs::File::from(fd)).map(Some)
}

fn read_file(file: std::fs::File) -> Result<Lease, String> {
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.file_type().is_file() {
        return Err(format!("{FILE} is not a regular file"));
    }
    if meta.len() > MAX_BYTES {
        return Err(format!("{FILE} holds {} bytes, more than {MAX_BYTES}", meta.len()));
    }
    let mut bytes = Vec::new();
    file.take(MAX_BYTES + 1).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(format!("{FILE} grew past {MAX_BYTES} bytes while read"));
    }
    let written = meta.modified().unwrap_or(UNIX_EPOCH);
    Ok(Lease { text: String::from_utf8_lossy(&bytes).into_owned(), written })
}

/// The lease directories of this node's containers: `<stateDir>/leases/<container name>/`,
/// bound from `<hostStateDir>/leases/<container name>/`.
#[derive(Debug, Clone)]
pub struct Leases {
    local: PathBuf,
    host: PathBuf,
}

impl Leases {
    pub fn new(state_dir: &Path, host_state_dir: &Path) -> Leases {
        Leases { local: state_dir.join(DIR), host: host_state_dir.join(DIR) }
    }

    /// The host path a container named `name` binds at [`TARGET`].
    pub fn host_dir(&self, name: &str) -> PathBuf {
        self.host.join(name)
    }

    fn local_dir(&self, name: &str) -> PathBuf {
        self.local.join(name)
    }

    /// A fresh, empty directory for a container about to be created, `0700`, given to the
    /// container's user (`owner`) when the node may give it away (it runs as root).
    pub fn prepare(&self, name: &str, owner: Option<(u32, Option<u32>)>) -> Result<(), String> {
        let dir = self.local_dir(name);
        self.remove(name);
        std::fs::create_dir_all(&self.local).map_err(|e| format!("{}: {e}", self.local.display()))?;
        let _ = std::fs::set_permissions(&self.local, std::fs::Permissions::from_mode(0o700));
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&dir, Some(uid), gid).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        Ok(())
    }

    /// The lease of container `name` read from its directory here.
    pub fn read(&self, name: &str) -> Result<Option<Lease>, String> {
        read_in(&self.local_dir(name))
    }

    /// Whether a container's bind at [`TARGET`] is its directory here (else the guard's).
    pub fn is_local(&self, name: &str, source: &str) -> bool {
        Path::new(source) == self.host_dir(name)
    }

    /// Removes the directory of container `name` (the container is gone, or made anew).
    pub fn remove(&self, name: &str) {
        let dir = self.local_dir(name);
        if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_symlink()) {
            let _ = std::fs::remove_file(&dir);
        } else if dir.exists() {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a lease directory");
            }
        }
    }

    /// Removes the directories of containers for which `keep` is false.
    pub fn prune(&self, keep: &dyn Fn(&str) -> bool) {
        for e in std::fs::read_dir(&self.local).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !keep(&name) {
                self.remove(&name);
            }
        }
    }
}

/// How often a lease that cannot be read is said in the log, per container.
pub const UNREADABLE_SAID_EVERY: Duration = Duration::from_secs(600);
#[cfg(test)]
mod tests;
