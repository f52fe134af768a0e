//! Just enough of Rust's surface to check a crate's shape from its text: a file's module
//! path, its code without comments, strings and test modules, the paths it names
//! (`crate::…`, `super::…`, `self::…`, including `use` groups), and its functions' spans.
//! Not a parser: it reads the code this repository writes (rustfmt-formatted), and the
//! tests in `tests/` hold it to the crates as they are.

use std::path::Path;

/// The module path of `file` under the crate's `src`: `src/store/db/mod.rs` → `["store",
/// "db"]`; `lib.rs` and `main.rs` are the root (`[]`).
pub fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        parts.clear();
    }
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The code of a file with comments, string and char literals blanked (same length, newlines
/// kept, so line numbers still hold).
pub fn code_only(text: &str) -> String {
    split(text).0
}

/// The comments of a file (line, block and doc comments) with everything else blanked: code,
/// string and char literals (same length, newlines kept, so line numbers still hold).
pub fn comments_only(text: &str) -> String {
    split(text).1
}

/// A file as its code and its comments, each the length of the file with the other part
/// (and string and char literals, in both) blanked.
fn split(text: &str) -> (String, String) {
    let b = text.as_bytes();
    let mut code = Vec::with_capacity(b.len());
    let mut comments = Vec::with_capacity(b.len());
    let mut i = 0;
    let blank = |c: u8| if c == b'\n' { b'\n' } else { b' ' };
    // Each byte goes to one side as itself and to the other blanked (newlines kept).
    let mut both = |c: u8, to_code: bool, to_comments: bool| {
        code.push(if to_code { c } else { blank(c) });
        comments.push(if to_comments { c } else { blank(c) });
    };
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    both(b[i], false, true);
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 0;
                while i < b.len() {
                    if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                        depth += 1;
                        both(b' ', false, false);
                        both(b' ', false, false);
                        i += 2;
                    } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                        depth -= 1;
                        both(b' ', false, false);
                        both(b' ', false, false);
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        both(b[i], false, true);
                        i += 1;
                    }
                }
            }
            b'r' if raw_string_start(b, i).is_some() => {
                let (hashes, body) = raw_string_start(b, i).unwrap_or((0, i));
                let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
                let end =
                    b[body..].windows(close.len()).position(|w| w == close).map_or(b.len(), |p| body + p + close.len());
                for &c in &b[i..end] {
                    both(c, false, false);
                }
                i = end;
            }
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                let end = (j + 1).min(b.len());
                for &c in &b[i..end] {
                    both(c, false, false);
                }
                i = end;
            }
            b'\'' if char_literal_len(b, i).is_some() => {
                let n = char_literal_len(b, i).unwrap_or(1);
                for &c in &b[i..(i + n).min(b.len())] {
                    both(c, false, false);
                }
                i += n;
            }
            c => {
                both(c, true, false);
                i += 1;
            }
        }
    }
    (String::from_utf8_lossy(&code).into_owned(), String::from_utf8_lossy(&comments).into_owned())
}

/// `r"`, `r#"`, `br"` …: the number of hashes and where the body starts.
fn raw_string_start(b: &[u8], i: usize) -> Option<(usize, usize)> {
    if i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_') && b[i - 1] != b'b' {
        return None;
    }
    let mut j = i + 1;
    while b.get(j) == Some(&b'#') {
        j += 1;
    }
    (b.get(j) == Some(&b'"')).then_some((j - i - 1, j + 1))
}

/// The length of a char literal starting at `i` (`'a'`, `'\n'`, `'\u{1F}'`), `None` for a
/// lifetime or a label.
fn char_literal_len(b: &[u8], i: usize) -> Option<usize> {
    if b.get(i + 1) == Some(&b'\\') {
        let end = b[i + 2..].iter().position(|&c| c == b'\'')?;
        return Some(end + 3);
    }
    let ch = std::str::from_utf8(&b[i + 1..(i + 5).min(b.len())])
        .ok()
        .or_else(|| (1..4).rev().find_map(|n| std::str::from_utf8(&b[i + 1..(i + 1 + n).min(b.len())]).ok()))?;
    let c = ch.chars().next()?;
    (b.get(i + 1 + c.len_utf8()) == Some(&b'\'')).then_some(c.len_utf8() + 2)
}

