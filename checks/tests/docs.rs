//! The docs checked against the code and against themselves, by reading the tree as text.
//!
//! - `docs/reference.md` names every environment variable the programs read, every error
//!   code with its HTTP status, every route of the contract and of the router, every
//!   `node.yaml` field, and every subcommand and flag of the three programs.
//! - Every citation of the docs — `docs/<file>.md#<anchor>` in any text file, a quoted
//!   heading after `docs/<file>.md`, and every relative markdown link — names a file and a
//!   heading that exist. An anchor is the GitHub slug of a heading: lowercase, spaces to
//!   `-`, punctuation other than `-` and `_` dropped, `-1`, `-2`… for repeated headings.
//! - No text file cites the working specification that lives outside the repository.
//!
//! Each scan is deliberately simple (no parser of Rust or Markdown): it reads what the code
//! writes in one shape, and each says what it reads. Each also checks that it found
//! something, so a moved file makes the test fail rather than pass on nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    fleet_checks::repo()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn reference() -> String {
    read(&repo().join("docs/reference.md"))
}

fn rel(path: &Path) -> String {
    path.strip_prefix(repo()).unwrap_or(path).display().to_string()
}

/// Directories no check reads: build output, VCS data, generated or binary test inputs and
/// caches.
const SKIPPED_DIRS: &[&str] = &[
    "target",
    ".git",
    "fuzz/corpus",
    "fuzz/corpus-run",
    "fuzz/artifacts",
    ".schemathesis",
    ".fleet-dev",
    "node_modules",
    "__pycache__",
];

/// Extensions of the text files the citation checks read; besides them `Dockerfile*` and
/// the scripts under `.ci/`.
const TEXT_EXTENSIONS: &[&str] =
    &["rs", "md", "yaml", "yml", "sh", "py", "toml", "txt", "json", "js", "css", "html", "tpl", "sql"];

/// Every text file of the repository (UTF-8 only: a binary test input is skipped), sorted.
fn text_files() -> Vec<PathBuf> {
    let root = repo();
    let mut out = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            let r = rel(&p);
            if p.is_dir() {
                let name = p.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
                if !SKIPPED_DIRS.contains(&r.as_str()) && !SKIPPED_DIRS.contains(&name.as_str()) {
                    stack.push(p);
                }
                continue;
            }
            let name = p.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
            let ext = p.extension().map(|x| x.to_string_lossy().to_string()).unwrap_or_default();
            let text =
                TEXT_EXTENSIONS.contains(&ext.as_str()) || name.starts_with("Dockerfile") || r.starts_with(".ci/");
            if text && std::fs::read_to_string(&p).is_ok() {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The `.rs` files under `dir` (repository-relative), sorted.
fn rust_files(dir: &str) -> Vec<PathBuf> {
    fleet_checks::files(&repo().join(dir), ".rs")
}

// ---- headings and anchors ------------------------------------------------------------------

/// The GitHub slug of a heading's text: inline code marks and link targets dropped, then
/// lowercase, each space a `-`, every other character that is not a letter, a digit, `-` or
/// `_` dropped.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // `[text](target)` → `text`.
    while let Some(open) = rest.find("](") {
        let Some(close) = rest[open..].find(')') else { break };
        text.push_str(&rest[..open]);
        rest = &rest[open + close + 1..];
    }
    text.push_str(rest);
    text.trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .flat_map(char::to_lowercase)
        .collect()
}

/// The ATX headings of a markdown text (outside fenced code blocks), in order.
fn headings(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in markdown.lines() {
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            fenced = !fenced;
            continue;
        }
        if fenced || !t.starts_with('#') {
            continue;
        }
        let hashes = t.chars().take_while(|&c| c == '#').count();
        if hashes > 6 || !t[hashes..].starts_with(' ') {
            continue;
        }
        out.push(t[hashes..].trim().trim_end_matches('#').trim().to_string());
    }
    out
}

/// The anchors of a markdown text: each heading's slug, repeated ones numbered as GitHub
/// numbers them.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for h in headings(markdown) {
        let s = slug(&h);
        let n = seen.entry(s.clone()).or_insert(0);
        out.insert(if *n == 0 { s.clone() } else { format!("{s}-{n}") });
        *n += 1;
    }
    out
}

