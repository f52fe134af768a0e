//! Functions in the controller fit on a screen or two: none is over 100 lines. A longer one
//! is doing several jobs; split it by what they are.

use fleet_checks::rust;

const MAX_LINES: usize = 100;

#[test]
fn no_function_in_the_controller_is_over_100_lines() {
    let src = fleet_checks::repo().join("operator/src");
    let mut long = Vec::new();
    for file in fleet_checks::files(&src, ".rs") {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for f in rust::functions(&rust::code_only(&text)) {
            if f.lines > MAX_LINES {
                long.push(format!("{}:{} fn {} is {} lines", file.display(), f.line, f.name, f.lines));
            }
        }
    }
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
