//! `stateDir` (docs/behaviour.md#joining-and-the-state-directory): the node's token, id, X25519 keys, last desired state and opened
//! PATs. The directory is 0700 and every file 0600; every write is atomic (temp file, fsync,
//! rename, fsync of the directory), so a crash leaves the old file or the new, never half.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
#[error("{path}: {error}")]
pub struct StateError {
    pub path: String,
    pub error: String,
}

fn err(path: &Path, e: impl std::fmt::Display) -> StateError {
    StateError { path: path.display().to_string(), error: e.to_string() }
}

/// What a joined node keeps.
#[derive(Clone)]
pub struct Identity {
    pub node_id: String,
    pub token: String,
    pub secret_key: [u8; 32],
    pub public_key: [u8; 32],
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").field("node_id", &self.node_id).finish_non_exhaustive()
    }
}

#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
}

/// Writes `bytes` to `path` atomically with mode 0600.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    let dir = path.parent().ok_or_else(|| err(path, "has no parent directory"))?;
    let tmp =
        dir.join(format!(".{}.tmp-{}", path.file_name().and_then(|n| n.to_str()).unwrap_or("f"), std::process::id()));
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| err(&tmp, e))?;
        f.write_all(bytes).map_err(|e| err(&tmp, e))?;
        f.sync_all().map_err(|e| err(&tmp, e))?;
    }
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o600)).map_err(|e| err(&tmp, e))?;
    fs::rename(&tmp, path).map_err(|e| err(path, e))?;
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Creates `path` (0700) as a real directory: a symbolic link found in its place is removed
/// first, since the Docker guard refuses a bind source with a link in it
/// (docs/behaviour.md#what-the-guard-checks-and-why).
fn ensure_dir(path: &Path) -> Result<(), StateError> {
    if fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        tracing::warn!(path = %path.display(), "a symbolic link stood where a state directory belongs; removed");
        fs::remove_file(path).map_err(|e| err(path, e))?;
    }
    fs::create_dir_all(path).map_err(|e| err(path, e))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o700)).map_err(|e| err(path, e))
}

impl StateDir {
    /// Opens (creating, 0700) the state directory.
    pub fn open(root: &Path) -> Result<StateDir, StateError> {
        ensure_dir(root)?;
        // A write interrupted by a crash leaves its temp file (the target is untouched):
        // sweep them, nothing else in the directory has this shape.
        for d in [root.to_path_buf(), root.join("agents")] {
            for e in fs::read_dir(&d).into_iter().flatten().flatten() {
                let name = e.file_name();
                let name = name.to_string_lossy();
                if name.starts_with('.') && name.contains(".tmp-") {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
        ensure_dir(&root.join("agents"))?;
        Ok(StateDir { root: root.to_path_buf() })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn read(&self, name: &str) -> Result<Option<String>, StateError> {
        let p = self.root.join(name);
        match fs::read_to_string(&p) {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(err(&p, e)),
        }
    }

    /// The saved identity, if the node has joined.
    pub fn identity(&self) -> Result<Option<Identity>, StateError> {
        let (Some(token), Some(node_id), Some(sk)) =
            (self.read("token")?, self.read("node-id")?, self.read("node.key")?)
        else {
            return Ok(None);
        };
        let p = self.root.join("node.key");
        let secret_key: [u8; 32] = B64
            .decode(sk.trim())
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| err(&p, "is not a base64 X25519 secret key"))?;
        let public_key = crypto_public(&secret_key);
        Ok(Some(Identity {
            node_id: node_id.trim().to_string(),
            token: token.trim().to_string(),
            secret_key,
            public_key,
        }))
    }

    /// Saves a fresh key pair before joining, so a crash after the join still has the key.
    pub fn save_keys(&self, secret_key: &[u8; 32]) -> Result<(), StateError> {
        write_atomic(&self.root.join("node.key"), B64.encode(secret_key).as_bytes())?;
        write_atomic(&self.root.join("node.pub"), B64.encode(crypto_public(secret_key)).as_bytes())
    }

    pub fn saved_secret_key(&self) -> Result<Option<[u8; 32]>, StateError> {
        Ok(self.read("node.key")?.and_then(|s| B64.decode(s.trim()).ok()).and_then(|b| b.try_into().ok()))
    }

    pub fn save_identity(&self, node_id: &str, token: &str) -> Result<(), StateError> {
        write_atomic(&self.root.join("node-id"), node_id.as_bytes())?;
        write_atomic(&self.root.join("token"), token.as_bytes())
    }

    pub fn desired_path(&self) -> PathBuf {
        self.root.join("desired.json")
    }

    /// The last desired state saved, as raw JSON.
    pub fn desired(&self) -> Result<Option<String>, StateError> {
        self.read("desired.json")
    }

    pub fn save_desired(&self, json: &[u8]) -> Result<(), StateError> {
        write_atomic(&self.desired_path(), json)
    }

    /// Path of an agent's opened PAT inside this directory.
    pub fn pat_path(&self, agent: &str) -> PathBuf {
        self.root.join("agents").join(agent).join("agent-pat")
    }

    /// Writes an opened PAT (0600) unless it is already there unchanged. `owner`: the uid and
    /// gid to give it, for a node running as root whose containers run as another user (they
    /// read it bound from here when no Docker guard copies it for them).
    pub fn write_pat(&self, agent: &str, pat: &[u8], owner: Option<(u32, Option<u32>)>) -> Result<(), StateError> {
        let p = self.pat_path(agent);
        ensure_dir(p.parent().expect("pat path has a parent"))?;
        let same = |m: &fs::Metadata| owner.is_none_or(|(uid, _)| std::os::unix::fs::MetadataExt::uid(m) == uid);
        let unchanged = fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_file() && same(&m));
        if unchanged && fs::read(&p).is_ok_and(|old| old == pat) {
            return Ok(());
        }
        write_atomic(&p, pat)?;
        match owner {
            Some((uid, gid)) => std::os::unix::fs::chown(&p, Some(uid), gid).map_err(|e| err(&p, e)),
            None => Ok(()),
        }
    }

    /// Deletes opened PATs of agents not in `keep`.
    pub fn prune_pats(&self, keep: &dyn Fn(&str) -> bool) -> Vec<String> {
        let mut removed = vec![];
        if let Ok(entries) = fs::read_dir(self.root.join("agents")) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if !keep(&name) && fs::remove_dir_all(e.path()).is_ok() {
                    removed.push(name);
                }
            }
        }
        removed
    }
}

