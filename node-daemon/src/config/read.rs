//! Reads node.yaml's tree into typed values and records every problem with its line instead of
//! stopping at the first (docs/reference.md#node-configuration-nodeyaml): a field that is
//! missing or of the wrong type is recorded and replaced by a placeholder, so the rest of the
//! file is still read and checked.

use super::problem::{join, Problem};
use super::yaml::{Node, Value};
use std::collections::BTreeMap;

/// Where a value is: its field's path and the line to report.
#[derive(Debug, Clone, Copy)]
pub struct At<'a> {
    pub path: &'a str,
    pub line: usize,
}

#[derive(Debug, Default)]
pub struct Reader {
    pub problems: Vec<Problem>,
    /// Every field the file has: its path → the line of its key (or of the list item).
    pub lines: BTreeMap<String, usize>,
    /// Fields replaced by a placeholder: a rule about their value would be about the placeholder.
    pub placeholders: Vec<String>,
}

/// A mapping of fixed fields being read: its entries, and the fields asked for so far.
pub struct Fields<'n> {
    path: String,
    line: Option<usize>,
    entries: Vec<(String, usize, &'n Node)>,
    asked: Vec<&'static str>,
}

/// Whole-number types a field can have, with their bounds for the message.
pub trait Whole: TryFrom<i128> {
    const MIN: i128;
    const MAX: i128;
}

impl Whole for u32 {
    const MIN: i128 = 0;
    const MAX: i128 = u32::MAX as i128;
}

impl Whole for u64 {
    const MIN: i128 = 0;
    const MAX: i128 = u64::MAX as i128;
}

impl Whole for i64 {
    const MIN: i128 = i64::MIN as i128;
    const MAX: i128 = i64::MAX as i128;
}

impl Reader {
    /// Starts reading `node` as a mapping of fixed fields; None (recorded) when it is not one.
    /// `line` is None only for the document itself.
    pub fn fields<'n>(&mut self, node: &'n Node, path: &str, line: Option<usize>) -> Option<Fields<'n>> {
        let Value::Map(raw) = &node.value else {
            let expected = if path.is_empty() { "a mapping of node.yaml's fields" } else { "a mapping" };
            return self.wrong(node, At { path, line: line.unwrap_or(node.line) }, expected);
        };
        let mut entries: Vec<(String, usize, &Node)> = Vec::new();
        let mut seen = BTreeMap::new();
        for (key, value) in raw {
            let Some(name) = self.key(key, path) else { continue };
            if self.first_time(&mut seen, key, path, &name, "field") {
                entries.push((name, key.line, value));
            }
        }
        Some(Fields { path: path.to_string(), line, entries, asked: Vec::new() })
    }

    /// An optional field: None when absent or null, or (recorded) of the wrong type.
    pub fn optional<T>(
        &mut self,
        f: &mut Fields,
        key: &'static str,
        read: impl FnOnce(&mut Reader, &Node, At) -> Option<T>,
    ) -> Option<T> {
        f.asked.push(key);
        let (_, line, node) = f.entries.iter().find(|(k, _, _)| k == key)?;
        if node.is_null() {
            return None;
        }
        let path = join(&f.path, key);
        read(self, node, At { path: &path, line: *line })
    }

    /// A required field; when missing or of the wrong type, recorded and a placeholder instead.
    pub fn required<T: Default>(
        &mut self,
        f: &mut Fields,
        key: &'static str,
        read: impl FnOnce(&mut Reader, &Node, At) -> Option<T>,
    ) -> T {
        f.asked.push(key);
        let path = join(&f.path, key);
        let got = match f.entries.iter().find(|(k, _, _)| k == key) {
            Some((_, line, node)) => read(self, node, At { path: &path, line: *line }),
            None => {
                let message = format!("missing field `{key}`{}", in_path(&f.path));
                self.problems.push(Problem::on_line(f.line, message));
                None
            }
        };
        self.or_placeholder(got, &path)
    }

    /// Records every entry of `f` that no field asked for.
    pub fn finish(&mut self, f: Fields) {
        for (name, line, _) in &f.entries {
            if !f.asked.contains(&name.as_str()) {
                let message =
                    format!("unknown field `{name}`{}; expected one of: {}", in_path(&f.path), f.asked.join(", "));
                self.problems.push(Problem::on_line(Some(*line), message));
            }
        }
    }

    /// A list whose items `item` reads; an item of the wrong type is recorded and a placeholder.
    pub fn list<T: Default>(
        &mut self,
        node: &Node,
        at: At,
        mut item: impl FnMut(&mut Reader, &Node, At) -> Option<T>,
    ) -> Option<Vec<T>> {
        let Value::List(items) = &node.value else { return self.wrong(node, at, "a list") };
        let mut out = Vec::with_capacity(items.len());
        for (i, n) in items.iter().enumerate() {
            let path = format!("{}[{i}]", at.path);
            self.lines.insert(path.clone(), n.line);
            let got = item(self, n, At { path: &path, line: n.line });
            out.push(self.or_placeholder(got, &path));
        }
        Some(out)
    }

    /// A mapping of names the file chooses (executor kinds, environment variables) to values
    /// `value` reads.
    pub fn map<T: Default>(
        &mut self,
        node: &Node,
        at: At,
        mut value: impl FnMut(&mut Reader, &Node, At) -> Option<T>,
    ) -> Option<BTreeMap<String, T>> {
        let Value::Map(entries) = &node.value else { return self.wrong(node, at, "a mapping") };
        let mut out = BTreeMap::new();
        let mut seen = BTreeMap::new();
        for (k, v) in entries {
            let Some(name) = self.key(k, at.path) else { continue };
            if !self.first_time(&mut seen, k, at.path, &name, "key") {
                continue;
            }
            let path = join(at.path, &name);
            let got = value(self, v, At { path: &path, line: k.line });
            out.insert(name, self.or_placeholder(got, &path));
        }
        Some(out)
    }

    /// Any scalar as text: YAML reads `image: 1.0` as a number, node.yaml as the string.
    pub fn string(&mut self, node: &Node, at: At) -> Option<String> {
        match &node.value {
            Value::Scalar { text, .. } if !node.is_null() => Some(text.clone()),
            _ => self.wrong(node, at, "a string"),
        }
    }

    pub fn whole<T: Whole>(&mut self, node: &Node, at: At) -> Option<T> {
        let Some(n) = plain(node).and_then(integer) else { return self.wrong(node, at, "a whole number") };
        match T::try_from(n) {
            Ok(v) => Some(v),
            Err(_) => self.wrong(node, at, &format!("a whole number from {} to {}", T::MIN, T::MAX)),
        }
    }

    pub fn number(&mut self, node: &Node, at: At) -> Option<f64> {
        match plain(node).and_then(|t| integer(t).map(|n| n as f64).or_else(|| float(t))) {
            Some(v) => Some(v),
            None => self.wrong(node, at, "a number"),
        }
    }

    pub fn boolean(&mut self, node: &Node, at: At) -> Option<bool> {
        match plain(node).filter(|t| is_bool(t)) {
            Some(t) => Some(t.eq_ignore_ascii_case("true")),
            None => self.wrong(node, at, "true or false"),
        }
    }

    /// A mapping's key as a name; None (recorded) for a list or a mapping used as a key.
    fn key(&mut self, key: &Node, path: &str) -> Option<String> {
        match &key.value {
            Value::Scalar { text, .. } => Some(text.clone()),
            _ => {
                let message = format!("a key{} must be a name, not {}", in_path(path), describe(key));
                self.problems.push(Problem::on_line(Some(key.line), message));
                None
            }
        }
    }

    /// Whether `name` is new in the mapping at `path` (`seen`: its keys so far, with their
    /// lines); a repeated one is recorded. Where the key is goes to `lines`.
    fn first_time(
        &mut self,
        seen: &mut BTreeMap<String, usize>,
        key: &Node,
        path: &str,
        name: &str,
        what: &str,
    ) -> bool {
        if let Some(first) = seen.get(name) {
            let message = format!("duplicate {what} `{name}`{} (first on line {first})", in_path(path));
            self.problems.push(Problem::on_line(Some(key.line), message));
            return false;
        }
        seen.insert(name.to_string(), key.line);
        self.lines.entry(join(path, name)).or_insert(key.line);
        true
    }

    fn wrong<T>(&mut self, node: &Node, at: At, expected: &str) -> Option<T> {
        let mut p = Problem::of(at.path, format!("expected {expected}, got {}", describe(node)));
        p.line = Some(at.line);
        self.problems.push(p);
        None
    }

    fn or_placeholder<T: Default>(&mut self, got: Option<T>, path: &str) -> T {
        got.unwrap_or_else(|| {
            self.placeholders.push(path.to_string());
            T::default()
        })
    }
}