#[test]
fn slugs_follow_githubs_rule() {
    assert_eq!(slug("Node configuration (node.yaml)"), "node-configuration-nodeyaml");
    assert_eq!(slug("The node's loops"), "the-nodes-loops");
    assert_eq!(slug("`fleet-controller dev` and devkit"), "fleet-controller-dev-and-devkit");
    assert_eq!(slug("Health, contract, metrics and web view"), "health-contract-metrics-and-web-view");
    assert_eq!(slug("A [link](x.md) here — and FLEET_E2E"), "a-link-here--and-fleet_e2e");
    let a = anchors("# T\n## Memory\n```\n## not a heading\n```\n## Memory\n### Memory\n");
    assert_eq!(a, ["memory", "memory-1", "memory-2", "t"].map(String::from).into_iter().collect());
}

// ---- the reference names what the code has ---------------------------------------------------

/// The backticked spans of `text`.
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// The part of the reference under the `## ` heading `title`, up to the next `## `.
fn section<'a>(doc: &'a str, title: &str) -> &'a str {
    let start = doc
        .find(&format!("\n## {title}\n"))
        .unwrap_or_else(|| panic!("docs/reference.md has no section \"## {title}\""));
    let body = &doc[start + 1..];
    let end = body[3..].find("\n## ").map_or(body.len(), |e| e + 3);
    &body[..end]
}

/// `"FLEET_…"` string literals: the names the programs read from the environment
/// (`std::env::var("FLEET_…")`, clap's `env = "FLEET_…"`, the config reader's
/// `r.opt("FLEET_…")`), in the sources of the controller, the node, fleetctl, the shared API
/// crate and devkit. A name inside a longer string (a message) is not a literal of its own.
#[test]
fn reference_names_every_environment_variable_the_programs_read() {
    let mut names = BTreeSet::new();
    for dir in ["operator/src", "node-daemon/src", "cli/src", "api/src", "devkit/src"] {
        for f in rust_files(dir) {
            let text = read(&f);
            for (i, _) in text.match_indices("\"FLEET_") {
                let name: String =
                    text[i + 1..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if text[i + 1 + name.len()..].starts_with('"') {
                    names.insert(name);
                }
            }
        }
    }
    assert!(names.len() >= 30, "the scan found only {names:?}: did the config code move?");
    let doc = reference();
    let spans: BTreeSet<&str> = code_spans(&doc).into_iter().collect();
    let missing: Vec<_> = names.iter().filter(|n| !spans.contains(n.as_str())).collect();
    assert!(missing.is_empty(), "docs/reference.md does not name these variables (as `NAME`): {missing:?}");
}

/// What `StatusCode::X` means as a number, for the names the HTTP code uses.
fn status_number(name: &str) -> u16 {
    match name {
        "BAD_REQUEST" => 400,
        "UNAUTHORIZED" => 401,
        "FORBIDDEN" => 403,
        "NOT_FOUND" => 404,
        "METHOD_NOT_ALLOWED" => 405,
        "REQUEST_TIMEOUT" => 408,
        "CONFLICT" => 409,
        "PAYLOAD_TOO_LARGE" => 413,
        "TOO_MANY_REQUESTS" => 429,
        "REQUEST_HEADER_FIELDS_TOO_LARGE" => 431,
        "INTERNAL_SERVER_ERROR" => 500,
        "SERVICE_UNAVAILABLE" => 503,
        other => panic!("add StatusCode::{other} to status_number"),
    }
}

/// `api/src/codes.rs`: every `pub const NAME: &str = "code";` whose value is a code
/// (lowercase and `_`) must have a row in a table of the reference. The HTTP status each code
/// is answered with comes from the controller's sources: a `StatusCode::X` followed within a
/// few characters by `codes::NAME` (`ApiError::new(StatusCode::CONFLICT, codes::NODE_NAME_TAKEN,
/// …)`); that number must be in the code's row.
#[test]
fn reference_names_every_error_code_with_its_http_status() {
    let codes_rs = read(&repo().join("api/src/codes.rs"));
    let mut codes: BTreeMap<String, String> = BTreeMap::new();
    for line in codes_rs.lines() {
        let t = line.trim();
        let Some(rest) = t.strip_prefix("pub const ") else { continue };
        let Some((name, value)) = rest.split_once(": &str = \"") else { continue };
        let value = value.trim_end_matches("\";");
        if !value.is_empty() && value.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            codes.insert(name.to_string(), value.to_string());
        }
    }
    assert!(codes.len() >= 20, "the scan of api/src/codes.rs found only {codes:?}");

    let mut statuses: BTreeMap<String, BTreeSet<u16>> = BTreeMap::new();
    for f in rust_files("operator/src") {
        let text = read(&f);
        for (i, _) in text.match_indices("StatusCode::") {
            let after = &text[i + "StatusCode::".len()..];
            let status: String = after.chars().take_while(|c| c.is_ascii_uppercase() || *c == '_').collect();
            let rest = after[status.len()..].trim_start_matches(|c: char| c == ',' || c.is_whitespace());
            let Some(code) = rest.strip_prefix("codes::").or_else(|| rest.strip_prefix("fleet_api::codes::")) else {
                continue;
            };
            let name: String = code.chars().take_while(|c| c.is_ascii_uppercase() || *c == '_').collect();
            statuses.entry(name).or_default().insert(status_number(&status));
        }
    }
    assert!(statuses.len() >= 10, "the scan of the controller found statuses for only {statuses:?}");

    let doc = reference();
    let rows: Vec<&str> = doc.lines().filter(|l| l.starts_with('|')).collect();
    let mut problems = Vec::new();
    for (name, code) in &codes {
        let cell = format!("| `{code}` |");
        let Some(row) = rows.iter().find(|r| r.starts_with(&cell)) else {
            problems.push(format!("{code}: no table row starting with {cell}"));
            continue;
        };
        for status in statuses.get(name).into_iter().flatten() {
            if !row.contains(&status.to_string()) {
                problems.push(format!("{code}: its row does not say HTTP {status}"));
            }
        }
    }
    assert!(problems.is_empty(), "docs/reference.md, error codes:\n{}", problems.join("\n"));
}

