//! The guard's own files (docs/behaviour.md#the-guards-own-files): what a container binds comes
//! from `guardDir`, a directory only the guard writes, never from a tree the node can write.
//! The engine resolves a bind source when the container **starts**, not when it is created,
//! and every start resolves it again; a path the node owns can be swapped for a link to `/`
//! between any two calls. So at create the guard reads the agent's PAT (from the node's state
//! directory) and each secret (from the secrets directory) itself — every component opened
//! without following a link, the file regular, with no other hard link, the PAT the node's
//! own — and binds copies it wrote into a new directory of its own, given to the container's
//! user (`0400`). Before each start it writes them again from the same sources (a secret
//! changed since is seen), and a container removed takes its directory with it.

use rustix::fs::{Mode, OFlags, CWD};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The largest PAT or secret file the guard copies.
pub const MAX_FILE: u64 = 64 << 10;
/// The file a container's PAT is copied to in its directory.
const PAT_FILE: &str = "agent-pat";
/// Secret `<name>` is copied to `secret-<name>`.
const SECRET_FILE: &str = "secret-";
/// The container's lease directory in its directory.
const LEASE_DIR: &str = "busy";
/// How deep the guard goes into a lease directory to take it back (a container's own tree).
const MAX_LEASE_DEPTH: usize = 16;

/// Where a bound file's content comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The PAT the node opened for this agent: `hostStateDir/agents/<key>/agent-pat`.
    Pat(String),
    /// A file of the secrets directory.
    Secret(String),
    /// No content: the container's busy-lease directory (`crate::lease`), made by the guard
    /// for the container's user, the one directory a container may write.
    Lease,
}

impl Source {
    fn file_name(&self) -> String {
        match self {
            Source::Pat(_) => PAT_FILE.to_string(),
            Source::Secret(name) => format!("{SECRET_FILE}{name}"),
            Source::Lease => LEASE_DIR.to_string(),
        }
    }
}

/// Who a container runs as, by number: its files are given to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: Option<u32>,
}

/// The user a container runs as when the node runs as root and the kind names none.
pub const NOBODY: Owner = Owner { uid: 65534, gid: Some(65534) };

impl Owner {
    /// `uid` or `uid:gid`, numbers only.
    pub fn parse(user: &str) -> Option<Owner> {
        let num = |s: &str| (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok()).flatten();
        match user.split_once(':') {
            Some((u, g)) => Some(Owner { uid: num(u)?, gid: Some(num(g)?) }),
            None => Some(Owner { uid: num(user)?, gid: None }),
        }
    }

    /// The default user of a node running as `(uid, gid)`: that user, or [`NOBODY`] for root.
    pub fn of_node((uid, gid): (u32, u32)) -> Owner {
        if uid == 0 {
            NOBODY
        } else {
            Owner { uid, gid: Some(gid) }
        }
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.gid {
            Some(g) => write!(f, "{}:{g}", self.uid),
            None => write!(f, "{}", self.uid),
        }
    }
}

/// `guardDir` and the directories its copies are read from.
#[derive(Debug, Clone)]
pub struct Tree {
    pub dir: PathBuf,
    agents: PathBuf,
    secrets: PathBuf,
    /// The node's uid: a PAT file must be its own (not a link to another user's file).
    node_uid: u32,
}

impl Tree {
    pub fn new(dir: PathBuf, agents: PathBuf, secrets: PathBuf, node_uid: u32) -> Tree {
        Tree { dir, agents, secrets, node_uid }
    }

    pub fn node_uid(&self) -> u32 {
        self.node_uid
    }

    /// A new directory for a container being created: `guardDir/<16 hex>`, `0700`.
    pub fn new_dir(&self) -> Result<PathBuf, String> {
        let dir = self.dir.join(format!("{:016x}", rand::random::<u64>()));
        std::fs::create_dir(&dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("cannot restrict {}: {e}", dir.display()))?;
        Ok(dir)
    }

    /// Writes `source`'s content into `dir` for `owner`; the path a mount binds.
    pub fn copy(&self, dir: &Path, source: &Source, owner: Owner) -> Result<PathBuf, String> {
        if *source == Source::Lease {
            return lease_dir(dir, owner);
        }
        let content = self.read(source, owner.uid)?;
        let path = dir.join(source.file_name());
        write_for(&path, &content, owner).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        Ok(path)
    }

