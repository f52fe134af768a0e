//! Functions fit on a screen: none in any crate's `src` is over 80 lines (the controller,
//! the node, the API types, the CLI, the devkit, the simulator, the e2e support library and
//! these checks; unit-test modules inside `src` count too). Integration tests under each
//! crate's `tests/` are not read: about twenty scenario tests there run longer and read top to
//! bottom as one story each. A longer function is doing several jobs; split it by what they
//! are.

use fleet_checks::rust;

const MAX_LINES: usize = 80;

/// The crates whose `src` is read, relative to the repository.
const CRATES: &[&str] = &["operator", "node-daemon", "api", "cli", "devkit", "sim", "e2e", "checks"];

#[test]
fn no_function_in_any_crate_is_over_80_lines() {
    let mut long = Vec::new();
    let mut seen = 0;
    for krate in CRATES {
        let src = fleet_checks::repo().join(krate).join("src");
        for file in fleet_checks::files(&src, ".rs") {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            for f in rust::functions(&rust::code_only(&text)) {
                seen += 1;
                if f.lines > MAX_LINES {
                    long.push(format!("{}:{} fn {} is {} lines", file.display(), f.line, f.name, f.lines));
                }
            }
        }
    }
    assert!(seen > 1000, "found only {seen} functions: has a crate moved?");
    assert!(long.is_empty(), "over {MAX_LINES} lines:\n{}", long.join("\n"));
}

#[test]
fn the_length_check_sees_a_long_function() {
    let body = "    x += 1;\n".repeat(MAX_LINES);
    let code = format!("fn long() {{\n{body}}}\nfn short() {{}}\n");
    let spans = rust::functions(&rust::code_only(&code));
    assert_eq!(
        spans.iter().map(|f| (f.name.as_str(), f.lines)).collect::<Vec<_>>(),
        [("long", MAX_LINES + 2), ("short", 1)]
    );
}