fn crypto_public(secret: &[u8; 32]) -> [u8; 32] {
    fleet_api::seal::public_of(secret)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// A link planted where an agent's PAT directory belongs is not written through: the
    /// directory is made real, so the PAT bind passes the Docker guard's link check.
    #[test]
    fn a_link_in_place_of_a_pat_directory_is_replaced() {
        let t = tempfile::tempdir().unwrap();
        let s = StateDir::open(&t.path().join("state")).unwrap();
        let elsewhere = t.path().join("elsewhere");
        fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, t.path().join("state/agents/coder")).unwrap();
        s.write_pat("coder", b"pat_1", None).unwrap();
        let dir = fs::symlink_metadata(t.path().join("state/agents/coder")).unwrap();
        assert!(dir.file_type().is_dir(), "a real directory now");
        assert_eq!(dir.mode() & 0o777, 0o700);
        assert_eq!(fs::read(s.pat_path("coder")).unwrap(), b"pat_1");
        assert!(fs::read_dir(&elsewhere).unwrap().next().is_none(), "nothing written through the link");
    }

    #[test]
    fn modes_atomicity_and_round_trips() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("state");
        let s = StateDir::open(&root).unwrap();
        assert_eq!(fs::metadata(&root).unwrap().mode() & 0o777, 0o700);
        assert!(s.identity().unwrap().is_none());
        let (sk, pk) = fleet_api::seal::generate_keypair();
        s.save_keys(&sk).unwrap();
        s.save_identity("node-1", "fnt_secret").unwrap();
        let id = s.identity().unwrap().unwrap();
        assert_eq!((id.node_id.as_str(), id.token.as_str(), id.public_key), ("node-1", "fnt_secret", pk));
        for f in ["token", "node-id", "node.key", "node.pub"] {
            assert_eq!(fs::metadata(root.join(f)).unwrap().mode() & 0o777, 0o600, "{f}");
        }
        s.save_desired(br#"{"generation":1,"agents":[]}"#).unwrap();
        s.save_desired(br#"{"generation":2,"agents":[]}"#).unwrap();
        assert_eq!(s.desired().unwrap().unwrap(), r#"{"generation":2,"agents":[]}"#);
        assert!(fs::read_dir(&root).unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().contains(".tmp")));
        s.write_pat("coder", b"pat_1", None).unwrap();
        assert_eq!(fs::metadata(s.pat_path("coder")).unwrap().mode() & 0o777, 0o600);
        assert_eq!(fs::metadata(s.pat_path("coder").parent().unwrap()).unwrap().mode() & 0o777, 0o700);
        s.write_pat("gone", b"pat_2", None).unwrap();
        assert_eq!(s.prune_pats(&|a| a == "coder"), vec!["gone"]);
        assert!(s.pat_path("coder").exists() && !s.pat_path("gone").exists());
        // an existing directory with loose permissions is tightened
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        StateDir::open(&root).unwrap();
        assert_eq!(fs::metadata(&root).unwrap().mode() & 0o777, 0o700);
    }
}
