//! No comment records an issue number: a comment says why, in words a reader of the code can
//! follow without the tracker (`fleet_checks::issues` says which shapes count). Read are the
//! comments of every Rust file in the repository (line, block and doc comments; strings are
//! not comments) and the `#` comments of the shell scripts, YAML, TOML, Python files and
//! Dockerfiles. The prose under `docs/` is not read: the measurement journals there are
//! dated by the issue they measured for.

use std::path::{Path, PathBuf};

use fleet_checks::{issues, rust};

/// Files whose comments start with `#`.
fn hash_commented(path: &Path) -> bool {
    let name = path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    let ext = path.extension().map(|x| x.to_string_lossy().to_string()).unwrap_or_default();
    name.starts_with("Dockerfile")
        || ["sh", "yaml", "yml", "toml", "py"].contains(&ext.as_str())
        || path.parent().and_then(Path::file_name).is_some_and(|d| d == ".ci")
}

/// `file:line: citation` for every citation in `comments` (a file's comments, lines kept).
fn report(file: &Path, comments: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (n, line) in comments.lines().enumerate() {
        for cite in issues::citations(line) {
            out.push(format!("{}:{}: {cite}", file.display(), n + 1));
        }
    }
    out
}

fn read(file: &Path) -> String {
    std::fs::read_to_string(file).unwrap_or_default()
}

#[test]
fn no_comment_records_an_issue_number() {
    let root = fleet_checks::repo();
    let rust_files = fleet_checks::files(&root, ".rs");
    let others: Vec<PathBuf> = fleet_checks::files(&root, "")
        .into_iter()
        .filter(|p| hash_commented(p) && !p.starts_with(root.join("fuzz/corpus")))
        .collect();
    assert!(rust_files.len() > 200 && others.len() > 20, "found {} and {} files", rust_files.len(), others.len());
    let mut found = Vec::new();
    for file in &rust_files {
        found.extend(report(file, &rust::comments_only(&read(file))));
    }
    for file in &others {
        found.extend(report(file, &issues::hash_comments(&read(file))));
    }
    assert!(found.is_empty(), "comments that record an issue number:\n{}", found.join("\n"));
}

#[test]
fn the_issue_check_sees_a_citation_in_a_comment_and_not_in_a_string() {
    let code = "/// Waits (#61).\nfn f() {\n    let s = \"issue 62\"; // see issue 62\n    /* issue #60 */\n}\n";
    let got = report(Path::new("x.rs"), &rust::comments_only(code));
    assert_eq!(got, ["x.rs:1: #61", "x.rs:3: issue 62", "x.rs:4: #60"]);
    let yaml = "key: \"#1\" # issue 9\n";
    assert_eq!(report(Path::new("x.yaml"), &issues::hash_comments(yaml)), ["x.yaml:1: issue 9"]);
}
