//! Image allow-lists of docs/behaviour.md#images-an-agent-may-name. An entry admits a reference by comparing strings as
//! written (no Docker defaults): an exact entry admits only itself; an entry whose tag holds
//! one `*` admits any tag of the same repository that fits the pattern; a digest entry, or an
//! entry without a tag, admits only the identical reference.

use std::fmt;

/// Most entries one kind's `images` list may hold.
pub const MAX_ENTRIES: usize = 50;
/// Longest entry of an allow-list (docs/behaviour.md#hardening).
pub const MAX_ENTRY_LEN: usize = 512;

/// Why an allow-list entry was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatternError {
    pub entry: String,
    pub reason: &'static str,
}

impl fmt::Display for PatternError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "image pattern {:?}: {}", self.entry, self.reason)
    }
}

impl std::error::Error for PatternError {}

/// A reference split as docs/behaviour.md#images-an-agent-may-name reads it: the tag is what follows the last `:` after the last `/`.
struct Parts<'a> {
    repo: &'a str,
    tag: Option<&'a str>,
    digest: bool,
}

fn split(reference: &str) -> Parts<'_> {
    if reference.contains('@') {
        return Parts { repo: reference, tag: None, digest: true };
    }
    let last_slash = reference.rfind('/').map(|i| i + 1).unwrap_or(0);
    match reference[last_slash..].rfind(':') {
        Some(i) => {
            let at = last_slash + i;
            Parts { repo: &reference[..at], tag: Some(&reference[at + 1..]), digest: false }
        }
        None => Parts { repo: reference, tag: None, digest: false },
    }
}

fn tag_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'.' || c == b'-'
}

fn repo_ok(repo: &str) -> bool {
    !repo.is_empty()
        && !repo.starts_with('/')
        && !repo.ends_with('/')
        && !repo.contains("//")
        && repo.bytes().all(|c| c.is_ascii_alphanumeric() || b"._-/:".contains(&c))
}

/// Whether a string is a plausible image reference: what an agent may name and a node
/// may run. References containing `*` are never valid.
pub fn is_reference(reference: &str) -> bool {
    if reference.is_empty() || reference.len() > 512 || reference.contains('*') {
        return false;
    }
    let p = split(reference);
    if p.digest {
        let (repo, digest) = reference.split_once('@').unwrap_or((reference, ""));
        let repo_no_tag = split(repo);
        return repo_ok(repo_no_tag.repo)
            && repo_no_tag.tag.is_none_or(|t| !t.is_empty() && t.bytes().all(tag_char))
            && digest_ok(digest);
    }
    repo_ok(p.repo) && p.tag.is_none_or(|t| !t.is_empty() && t.len() <= 128 && t.bytes().all(tag_char))
}

fn digest_ok(d: &str) -> bool {
    match d.split_once(':') {
        Some((alg, hex)) => {
            !alg.is_empty()
                && alg.bytes().all(|c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'+' || c == b'.' || c == b'_' || c == b'-'
                })
                && hex.len() >= 32
                && hex.bytes().all(|c| c.is_ascii_hexdigit())
        }
        None => false,
    }
}

/// One parsed allow-list entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// Admits only the identical reference (digest entries, entries without a tag, exact tags).
    Exact(String),
    /// Admits `repo:<prefix><any tag characters><suffix>`.
    Tag { repo: String, prefix: String, suffix: String },
}

impl Pattern {
    /// Parses one entry, refusing a `*` outside the tag and more than one `*`.
    pub fn parse(entry: &str) -> Result<Pattern, PatternError> {
        let err = |reason| Err(PatternError { entry: entry.chars().take(100).collect(), reason });
        if entry.len() > MAX_ENTRY_LEN {
            return err("longer than 512 characters");
        }
        let stars = entry.matches('*').count();
        if stars > 1 {
            return err("at most one `*` is allowed");
        }
        if stars == 0 {
            if !is_reference(entry) {
                return err("not a valid image reference");
            }
            return Ok(Pattern::Exact(entry.to_string()));
        }
        let p = split(entry);
        if p.digest {
            return err("a digest entry cannot hold `*`");
        }
        let Some(tag) = p.tag else {
            return err("`*` is allowed only in the tag");
        };
        if p.repo.contains('*') || !repo_ok(p.repo) {
            return err("`*` is allowed only in the tag");
        }
        let (prefix, suffix) = tag.split_once('*').unwrap_or((tag, ""));
        if !prefix.bytes().all(tag_char) || !suffix.bytes().all(tag_char) {
            return err("the tag holds characters a tag cannot have");
        }
        Ok(Pattern::Tag { repo: p.repo.to_string(), prefix: prefix.to_string(), suffix: suffix.to_string() })
    }