/// Every operation of `openapi/fleet.json` as `` `METHOD /path` ``, and every path the
/// controller's routers mount (a `.route("/path", …)` anywhere in `operator/src`, the path
/// perhaps on the next line, which also
/// catches `/metrics`, `/ui` and the rest outside the contract) followed by a backtick.
#[test]
fn reference_names_every_route_of_the_contract_and_the_router() {
    let doc = reference();
    let contract: serde_json::Value =
        serde_json::from_str(&read(&repo().join("openapi/fleet.json"))).expect("openapi/fleet.json is JSON");
    let paths = contract["paths"].as_object().expect("the contract has paths");
    let mut missing = Vec::new();
    let mut operations = 0;
    for (path, ops) in paths {
        for method in ops.as_object().into_iter().flat_map(|o| o.keys()) {
            if !["get", "put", "post", "delete", "patch"].contains(&method.as_str()) {
                continue;
            }
            operations += 1;
            let route = format!("`{} {path}`", method.to_uppercase());
            if !doc.contains(&route) {
                missing.push(route);
            }
        }
    }
    assert!(operations >= 15, "openapi/fleet.json has only {operations} operations");

    let mut mounted = BTreeSet::new();
    for f in rust_files("operator/src") {
        let text = read(&f);
        for (i, _) in text.match_indices(".route(") {
            let Some(arg) = text[i + ".route(".len()..].trim_start().strip_prefix('"') else { continue };
            mounted.insert(arg.chars().take_while(|&c| c != '"').collect::<String>());
        }
    }
    assert!(mounted.len() >= 15 && mounted.contains("/metrics"), "the routers' scan found {mounted:?}");
    for path in &mounted {
        if !doc.contains(&format!(" {path}`")) {
            missing.push(format!("`METHOD {path}`"));
        }
    }
    assert!(missing.is_empty(), "docs/reference.md does not list these routes: {missing:?}");
}