/// The code with every `#[cfg(test)]` item removed (test modules may use their parent).
pub fn without_tests(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        let end = item_end(after).unwrap_or(after.len());
        out.extend(after[..end].chars().map(|c| if c == '\n' { '\n' } else { ' ' }));
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// Where the item starting at the beginning of `s` ends: after its `;` or its braced body.
fn item_end(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut depth = 0usize;
    for (i, &c) in b.iter().enumerate() {
        match c {
            b';' if depth == 0 => return Some(i + 1),
            b'{' => depth += 1,
            b'}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// Every path the code names from `crate`, `super` or `self`, as segments with the keyword
/// first, `use` groups expanded (`use super::{a::B, c}` gives `super::a::B` and `super::c`).
pub fn paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let b = code.as_bytes();
    for kw in ["crate", "super", "self"] {
        let mut from = 0;
        while let Some(off) = code[from..].find(kw) {
            let at = from + off;
            from = at + kw.len();
            let before_ok = at == 0 || !(b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_' || b[at - 1] == b':');
            // `pub(in crate::a)` names a visibility, not a dependency.
            let visibility = code[..at].trim_end().ends_with("(in");
            if !before_ok || visibility || !code[from..].starts_with("::") {
                continue;
            }
            expand(&code[at..], Vec::new(), &mut out);
        }
    }
    out
}

/// Reads one path (with groups) at the start of `s`, prefixed by `prefix`.
fn expand(s: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut segs = prefix;
    let mut rest = s;
    loop {
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if name.is_empty() {
            if let Some(group) = rest.strip_prefix('{') {
                for part in split_group(group) {
                    expand(part.trim_start(), segs.clone(), out);
                }
                return;
            }
            break;
        }
        segs.push(name.clone());
        rest = &rest[name.len()..];
        match rest.strip_prefix("::") {
            Some(r) => rest = r,
            None => break,
        }
    }
    if !segs.is_empty() {
        out.push(segs);
    }
}

/// The top-level comma-separated parts of a `use` group body (up to its closing brace).
fn split_group(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                parts.push(&s[start..i]);
                return parts;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts
}

/// A function found in a file: its name, first line (1-based) and length in lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FnSpan {
    pub name: String,
    pub line: usize,
    pub lines: usize,
}

/// Every function with a body in `code` (comments and strings already blanked), nested ones
/// included, with its length from the `fn` line to its closing brace.
pub fn functions(code: &str) -> Vec<FnSpan> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(off) = code[from..].find("fn ") {
        let at = from + off;
        from = at + 3;
        if at > 0 && (b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_') {
            continue;
        }
        let name: String = code[at + 3..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if name.is_empty() {
            continue;
        }
        let Some(open) = body_start(&code[at..]) else { continue };
        let Some(len) = item_end(&code[at + open..]) else { continue };
        let line = code[..at].matches('\n').count() + 1;
        let last = code[..at + open + len].matches('\n').count() + 1;
        out.push(FnSpan { name, line, lines: last - line + 1 });
    }
    out
}

/// The offset of a function's opening brace, `None` for a declaration without a body.
fn body_start(s: &str) -> Option<usize> {
    let mut depth = 0i32;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' | '<' => depth += 1,
            ')' | ']' => depth -= 1,
            '>' if !s[..i].ends_with('-') && !s[..i].ends_with('=') => depth -= 1,
            ';' if depth <= 0 => return None,
            '{' if depth <= 0 => return Some(i),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_paths_follow_the_file_layout() {
        let src = Path::new("/x/src");
        assert_eq!(module_of(src, Path::new("/x/src/lib.rs")), Vec::<String>::new());
        assert_eq!(module_of(src, Path::new("/x/src/store/mod.rs")), ["store"]);
        assert_eq!(module_of(src, Path::new("/x/src/store/db/rows.rs")), ["store", "db", "rows"]);
    }

    #[test]
    fn comments_and_strings_are_blanked_keeping_lines() {
        let code = code_only("let a = \"crate::x\"; // super::y\n/* self::z */ let c = 'q'; r#\"a\"b\"#;\nx");
        assert!(!code.contains("crate::x") && !code.contains("super::y") && !code.contains("self::z"));
        assert!(!code.contains('q') && !code.contains("a\"b"));
        assert_eq!(code.lines().count(), 3);
        assert!(code.ends_with('x'));
    }

    #[test]
    fn lifetimes_are_not_char_literals() {
        let code = code_only("fn f<'a>(x: &'a str) -> &'a str { x }");
        assert!(code.contains("'a") && code.contains("{ x }"), "{code}");
    }

    #[test]
    fn use_groups_are_expanded() {
        let got = paths("use super::{db::{Db, Row}, Id};\nfn f() { crate::clock::now(); }");
        let got: Vec<String> = got.iter().map(|p| p.join("::")).collect();
        assert!(got.contains(&"super::db::Db".to_string()), "{got:?}");
        assert!(got.contains(&"super::db::Row".to_string()), "{got:?}");
        assert!(got.contains(&"super::Id".to_string()), "{got:?}");
        assert!(got.contains(&"crate::clock::now".to_string()), "{got:?}");
    }

    #[test]
    fn test_items_are_left_out() {
        let code = without_tests("use crate::a;\n#[cfg(test)]\nmod tests {\n use super::*;\n}\nuse crate::b;");
        let got: Vec<String> = paths(&code).iter().map(|p| p.join("::")).collect();
        assert_eq!(got, ["crate::a", "crate::b"]);
    }

    #[test]
    fn function_spans_count_from_fn_to_closing_brace() {
        let code = "fn a() {\n    let x = 1;\n}\n\ntrait T { fn d(&self); }\npub async fn b<'a>(x: &'a str) -> Result<(), E> where E: X {\n}\n";
        let got = functions(code);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0], FnSpan { name: "a".into(), line: 1, lines: 3 });
        assert_eq!(got[1], FnSpan { name: "b".into(), line: 6, lines: 2 });
    }
}