    /// The container directory and source of a bind path of this tree, `None` for any other.
    pub fn parse(&self, path: &str, agent: &str) -> Option<(PathBuf, Source)> {
        let path = Path::new(path);
        let dir = path.parent()?;
        let own = dir.parent() == Some(self.dir.as_path())
            && dir.file_name()?.to_str()?.len() == 16
            && dir.file_name()?.to_str()?.bytes().all(|b| b.is_ascii_hexdigit());
        let file = path.file_name()?.to_str()?;
        let source = match file.strip_prefix(SECRET_FILE) {
            Some(name) if fleet_api::names::is_secret_name(name) => Source::Secret(name.to_string()),
            None if file == PAT_FILE => Source::Pat(agent.to_string()),
            None if file == LEASE_DIR => Source::Lease,
            _ => return None,
        };
        own.then(|| (dir.to_path_buf(), source))
    }

    /// Removes a container's directory (it is gone, or its create failed); its lease
    /// directory, the container user's, is taken back first.
    pub fn remove_dir(&self, dir: &Path) {
        if dir.parent() == Some(self.dir.as_path()) {
            reclaim(&dir.join(LEASE_DIR), MAX_LEASE_DEPTH);
            if let Err(e) = std::fs::remove_dir_all(dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "docker-guard cannot remove a container's files");
            }
        }
    }

    /// The content of a source, read without following a link anywhere below its root. A PAT
    /// file is the node's own, or (a node running as root gives it away) the container user's.
    fn read(&self, source: &Source, container_uid: u32) -> Result<Vec<u8>, String> {
        match source {
            Source::Pat(agent) => read_beneath(&self.agents, &[agent, PAT_FILE], &[self.node_uid, container_uid]),
            Source::Secret(name) => read_beneath(&self.secrets, &[name], &[]),
            Source::Lease => Ok(Vec::new()),
        }
    }

    /// The lease of the container whose binds are `binds` (`agent` its agent): its lease
    /// directory in this tree, read without following a link.
    pub fn lease(&self, binds: &[String], agent: &str) -> Result<Option<crate::lease::Lease>, String> {
        let dir = binds.iter().filter_map(|b| self.parse(b, agent)).find(|(_, s)| *s == Source::Lease);
        match dir {
            Some((dir, _)) => crate::lease::read_in(&dir.join(LEASE_DIR)),
            None => Ok(None),
        }
    }
}

/// The lease directory in `dir` for `owner`, `0700`: made when missing (at create, or after a
/// reboot emptied a `guardDir` on tmpfs), left as it is otherwise (a restart of the container
/// keeps its directory; the node counts only a lease written since the run began).
fn lease_dir(dir: &Path, owner: Owner) -> Result<PathBuf, String> {
    use std::os::unix::fs::DirBuilderExt;
    let path = dir.join(LEASE_DIR);
    let fail = |e: std::io::Error| format!("cannot make {}: {e}", path.display());
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_dir() => return Ok(path),
        Ok(_) => std::fs::remove_file(&path).map_err(fail)?,
        Err(_) => {}
    }
    std::fs::DirBuilder::new().mode(0o700).create(&path).map_err(fail)?;
    // The mode is set before the directory is given away (changing it after would take
    // CAP_FOWNER).
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).map_err(fail)?;
    std::os::unix::fs::lchown(&path, Some(owner.uid), owner.gid).map_err(fail)?;
    Ok(path)
}

/// Gives `path` and every directory below it (to `depth`) back to the guard's user, so that
/// removing the tree needs no more than CAP_CHOWN: the container's user made what is in it.
/// Links are not followed (`lchown`).
fn reclaim(path: &Path, depth: usize) {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return };
    if !meta.file_type().is_dir() || depth == 0 {
        return;
    }
    let me = std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(0);
    let _ = std::os::unix::fs::lchown(path, Some(me), None);
    for e in std::fs::read_dir(path).into_iter().flatten().flatten() {
        reclaim(&e.path(), depth - 1);
    }
}

/// Reads `root/parts…`: `root` is the operator's (node.yaml) and may be a link; below it
/// every component is opened relative to the one before with `O_NOFOLLOW`, so nothing the
/// node swaps in between can lead elsewhere. The file must be regular, have no other hard
/// link (a link to a file the node cannot read would otherwise pass), be owned by one of
/// `owners` when any are given, and hold at most [`MAX_FILE`] bytes.
pub fn read_beneath(root: &Path, parts: &[&str], owners: &[u32]) -> Result<Vec<u8>, String> {
    let shown = parts.iter().fold(root.to_path_buf(), |p, c| p.join(c));
    let fail = |why: String| format!("{}: {why}", shown.display());
    let (last, dirs) = parts.split_last().ok_or_else(|| fail("no file named".into()))?;
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut fd: OwnedFd = rustix::fs::openat(CWD, root, dir_flags, Mode::empty()).map_err(|e| fail(e.to_string()))?;
    for part in dirs {
        fd = open_below(&fd, part, dir_flags | OFlags::NOFOLLOW).map_err(fail)?;
    }
    let file =
        open_below(&fd, last, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC).map_err(fail)?;
    read_checked(File::from(file), owners).map_err(fail)
}