    /// Whether this entry admits `reference`.
    pub fn admits(&self, reference: &str) -> bool {
        match self {
            Pattern::Exact(e) => e == reference,
            Pattern::Tag { repo, prefix, suffix } => {
                if !is_reference(reference) {
                    return false;
                }
                let p = split(reference);
                match (p.digest, p.tag) {
                    (false, Some(tag)) => {
                        p.repo == repo
                            && tag.len() >= prefix.len() + suffix.len()
                            && tag.starts_with(prefix.as_str())
                            && tag.ends_with(suffix.as_str())
                    }
                    _ => false,
                }
            }
        }
    }
}

/// A kind's parsed allow-list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList(Vec<Pattern>);

impl AllowList {
    /// Parses every entry, reporting all bad ones.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<AllowList, Vec<PatternError>> {
        let mut out = Vec::with_capacity(entries.len());
        let mut errors = Vec::new();
        for e in entries {
            match Pattern::parse(e.as_ref()) {
                Ok(p) => out.push(p),
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            Ok(AllowList(out))
        } else {
            Err(errors)
        }
    }

    pub fn admits(&self, reference: &str) -> bool {
        self.0.iter().any(|p| p.admits(reference))
    }
}

/// Convenience for a list not parsed ahead: unparseable entries admit nothing.
pub fn admits<S: AsRef<str>>(entries: &[S], reference: &str) -> bool {
    entries.iter().any(|e| Pattern::parse(e.as_ref()).is_ok_and(|p| p.admits(reference)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn spec_table() {
        let mail = "registry.example.com/observers/mail";
        let digest_entry = format!("{mail}@{D}");
        let cases: Vec<(String, &str, bool)> = vec![
            (format!("{mail}:1.4.2"), "registry.example.com/observers/mail:1.4.2", true),
            (format!("{mail}:1.4.2"), "registry.example.com/observers/mail:1.4.3", false),
            (format!("{mail}:1.*"), "registry.example.com/observers/mail:1.4.2", true),
            (format!("{mail}:1.*"), "registry.example.com/observers/mail:1.", true),
            (format!("{mail}:1.*"), "registry.example.com/observers/mail:2.0.0", false),
            (format!("{mail}:1.*"), "registry.example.com/observers/mail:10.0", false),
            (format!("{mail}:1.*"), "registry.example.com/observers/other:1.0", false),
            (format!("{mail}:1.*"), "evil.example.com/observers/mail:1.0", false),
            (format!("{mail}:*"), "registry.example.com/observers/mail:latest", true),
            (format!("{mail}:*"), "registry.example.com/observers/mail", false),
            (format!("{mail}:*"), "registry.example.com/observers/mail/x:1", false),
            (digest_entry.clone(), &*Box::leak(digest_entry.clone().into_boxed_str()), true),
            (format!("{mail}:*"), &*Box::leak(format!("{mail}@{D}").into_boxed_str()), false),
            ("alpine:*".into(), "alpine", false),
            ("alpine".into(), "alpine", true),
            ("alpine:3.20".into(), "docker.io/library/alpine:3.20", false),
            ("docker.io/library/alpine:3.20".into(), "alpine:3.20", false),
            ("host:5000/repo:1.*".into(), "host:5000/repo:1.2", true),
            ("host:5000/repo:1.*".into(), "host:5000/repo", false),
            ("host:5000/repo:1.*".into(), "host:5001/repo:1.2", false),
            ("host:5000/repo".into(), "host:5000/repo", true),
            ("repo:v*-slim".into(), "repo:v1.2-slim", true),
            ("repo:v*-slim".into(), "repo:v1.2", false),
            ("repo:*".into(), "repo:*", false),
        ];
        for (entry, reference, want) in cases {
            let p = Pattern::parse(&entry).unwrap_or_else(|e| panic!("{entry}: {e}"));
            assert_eq!(p.admits(reference), want, "{entry} vs {reference}");
        }
    }

    #[test]
    fn refused_entries() {
        for bad in [
            "repo:1.*.*",
            "re*po:1",
            "reg*istry.example.com/repo:1",
            "registry.example.com/*/mail:1",
            "repo*",
            "host:5000/repo*",
            "*",
            "repo@sha256:*",
            "",
            "repo:",
            "repo:a b",
        ] {
            assert!(Pattern::parse(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn list_reports_every_bad_entry() {
        let errs = AllowList::parse(&["ok:1", "a*:1", "b:**"]).unwrap_err();
        assert_eq!(errs.len(), 2);
        let list = AllowList::parse(&["a:1.*", "b:2"]).unwrap();
        assert!(list.admits("a:1.0") && list.admits("b:2") && !list.admits("b:3"));
        assert!(!AllowList::default().admits("a:1"));
    }

    #[test]
    fn references() {
        assert!(is_reference("agent-runner:1.4.0"));
        assert!(is_reference(&format!("r/m@{D}")));
        assert!(!is_reference("r:*"));
        assert!(!is_reference(""));
        assert!(!is_reference("r/m@sha256:xyz"));
    }
}