/// `snake_case` → `camelCase`.
fn camel(snake: &str) -> String {
    let mut out = String::new();
    let mut up = false;
    for c in snake.chars() {
        if c == '_' {
            up = true;
        } else if up {
            out.extend(c.to_uppercase());
            up = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// The structs node.yaml is read into, one field per node.yaml field.
const NODE_YAML_STRUCTS: [&str; 4] = ["NodeConfig", "Executor", "CapacityConfig", "ResourceLimits"];

/// The node's configuration types: in the `node-daemon/src` file that defines
/// `pub struct NodeConfig`, every `pub field:` of each of [`NODE_YAML_STRUCTS`], in camelCase
/// as node.yaml names it, must be a word of a backticked span in the reference's node.yaml
/// section.
#[test]
fn reference_names_every_node_yaml_field() {
    let file = rust_files("node-daemon/src")
        .into_iter()
        .find(|f| read(f).contains("pub struct NodeConfig"))
        .expect("a node-daemon source defines NodeConfig");
    let text = read(&file);
    let mut fields = BTreeSet::new();
    let mut inside = false;
    for line in text.lines() {
        let t = line.trim();
        let opens = t.strip_prefix("pub struct ").and_then(|r| r.strip_suffix(" {"));
        if opens.is_some_and(|name| NODE_YAML_STRUCTS.contains(&name)) {
            inside = true;
        } else if inside && t == "}" {
            inside = false;
        } else if inside {
            if let Some((name, _)) = t.strip_prefix("pub ").and_then(|r| r.split_once(':')) {
                fields.insert(camel(name.trim()));
            }
        }
    }
    assert!(fields.len() >= 25, "the scan of {} found only {fields:?}", rel(&file));
    let doc = reference();
    let words: BTreeSet<&str> = code_spans(section(&doc, "Node configuration (node.yaml)"))
        .into_iter()
        .flat_map(|s| s.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
        .collect();
    let missing: Vec<_> = fields.iter().filter(|f| !words.contains(f.as_str())).collect();
    assert!(missing.is_empty(), "docs/reference.md's node.yaml section does not name: {missing:?}");
}

/// `CamelCase` → `kebab-case`, as clap names subcommands; `snake_case` → `kebab-case`, as it
/// names long flags.
fn kebab(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('-');
            }
            out.push(c.to_ascii_lowercase());
        } else if c == '_' {
            out.push('-');
        } else {
            out.push(c);
        }
    }
    out
}

/// The clap definitions of one program, read from its sources: the variants of every enum
/// marked `derive(… Subcommand …)` (one line each, at the enum's first indentation; a variant
/// after `#[command(hide = true)]` is left out), and every field after an `#[arg(…)]` that says
/// `long` (its `long = "name"`, else the field's name) and is not `hide = true`.
fn clap_of(dir: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut subcommands = BTreeSet::new();
    let mut flags = BTreeSet::new();
    for f in rust_files(dir) {
        let text = read(&f);
        if !text.contains("clap") {
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let t = line.trim();
            if t.starts_with("#[derive(") && t.contains("Subcommand") {
                subcommands.extend(variants(&lines[i + 1..]));
            }
            if t.starts_with("#[arg(") {
                flags.extend(flag(&lines[i..]));
            }
        }
    }
    (subcommands, flags)
}

/// The variants (kebab-case) of the enum that starts in `lines`, but hidden ones.
fn variants(lines: &[&str]) -> Vec<String> {
    let Some(start) = lines.iter().position(|l| l.contains("enum ")) else { return Vec::new() };
    let body = &lines[start + 1..];
    let indent = body.first().map_or(0, |l| l.len() - l.trim_start().len());
    let mut out = Vec::new();
    let mut hidden = false;
    for l in body.iter().take_while(|l| l.trim() != "}") {
        if l.len() - l.trim_start().len() != indent {
            continue;
        }
        let t = l.trim();
        if t.starts_with("#[command(") && t.contains("hide = true") {
            hidden = true;
        } else if t.starts_with(|c: char| c.is_ascii_uppercase()) {
            if !hidden {
                out.push(kebab(&t.chars().take_while(|c| c.is_ascii_alphanumeric()).collect::<String>()));
            }
            hidden = false;
        }
    }
    out
}

/// The long flag an `#[arg(…)]` starting at `lines[0]` (perhaps over several lines) declares
/// for the field after it, unless it has no `long` or is hidden.
fn flag(lines: &[&str]) -> Option<String> {
    let mut attr = String::new();
    let mut end = 0;
    for (k, l) in lines.iter().enumerate() {
        attr.push(' ');
        attr.push_str(l.trim());
        end = k;
        if l.trim().ends_with(")]") {
            break;
        }
    }
    let says_long = [" #[arg(long", " long,", " long)", " long ="].iter().any(|p| attr.contains(p));
    if !says_long || attr.contains("hide = true") {
        return None;
    }
    if let Some(name) = attr.split("long = \"").nth(1).and_then(|r| r.split('"').next()) {
        return Some(format!("--{name}"));
    }
    let field = lines[end + 1..].iter().map(|l| l.trim()).find(|l| !l.starts_with('#') && !l.starts_with("//"))?;
    let (name, _) = field.trim_start_matches("pub ").split_once(':')?;
    Some(format!("--{}", kebab(name.trim())))
}

/// Whether `text` has `needle` not followed by another letter, digit or `-` (so `fleetctl
/// nodes` does not count as `fleetctl node`, nor `--wait` as `--wai`).
fn has_word(text: &str, needle: &str) -> bool {
    text.match_indices(needle)
        .any(|(i, _)| !text[i + needle.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-'))
}

/// Every subcommand of fleet-controller, fleet-node and fleetctl, as `<program> <command>`, and
/// every long flag of each, in the program's section of the reference.
#[test]
fn reference_names_every_subcommand_and_flag() {
    let doc = reference();
    let mut problems = Vec::new();
    for (dir, program, title, fewest) in [
        ("operator/src", "fleet-controller", "fleet-controller commands", 6),
        ("node-daemon/src", "fleet-node", "fleet-node commands", 3),
        ("cli/src", "fleetctl", "fleetctl", 10),
    ] {
        let (subcommands, flags) = clap_of(dir);
        assert!(subcommands.len() >= fewest, "{program}: the scan of {dir} found only {subcommands:?}");
        assert!(!flags.is_empty(), "{program}: the scan of {dir} found no flags");
        let part = section(&doc, title);
        for s in &subcommands {
            // A nested subcommand is named after its parent (`fleetctl rollout pause`).
            let nested = subcommands.iter().any(|p| has_word(part, &format!("{program} {p} {s}")));
            if !has_word(part, &format!("{program} {s}")) && !nested {
                problems.push(format!("{program} {s}"));
            }
        }
        for f in &flags {
            if !has_word(part, f) {
                problems.push(format!("{program} {f}"));
            }
        }
    }
    assert!(problems.is_empty(), "docs/reference.md does not name: {problems:?}");
}

// ---- citations and links resolve ---------------------------------------------------------

/// The anchors of each markdown file, read once.
#[derive(Default)]
struct Docs(BTreeMap<PathBuf, Option<BTreeSet<String>>>);

impl Docs {
    /// Whether `file` exists and, when `anchor` is given, has a heading with that anchor.
    fn resolves(&mut self, file: &Path, anchor: Option<&str>) -> Result<(), String> {
        let known =
            self.0.entry(file.to_path_buf()).or_insert_with(|| std::fs::read_to_string(file).ok().map(|t| anchors(&t)));
        match (known, anchor) {
            (None, _) => Err(format!("{} does not exist", rel(file))),
            (Some(_), None) => Ok(()),
            (Some(a), Some(x)) if a.contains(x) => Ok(()),
            (Some(_), Some(x)) => Err(format!("{} has no heading with the anchor #{x}", rel(file))),
        }
    }

    fn headings_of(&self, file: &Path) -> Vec<String> {
        std::fs::read_to_string(file).map(|t| headings(&t)).unwrap_or_default()
    }
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/')
}

fn is_anchor_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// `markdown` with its fenced code blocks and inline code spans blanked out, byte for byte
/// (so offsets stay), for finding links: `[a-z]([a-z-]*)` in code is no link.
fn without_code(markdown: &str) -> String {
    let mut out = String::with_capacity(markdown.len());
    let mut fenced = false;
    for line in markdown.split_inclusive('\n') {
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            fenced = !fenced;
        }
        if fenced || t.starts_with("```") || t.starts_with("~~~") {
            for c in line.chars() {
                if c == '\n' {
                    out.push(c);
                } else {
                    out.extend(std::iter::repeat_n(' ', c.len_utf8()));
                }
            }
            continue;
        }
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
                out.push(' ');
            } else if in_code {
                out.extend(std::iter::repeat_n(' ', c.len_utf8()));
            } else {
                out.push(c);
            }
        }
    }
    out
}

