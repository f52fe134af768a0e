//! node.yaml (docs/reference.md#node-configuration-nodeyaml): `${NAME}` taken from the environment
//! on every line but comments, then the YAML read field by field into [`NodeConfig`], every
//! problem listed at once with its line: syntax aside, an unknown field, a value of the wrong
//! type or a missing field does not stop the reading, and the rules run on what was read.

mod problem;
mod read;
mod rules;
mod schema;
mod types;
mod yaml;

pub use problem::Problem;
pub use rules::FLEET_ENV;
pub use types::{CapacityConfig, Executor, NodeConfig, ResourceLimits};

use std::path::Path;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("cannot read {path}: {error}")]
    Read { path: String, error: String },
    #[error("unset environment variables: {}", .0.join(", "))]
    Unset(Vec<String>),
    /// The text is not YAML; the error names the line and column.
    #[error("{path}: {error}")]
    Parse { path: String, error: String },
    #[error("{path}: invalid configuration:\n  - {}", list(.problems))]
    Invalid { path: String, problems: Vec<Problem> },
}

fn list(problems: &[Problem]) -> String {
    problems.iter().map(Problem::to_string).collect::<Vec<_>>().join("\n  - ")
}

/// Replaces `${NAME}` from `env` on every line that is not a comment; lists every unset name.
pub fn substitute(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, ConfigError> {
    let mut out = String::with_capacity(text.len());
    let mut unset: Vec<String> = Vec::new();
    for line in text.split_inclusive('\n') {
        if line.trim_start().starts_with('#') {
            out.push_str(line);
            continue;
        }
        let mut rest = line;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            match after.find('}') {
                Some(end) => {
                    let name = &after[..end];
                    match env(name) {
                        Some(v) => out.push_str(&v),
                        None => {
                            if !unset.iter().any(|u| u == name) {
                                unset.push(name.to_string());
                            }
                        }
                    }
                    rest = &after[end + 1..];
                }
                None => {
                    out.push_str(&rest[start..]);
                    rest = "";
                }
            }
        }
        out.push_str(rest);
    }
    if unset.is_empty() {
        Ok(out)
    } else {
        Err(ConfigError::Unset(unset))
    }
}

impl NodeConfig {
    /// Reads, substitutes, parses and validates `path`.
    pub fn load(path: &Path) -> Result<NodeConfig, ConfigError> {
        let p = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|e| ConfigError::Read { path: p.clone(), error: e.to_string() })?;
        Self::parse(&text, &p, &|k| std::env::var(k).ok())
    }

    pub fn parse(text: &str, path: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<NodeConfig, ConfigError> {
        let text = substitute(text, env)?;
        let tree =
            yaml::parse(&text).map_err(|e| ConfigError::Parse { path: path.to_string(), error: e.to_string() })?;
        let mut reader = read::Reader::default();
        let config = schema::node_config(&mut reader, &tree);
        let mut problems = reader.problems;
        if let Some(config) = &config {
            problems.extend(rule_problems(config, &reader.lines, &reader.placeholders));
        }
        // In the file's order; what has no line (a missing top-level field) last.
        problems.sort_by_key(|p| (p.line.is_none(), p.line));
        match config {
            Some(config) if problems.is_empty() => Ok(config),
            _ => Err(ConfigError::Invalid { path: path.to_string(), problems }),
        }
    }
}

/// The rules' problems with their lines, leaving out those about a placeholder: its field is
/// already reported as missing or of the wrong type.
fn rule_problems(
    config: &NodeConfig,
    lines: &std::collections::BTreeMap<String, usize>,
    placeholders: &[String],
) -> Vec<Problem> {
    let mut out = config.problems();
    out.retain(|p| !placeholders.iter().any(|at| problem::is_within(&p.field, at)));
    for p in &mut out {
        p.line = problem::line_of(&p.field, lines);
    }
    out
}

#[cfg(test)]
mod tests;