fn open_below(dir: &OwnedFd, name: &str, flags: OFlags) -> Result<OwnedFd, String> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(format!("{name:?} is not a plain name"));
    }
    rustix::fs::openat(dir, name, flags, Mode::empty()).map_err(|e| match e {
        rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => format!("{name} is a symbolic link or not a directory"),
        e => format!("{name}: {e}"),
    })
}

fn read_checked(mut file: File, owners: &[u32]) -> Result<Vec<u8>, String> {
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.file_type().is_file() {
        return Err("not a regular file".into());
    }
    if meta.nlink() != 1 {
        return Err(format!("has {} hard links: only a file with one is copied", meta.nlink()));
    }
    if !owners.is_empty() && !owners.contains(&meta.uid()) {
        return Err(format!("is owned by uid {}, not the node's (uid {})", meta.uid(), owners[0]));
    }
    if meta.len() > MAX_FILE {
        return Err(format!("holds {} bytes, more than {MAX_FILE}", meta.len()));
    }
    let mut out = Vec::with_capacity(meta.len() as usize);
    Read::by_ref(&mut file).take(MAX_FILE + 1).read_to_end(&mut out).map_err(|e| e.to_string())?;
    if out.len() as u64 > MAX_FILE {
        return Err(format!("grew past {MAX_FILE} bytes while read"));
    }
    Ok(out)
}