/// `text` (markdown) with the targets of its links (`](…)`, outside code) blanked out, and
/// the targets.
fn split_links(text: &str) -> (String, Vec<String>) {
    let code_free = without_code(text);
    let mut plain = text.to_string().into_bytes();
    let mut targets = Vec::new();
    let mut from = 0;
    while let Some(i) = code_free[from..].find("](").map(|i| i + from) {
        let at = i + 2;
        let Some(len) = code_free[at..].find(|c: char| c == ')' || c.is_whitespace()) else { break };
        targets.push(text[at..at + len].to_string());
        for b in &mut plain[at..at + len] {
            *b = b' ';
        }
        from = at + len;
    }
    (String::from_utf8(plain).unwrap_or_default(), targets)
}

/// The bare citations `<path>.md#<anchor>` of a text: a run of path characters before `.md#`
/// and of anchor characters after it. URLs (`…://…`) are not citations.
fn bare_citations(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices(".md#") {
        let start = text[..i].rfind(|c: char| !is_path_char(c)).map_or(0, |s| s + 1);
        let path = &text[start..i + 3];
        let anchor: String = text[i + 4..].chars().take_while(|&c| is_anchor_char(c)).collect();
        let placeholder = path == ".md" || path.ends_with("/.md") || anchor.is_empty();
        if placeholder || text[..start].ends_with(':') || path.starts_with('/') || path.contains("//") {
            continue;
        }
        out.push((path.to_string(), anchor));
    }
    out
}