/// ` in executors.k`, or nothing at the top.
fn in_path(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!(" in {path}")
    }
}

/// A value as a message shows it: numbers and booleans as written, strings quoted.
fn describe(node: &Node) -> String {
    match &node.value {
        Value::List(_) => "a list".into(),
        Value::Map(_) => "a mapping".into(),
        Value::Scalar { .. } if node.is_null() => "nothing".into(),
        Value::Scalar { text, plain: true } if integer(text).is_some() || float(text).is_some() => text.clone(),
        Value::Scalar { text, plain: true } if is_bool(text) => text.clone(),
        Value::Scalar { text, .. } => format!("{text:?}"),
    }
}

/// The text of a plain (unquoted) scalar: only those are numbers or booleans.
fn plain(node: &Node) -> Option<&str> {
    match &node.value {
        Value::Scalar { text, plain: true } => Some(text),
        _ => None,
    }
}

/// A YAML 1.2 core-schema boolean.
fn is_bool(text: &str) -> bool {
    matches!(text, "true" | "True" | "TRUE" | "false" | "False" | "FALSE")
}

/// A YAML 1.2 core-schema integer: decimal with an optional sign, `0o` octal or `0x` hex.
fn integer(text: &str) -> Option<i128> {
    if let Some(hex) = text.strip_prefix("0x") {
        return i128::from_str_radix(hex, 16).ok().filter(|_| hex.bytes().all(|c| c.is_ascii_hexdigit()));
    }
    if let Some(oct) = text.strip_prefix("0o") {
        return i128::from_str_radix(oct, 8).ok().filter(|_| oct.bytes().all(|c| c.is_ascii_digit()));
    }
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// A YAML 1.2 core-schema float: digits with a point or an exponent, `.inf` or `.nan`.
fn float(text: &str) -> Option<f64> {
    let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
    if matches!(unsigned, ".inf" | ".Inf" | ".INF") {
        return Some(if text.starts_with('-') { f64::NEG_INFINITY } else { f64::INFINITY });
    }
    if matches!(text, ".nan" | ".NaN" | ".NAN") {
        return Some(f64::NAN);
    }
    // Rust's parser also takes `inf` and `NaN`, which YAML reads as strings.
    let numeric = unsigned.bytes().all(|c| c.is_ascii_digit() || b".eE+-".contains(&c));
    if !numeric || !unsigned.bytes().next().is_some_and(|c| c.is_ascii_digit() || c == b'.') {
        return None;
    }
    text.parse().ok()
}