/// `content` at `path` for `owner`, `0400`: written beside it and renamed into place, so the
/// file a start binds is always whole (an older copy already bound keeps its own content).
fn write_for(path: &Path, content: &[u8], owner: Owner) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(OFlags::NOFOLLOW.bits() as i32)
        .open(&tmp)?;
    f.write_all(content)?;
    // The mode first, while the file is still the guard's: once given away, changing it would
    // take CAP_FOWNER, which the guard has no need of otherwise.
    f.set_permissions(std::fs::Permissions::from_mode(0o400))?;
    std::os::unix::fs::fchown(&f, Some(owner.uid), owner.gid)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tree(t: &Path) -> Tree {
        for d in ["guard", "state/agents/coder", "secrets"] {
            std::fs::create_dir_all(t.join(d)).unwrap();
        }
        std::fs::write(t.join("state/agents/coder/agent-pat"), "pat").unwrap();
        std::fs::write(t.join("secrets/gh"), "token").unwrap();
        let uid = std::fs::metadata(t.join("state")).unwrap().uid();
        Tree::new(t.join("guard"), t.join("state/agents"), t.join("secrets"), uid)
    }

    #[test]
    fn copies_are_the_guards_own_files_given_to_the_container_s_user() {
        let t = tempfile::tempdir().unwrap();
        let tr = tree(t.path());
        let dir = tr.new_dir().unwrap();
        let owner = Owner { uid: 4321, gid: Some(4322) };
        let pat = tr.copy(&dir, &Source::Pat("coder".into()), owner).unwrap();
        let gh = tr.copy(&dir, &Source::Secret("gh".into()), owner).unwrap();
        assert_eq!(std::fs::read(&pat).unwrap(), b"pat");
        assert_eq!(std::fs::read(&gh).unwrap(), b"token");
        let m = std::fs::metadata(&gh).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (4321, 4322, 0o400));
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        assert_eq!(tr.parse(&pat.display().to_string(), "coder"), Some((dir.clone(), Source::Pat("coder".into()))));
        assert_eq!(tr.parse(&gh.display().to_string(), "coder"), Some((dir.clone(), Source::Secret("gh".into()))));
        assert_eq!(tr.parse(&t.path().join("state/agents/coder/agent-pat").display().to_string(), "coder"), None);
        tr.remove_dir(&dir);
        assert!(!dir.exists());
    }

    #[test]
    fn no_link_below_the_root_is_followed_and_only_plain_files_are_copied() {
        let t = tempfile::tempdir().unwrap();
        let tr = tree(t.path());
        let p = t.path();
        let pat = |agent: &str| tr.read(&Source::Pat(agent.into()), 4321);
        // The agent's directory swapped for a link to the host's root.
        std::fs::rename(p.join("state/agents/coder"), p.join("state/agents/old")).unwrap();
        symlink("/etc", p.join("state/agents/coder")).unwrap();
        assert!(pat("coder").unwrap_err().contains("coder is a symbolic link"), "{:?}", pat("coder"));
        // The file itself a link.
        std::fs::create_dir_all(p.join("state/agents/b")).unwrap();
        symlink("/etc/hostname", p.join("state/agents/b/agent-pat")).unwrap();
        assert!(pat("b").unwrap_err().contains("agent-pat is a symbolic link"));
        // A hard link of a file the node could not otherwise read.
        std::fs::create_dir_all(p.join("state/agents/c")).unwrap();
        std::fs::hard_link(p.join("secrets/gh"), p.join("state/agents/c/agent-pat")).unwrap();
        assert!(pat("c").unwrap_err().contains("2 hard links"));
        // A directory, a FIFO-like non-file, a big file.
        std::fs::create_dir_all(p.join("state/agents/d/agent-pat")).unwrap();
        assert!(pat("d").unwrap_err().contains("not a regular file"));
        std::fs::create_dir_all(p.join("state/agents/e")).unwrap();
        std::fs::write(p.join("state/agents/e/agent-pat"), vec![b'x'; MAX_FILE as usize + 1]).unwrap();
        assert!(pat("e").unwrap_err().contains("more than"));
        assert!(tr.read(&Source::Secret("missing".into()), 4321).unwrap_err().contains("missing"));
    }

    /// The lease directory is the guard's own making, given to the container's user, kept
    /// across a start, read without following a link, and removed with its container.
    #[test]
    fn a_lease_directory_is_made_read_and_removed_by_the_guard() {
        let t = tempfile::tempdir().unwrap();
        let tr = tree(t.path());
        let dir = tr.new_dir().unwrap();
        let me = std::fs::metadata(t.path()).unwrap().uid();
        let owner = Owner { uid: me, gid: None };
        let lease = tr.copy(&dir, &Source::Lease, owner).unwrap();
        assert_eq!(std::fs::metadata(&lease).unwrap().mode() & 0o777, 0o700);
        assert_eq!(tr.parse(&lease.display().to_string(), "coder"), Some((dir.clone(), Source::Lease)));
        let binds = [lease.display().to_string()];
        assert_eq!(tr.lease(&binds, "coder"), Ok(None));
        std::fs::write(lease.join(crate::lease::FILE), "1796000060").unwrap();
        assert_eq!(tr.copy(&dir, &Source::Lease, owner).unwrap(), lease, "a start keeps the directory");
        assert_eq!(tr.lease(&binds, "coder").unwrap().unwrap().text, "1796000060");
        std::fs::remove_file(lease.join(crate::lease::FILE)).unwrap();
        symlink(t.path().join("secrets/gh"), lease.join(crate::lease::FILE)).unwrap();
        assert!(tr.lease(&binds, "coder").unwrap_err().contains("symbolic link"));
        assert_eq!(tr.lease(&[], "coder"), Ok(None), "a container without a lease directory");
        std::fs::create_dir_all(lease.join("a/b")).unwrap();
        tr.remove_dir(&dir);
        assert!(!dir.exists());
    }

    #[test]
    fn a_pat_must_be_the_node_s_own_file() {
        let t = tempfile::tempdir().unwrap();
        let mut tr = tree(t.path());
        tr.node_uid += 1;
        assert!(tr.read(&Source::Pat("coder".into()), 4321).unwrap_err().contains("not the node's (uid"));
        let owner = tr.node_uid - 1;
        assert!(tr.read(&Source::Pat("coder".into()), owner).is_ok(), "given to the container's user");
    }

    #[test]
    fn users_are_read_by_number_and_root_nodes_give_nobody() {
        assert_eq!(Owner::parse("1000:1001"), Some(Owner { uid: 1000, gid: Some(1001) }));
        assert_eq!(Owner::parse("1000"), Some(Owner { uid: 1000, gid: None }));
        for bad in ["agent", "1000:staff", "", ":1", "1:", "-1", "1:2:3"] {
            assert_eq!(Owner::parse(bad), None, "{bad}");
        }
        assert_eq!(Owner::of_node((0, 0)), NOBODY);
        assert_eq!(Owner::of_node((10001, 10001)).to_string(), "10001:10001");
    }
}
