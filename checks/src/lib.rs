#![forbid(unsafe_code)]
//! Repository checks that read the source tree as text, so they hold whatever state the
//! crates they read are in: the controller's module graph (no circles, no module importing
//! from its parent), the length of its functions, that no comment records an issue number,
//! and that every reference from the code to `docs/` names a heading that exists. The checks themselves are the tests in `tests/`;
//! this library only finds the files.

use std::path::{Path, PathBuf};

/// The repository's root (this crate's parent directory).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

/// Every file under `dir` whose name ends with `ext`, sorted, skipping `target` directories.
pub fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n != "target" && n != ".git") {
                    stack.push(p);
                }
            } else if p.to_string_lossy().ends_with(ext) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

pub mod graph;
pub mod issues;
pub mod rust;
