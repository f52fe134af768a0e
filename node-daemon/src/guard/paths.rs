//! Bind sources, resolved in the guard's view of the host (docs/behaviour.md#what-the-guard-checks-and-why).
//! A path that reads as under the node's directories can still lead anywhere once the engine
//! follows a symbolic link in it, and the PAT directory is the node's to write. So below an
//! allowed root no component may be a link, and the resolved path must stay under the root.
//! The roots themselves are the operator's (node.yaml), and may be links.

use std::path::{Component, Path, PathBuf};

/// Why a bind source is refused, or `Ok` when it is one of `roots`' own files.
pub fn check_bind(source: &str, roots: &[BindRoot]) -> Result<(), String> {
    let path = Path::new(source);
    let clean = path.is_absolute() && path.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    let root = roots.iter().find(|r| clean && r.admits_by_name(path));
    let Some(root) = root else {
        let names: Vec<String> = roots.iter().map(BindRoot::describe).collect();
        return Err(format!("bind source {source:?} is not allowed: only {}", names.join(" and ")));
    };
    root.resolves_inside(path).map_err(|why| format!("bind source {source:?} is not allowed: {why}"))
}

/// A directory bind sources may come from.
#[derive(Debug, Clone)]
pub struct BindRoot {
    pub dir: PathBuf,
    /// Only files directly in `dir` (secrets), rather than anything below it (PATs).
    pub direct_children_only: bool,
}

impl BindRoot {
    fn describe(&self) -> String {
        if self.direct_children_only {
            format!("files in {}", self.dir.display())
        } else {
            format!("{}/…", self.dir.display())
        }
    }

    fn admits_by_name(&self, path: &Path) -> bool {
        if self.direct_children_only {
            path.parent() == Some(self.dir.as_path())
        } else {
            path.starts_with(&self.dir) && path != self.dir
        }
    }

    /// No component below the root is a link, and the whole resolves under the resolved root.
    fn resolves_inside(&self, path: &Path) -> Result<(), String> {
        let rest = path.strip_prefix(&self.dir).map_err(|_| "outside its root".to_string())?;
        let mut at = self.dir.clone();
        for part in rest.components() {
            at.push(part);
            let meta = std::fs::symlink_metadata(&at)
                .map_err(|e| format!("{} cannot be checked in the guard's view of the host: {e}", at.display()))?;
            if meta.file_type().is_symlink() {
                return Err(format!("{} is a symbolic link", at.display()));
            }
        }
        let real_root = std::fs::canonicalize(&self.dir).map_err(|e| format!("{}: {e}", self.dir.display()))?;
        let real = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
        if real.starts_with(&real_root) && real != real_root {
            Ok(())
        } else {
            Err(format!("it resolves to {}, outside {}", real.display(), real_root.display()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn roots(t: &Path) -> Vec<BindRoot> {
        vec![
            BindRoot { dir: t.join("state/agents"), direct_children_only: false },
            BindRoot { dir: t.join("secrets"), direct_children_only: true },
        ]
    }

    #[test]
    fn sources_are_checked_after_resolution() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path();
        std::fs::create_dir_all(p.join("state/agents/coder")).unwrap();
        std::fs::write(p.join("state/agents/coder/agent-pat"), "x").unwrap();
        std::fs::create_dir_all(p.join("secrets")).unwrap();
        std::fs::write(p.join("secrets/gh"), "x").unwrap();
        let r = roots(p);
        let at = |s: &str| p.join(s).display().to_string();
        check_bind(&at("state/agents/coder/agent-pat"), &r).unwrap();
        check_bind(&at("secrets/gh"), &r).unwrap();

        // A link planted in the node-writable PAT directory, pointing at the host's root.
        symlink("/", p.join("state/agents/evil")).unwrap();
        let e = check_bind(&at("state/agents/evil/etc"), &r).unwrap_err();
        assert!(e.ends_with("state/agents/evil is a symbolic link"), "{e}");
        // A link as the last component.
        symlink("/etc/shadow", p.join("state/agents/coder/shadow")).unwrap();
        assert!(check_bind(&at("state/agents/coder/shadow"), &r).unwrap_err().contains("is a symbolic link"));
        // Not there: nothing to check it against, refused.
        assert!(check_bind(&at("state/agents/ghost/agent-pat"), &r).unwrap_err().contains("cannot be checked"));
        // By name.
        for bad in [
            "/",
            "/etc/passwd",
            "relative/x",
            &at("state/agents/../../secrets/gh"),
            &at("secrets/a/b"),
            &at("state/agents"),
        ] {
            assert!(check_bind(bad, &r).unwrap_err().contains("only "), "{bad}");
        }
    }

    #[test]
    fn a_root_that_is_itself_a_link_is_the_operators_choice() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path();
        std::fs::create_dir_all(p.join("real/secrets")).unwrap();
        std::fs::write(p.join("real/secrets/gh"), "x").unwrap();
        symlink(p.join("real/secrets"), p.join("secrets")).unwrap();
        std::fs::create_dir_all(p.join("state/agents")).unwrap();
        check_bind(&p.join("secrets/gh").display().to_string(), &roots(p)).unwrap();
    }
}
