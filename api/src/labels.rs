//! Label matching of docs/behaviour.md#placement: a requirement `name` is met by the label `name` or by any
//! `name=value`; a requirement `name=value` only by exactly that label.

/// Whether one requirement is met by a node's labels.
pub fn requirement_met<S: AsRef<str>>(requirement: &str, labels: &[S]) -> bool {
    if requirement.contains('=') {
        return labels.iter().any(|l| l.as_ref() == requirement);
    }
    labels.iter().any(|l| {
        let l = l.as_ref();
        l == requirement
            || (l.len() > requirement.len() && l.starts_with(requirement) && l.as_bytes()[requirement.len()] == b'=')
    })
}

/// The value a node's labels give the label `name` (docs/behaviour.md#spread-and-priority):
/// `v` of its `name=v`; `""` when it has only `name`, or not the label at all.
pub fn value_of<'l, S: AsRef<str>>(labels: &'l [S], name: &str) -> &'l str {
    labels.iter().find_map(|l| l.as_ref().strip_prefix(name)?.strip_prefix('=')).unwrap_or("")
}

/// Whether every requirement is met.
pub fn all_met<R: AsRef<str>, S: AsRef<str>>(requirements: &[R], labels: &[S]) -> bool {
    requirements.iter().all(|r| requirement_met(r.as_ref(), labels))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let labels = ["repos", "gpu=A100", "zone=eu"];
        let cases = [
            ("repos", true),
            ("gpu", true),
            ("gpu=A100", true),
            ("gpu=H100", false),
            ("zone=eu", true),
            ("zone=e", false),
            ("zon", false),
            ("repos=x", false),
            ("claude-subscription", false),
        ];
        for (req, want) in cases {
            assert_eq!(requirement_met(req, &labels), want, "{req}");
        }
        assert!(all_met::<&str, &str>(&[], &[]));
        assert!(all_met(&["repos", "gpu"], &labels));
        assert!(!all_met(&["repos", "ssd"], &labels));
    }

    #[test]
    fn a_labels_value() {
        let labels = ["repos", "zone=eu-1", "zoned=x", "gpu"];
        assert_eq!(value_of(&labels, "zone"), "eu-1");
        assert_eq!(value_of(&labels, "gpu"), "", "a plain label has the empty value");
        assert_eq!(value_of(&labels, "rack"), "", "no label: the empty value");
        assert_eq!(value_of(&labels, "zon"), "", "a prefix of a name is not the name");
    }
}