/// Quoted references after a docs path — the path, an optional comma, a space and a quoted
/// heading or table text — on one line.
fn quoted_headings(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices(".md") {
        let start = text[..i].rfind(|c: char| !is_path_char(c)).map_or(0, |s| s + 1);
        let path = &text[start..i + 3];
        if !path.starts_with("docs/") {
            continue;
        }
        let after = &text[i + 3..];
        let Some(q) = after.strip_prefix(", \"").or_else(|| after.strip_prefix(" \"")) else { continue };
        if let Some(end) = q.find(['"', '\n']) {
            if q[end..].starts_with('"') {
                out.push((path.to_string(), q[..end].to_string()));
            }
        }
    }
    out
}

/// Every citation of the docs in every text file: `docs/<file>.md#<anchor>` (and a root
/// `<FILE>.md#<anchor>`) resolves from the repository's root; a quoted text after a docs path
/// is a heading of that file or text in it (a troubleshooting row's symptom). A path or an
/// anchor that is a placeholder (`<file>`, an empty anchor) is no citation. In markdown files
/// the link targets are checked by `links_between_docs_resolve`, and code spans are examples,
/// so both are left out here.
#[test]
fn citations_name_a_file_and_a_heading_that_exist() {
    let root = repo();
    let mut docs = Docs::default();
    let mut problems = Vec::new();
    let mut found = 0;
    for f in text_files() {
        let text = read(&f);
        let plain =
            if f.extension().is_some_and(|e| e == "md") { without_code(&split_links(&text).0) } else { text.clone() };
        for (path, anchor) in bare_citations(&plain) {
            found += 1;
            if let Err(e) = docs.resolves(&root.join(&path), Some(&anchor)) {
                problems.push(format!("{}: {path}#{anchor}: {e}", rel(&f)));
            }
        }
        for (path, heading) in quoted_headings(&plain) {
            found += 1;
            let file = root.join(&path);
            let body = std::fs::read_to_string(&file).unwrap_or_default().replace('`', "").to_lowercase();
            let heading_there = docs.headings_of(&file).iter().any(|h| h.eq_ignore_ascii_case(&heading));
            if !heading_there && !body.contains(&heading.to_lowercase()) {
                problems.push(format!("{}: {path} \"{heading}\": no such heading or text in {path}", rel(&f)));
            }
        }
    }
    assert!(found >= 50, "only {found} citations of docs/ found");
    assert!(problems.is_empty(), "citations that do not resolve:\n{}", problems.join("\n"));
}

