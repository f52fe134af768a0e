//! One problem of node.yaml: the field it is about, what is wrong, and the line it is on
//! (docs/reference.md#node-configuration-nodeyaml).

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// None for what is not in the file: a missing top-level field, a default.
    pub line: Option<usize>,
    /// The field's path (`capacity.slots`, `labels[1]`); empty when the message names it.
    pub field: String,
    pub message: String,
}

impl Problem {
    /// A problem of `field`, its line not known yet.
    pub fn of(field: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem { line: None, field: field.into(), message: message.into() }
    }

    /// A problem on `line` whose message says which field it is about.
    pub fn on_line(line: Option<usize>, message: impl Into<String>) -> Problem {
        Problem { line, field: String::new(), message: message.into() }
    }

    /// The problem without its line: `field: message`.
    pub fn what(&self) -> String {
        if self.field.is_empty() {
            self.message.clone()
        } else {
            format!("{}: {}", self.field, self.message)
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: {}", self.what()),
            None => f.write_str(&self.what()),
        }
    }
}

/// `path.key`, or `key` at the top.
pub fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Whether `field` is `at` or inside it (`capacity.slots` is inside `capacity`; everything is
/// inside the empty path).
pub fn is_within(field: &str, at: &str) -> bool {
    at.is_empty()
        || field.strip_prefix(at).is_some_and(|rest| rest.is_empty() || rest.starts_with('.') || rest.starts_with('['))
}

/// The line of `field`, or of the nearest enclosing field the file has.
pub fn line_of(field: &str, lines: &BTreeMap<String, usize>) -> Option<usize> {
    let mut at = field;
    loop {
        if let Some(line) = lines.get(at) {
            return Some(*line);
        }
        at = &at[..at.rfind(['.', '['])?];
    }
}
