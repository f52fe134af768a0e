//! The file names of scheduled backups (docs/operations.md#backup-and-restore): `--out` may hold
//! `{time}`, replaced by the UTC time the backup is taken (`20261207T031700Z`, so names sort as
//! times do), and `--keep N` removes all but the newest N files of the same pattern — what a
//! CronJob of a FROM-scratch image, which has no shell to name files or clean up, needs.

use std::path::{Path, PathBuf};

/// The placeholder for the time a backup is taken.
pub const TIME: &str = "{time}";

fn stamp(ms: i64) -> String {
    crate::clock::rfc3339_ms(ms).replace(['-', ':'], "")
}

/// The file a backup at `now_ms` writes, from `--out`.
pub fn out_file(template: &Path, now_ms: i64) -> PathBuf {
    PathBuf::from(template.display().to_string().replace(TIME, &stamp(now_ms)))
}

/// The files of `template`'s pattern (its file name with `{time}`) in its directory, oldest
/// first; none when the name has no `{time}`.
fn matching(template: &Path) -> std::io::Result<Vec<PathBuf>> {
    let name = template.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    let Some((before, after)) = name.split_once(TIME) else { return Ok(Vec::new()) };
    let dir = template.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let width = stamp(0).len();
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.len() == before.len() + width + after.len() && n.starts_with(before) && n.ends_with(after))
        .filter(|n| n[before.len()..before.len() + width].bytes().all(|b| b.is_ascii_digit() || b == b'T' || b == b'Z'))
        .map(|n| dir.join(n))
        .collect();
    found.sort();
    Ok(found)
}

/// Removes all but the newest `keep` files of `template`'s pattern; returns those removed.
pub fn prune(template: &Path, keep: usize) -> std::io::Result<Vec<PathBuf>> {
    let found = matching(template)?;
    let old = found.len().saturating_sub(keep);
    let removed: Vec<PathBuf> = found.into_iter().take(old).collect();
    for f in &removed {
        std::fs::remove_file(f)?;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scheduled_backup_is_named_by_its_time_and_the_oldest_go() {
        let dir = tempfile::tempdir().unwrap();
        let template = dir.path().join("fleet-{time}.sqlite");
        assert_eq!(out_file(&template, 1_700_000_000_123), dir.path().join("fleet-20231114T221320Z.sqlite"));
        for i in 0..5 {
            std::fs::write(out_file(&template, 1_700_000_000_000 + i * 86_400_000), b"x").unwrap();
        }
        std::fs::write(dir.path().join("fleet-notatime.sqlite"), b"x").unwrap();
        std::fs::write(dir.path().join("other-20231114T221320Z.sqlite"), b"x").unwrap();
        let removed = prune(&template, 2).unwrap();
        assert_eq!(removed.len(), 3);
        assert!(removed[0].ends_with("fleet-20231114T221320Z.sqlite"), "the oldest first: {removed:?}");
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "fleet-20231117T221320Z.sqlite",
                "fleet-20231118T221320Z.sqlite",
                "fleet-notatime.sqlite",
                "other-20231114T221320Z.sqlite"
            ]
        );
        assert!(prune(&dir.path().join("plain.sqlite"), 0).unwrap().is_empty(), "no {{time}}: nothing goes");
    }
}