/// Every relative link of every markdown file — to another doc with an anchor, to a file
/// such as `../crds/…`, to an anchor of the same page — names a file that exists (relative to the linking file), and, for a link to a
/// markdown file or within one, a heading with that anchor.
#[test]
fn links_between_docs_resolve() {
    let mut docs = Docs::default();
    let mut problems = Vec::new();
    let mut found = 0;
    for f in text_files().into_iter().filter(|f| f.extension().is_some_and(|e| e == "md")) {
        let dir = f.parent().unwrap_or(Path::new("")).to_path_buf();
        for target in split_links(&read(&f)).1 {
            let target = target.trim_matches(|c| c == '<' || c == '>');
            if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                continue;
            }
            found += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target, None),
            };
            let file = if path.is_empty() { f.clone() } else { dir.join(path) };
            let anchor = if file.extension().is_some_and(|e| e == "md") { anchor } else { None };
            let result = if file.extension().is_some_and(|e| e == "md") {
                docs.resolves(&file, anchor)
            } else if file.exists() {
                Ok(())
            } else {
                Err(format!("{} does not exist", rel(&file)))
            };
            if let Err(e) = result {
                problems.push(format!("{}: ({target}): {e}", rel(&f)));
            }
        }
    }
    assert!(found >= 30, "only {found} relative markdown links found");
    assert!(problems.is_empty(), "markdown links that do not resolve:\n{}", problems.join("\n"));
}

/// Where the outside working documents may still be named, and why:
/// - `operator/migrations/`: sqlx checksums each migration file whole, comments included, and
///   refuses to start on a database that applied a file whose bytes changed since; their
///   comments stay as they were applied.
const OUTSIDE_ALLOWED: &[(&str, &str)] = &[
    ("operator/migrations/", ""),
    // CI's default for the test API server's folder, which the CI machine keeps beside the
    // checkout (CONTRIBUTING.md#kubernetes-against-a-real-api-server).
    (".ci/run", concat!("..", "/shared/kube")),
];

/// No text file cites the working specification or the design notes that live outside the
/// repository: no section sign followed by a digit (the old citations were the specification's
/// name and a section number, or a bare section number beside one), not the specification's name
/// as an upper-case word, not the file name of either document, no path into the directory
/// beside the checkout. The patterns are built at run time, so this file does not hold them.
#[test]
fn nothing_cites_the_outside_specification() {
    let section_sign = '\u{a7}';
    let words = [["SP", "EC"].concat()];
    let names = [["SP", "EC.md"].concat(), ["DESI", "GN.md"].concat(), ["..", "/shared"].concat()];
    let mut problems = Vec::new();
    for f in text_files() {
        let r = rel(&f);
        let text = read(&f);
        let allowed: Vec<&str> = OUTSIDE_ALLOWED.iter().filter(|(p, _)| r.starts_with(p)).map(|(_, s)| *s).collect();
        if allowed.contains(&"") {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            let mut line = line.to_string();
            for a in &allowed {
                line = line.replace(a, "");
            }
            let mut bad: Vec<String> = Vec::new();
            if line
                .char_indices()
                .any(|(i, c)| c == section_sign && line[i + c.len_utf8()..].starts_with(|d: char| d.is_ascii_digit()))
            {
                bad.push(format!("{section_sign}N"));
            }
            for w in &words {
                if line.match_indices(w.as_str()).any(|(i, _)| {
                    let before = line[..i].chars().next_back();
                    let after = line[i + w.len()..].chars().next();
                    !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                        && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
                }) {
                    bad.push(w.clone());
                }
            }
            bad.extend(names.iter().filter(|x| line.contains(x.as_str())).cloned());
            if !bad.is_empty() {
                problems.push(format!("{r}:{}: {} in: {}", n + 1, bad.join(", "), line.trim()));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "text that cites the outside specification (cite docs/<file>.md#<anchor> instead):\n{}",
        problems.join("\n")
    );
}
