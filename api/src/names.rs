//! Name rules of docs/behaviour.md#control-plane-calls-and-agent-descriptions, docs/reference.md#node-configuration-nodeyaml and docs/behaviour.md#secrets. Hand-written matchers: they run on every report.

fn lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// Agent keys become container, volume, file and Kubernetes names:
/// `^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`.
pub fn is_agent_key(s: &str) -> bool {
    let b = s.as_bytes();
    if b.is_empty() || b.len() > 63 {
        return false;
    }
    lower_alnum(b[0]) && lower_alnum(b[b.len() - 1]) && b.iter().all(|&c| lower_alnum(c) || c == b'-')
}

/// Node names: `^[a-z0-9][a-z0-9.-]*$`, at most 100 characters.
pub fn is_node_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty() && b.len() <= 100 && lower_alnum(b[0]) && b.iter().all(|&c| lower_alnum(c) || c == b'.' || c == b'-')
}

/// Labels: `name` or `name=value`, `^[a-z0-9][a-z0-9.-]*(=[a-zA-Z0-9._-]+)?$`.
/// Longest label (docs/behaviour.md#hardening).
pub const MAX_LABEL_LEN: usize = 127;

pub fn is_label(s: &str) -> bool {
    if s.len() > MAX_LABEL_LEN {
        return false;
    }
    let (name, value) = match s.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (s, None),
    };
    let nb = name.as_bytes();
    if nb.is_empty() || !lower_alnum(nb[0]) || !nb.iter().all(|&c| lower_alnum(c) || c == b'.' || c == b'-') {
        return false;
    }
    match value {
        None => true,
        Some(v) => !v.is_empty() && v.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'.' || c == b'_' || c == b'-'),
    }
}

/// A label's name alone (`placement.spread`): the part of [`is_label`] before any `=`.
pub fn is_label_name(s: &str) -> bool {
    !s.contains('=') && is_label(s)
}

/// Secret names a node announces: `^[a-z0-9][a-z0-9-]{0,62}$`, never `agent-pat`.
pub fn is_secret_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && lower_alnum(b[0])
        && b.iter().all(|&c| lower_alnum(c) || c == b'-')
        && s != RESERVED_SECRET
}

/// The secret file name reserved for the PAT mount.
pub const RESERVED_SECRET: &str = "agent-pat";

/// Executor kinds name images in node.yaml and appear in agent descriptions:
/// `^[a-z0-9][a-z0-9._-]{0,62}$`.
pub fn is_executor_kind(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && lower_alnum(b[0])
        && b.iter().all(|&c| lower_alnum(c) || c == b'-' || c == b'.' || c == b'_')
}

/// A Kubernetes namespace name (an RFC 1123 label), the agent-key rule:
/// `^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`.
pub fn is_dns_label(s: &str) -> bool {
    is_agent_key(s)
}

/// A Kubernetes label value that is not empty (a fleet id marks the mirrors with it): at most 63
/// characters, `^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$`.
pub fn is_kubernetes_label_value(s: &str) -> bool {
    let b = s.as_bytes();
    let inner = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-');
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_keys() {
        for ok in ["coder", "a", "a1", "coder-2", "0", &"a".repeat(63)] {
            assert!(is_agent_key(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "Coder", "a_b", "a.b", &"a".repeat(64), "ü"] {
            assert!(!is_agent_key(bad), "{bad}");
        }
    }

    #[test]
    fn node_names() {
        for ok in ["worker-1", "w.example.com", "1", &"a".repeat(100)] {
            assert!(is_node_name(ok), "{ok}");
        }
        for bad in ["", "-w", ".w", "Worker", "w_1", &"a".repeat(101)] {
            assert!(!is_node_name(bad), "{bad}");
        }
    }

    #[test]
    fn labels() {
        for ok in ["repos", "claude-subscription", "gpu=A100", "zone=eu-west_1.b", "a.b"] {
            assert!(is_label(ok), "{ok}");
        }
        for bad in ["", "Repos", "-a", "a=", "=b", "a=b=c", "a=b c", "a b"] {
            assert!(!is_label(bad), "{bad}");
        }
        assert!(is_label(&"a".repeat(127)), "127 characters is the limit");
        assert!(!is_label(&"a".repeat(128)), "docs/behaviour.md#hardening: at most 127 characters");
    }

    #[test]
    fn kubernetes_label_values() {
        for ok in ["a", "Fleet_1.prod-2", "0f3a9c", &"a".repeat(63)] {
            assert!(is_kubernetes_label_value(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "a b", "a/b", "ü", &"a".repeat(64)] {
            assert!(!is_kubernetes_label_value(bad), "{bad}");
        }
        assert!(is_dns_label("fleet-2") && !is_dns_label("Fleet") && !is_dns_label("a.b"));
    }

    #[test]
    fn secret_names() {
        for ok in ["github-token", "a", "0x", &"a".repeat(63)] {
            assert!(is_secret_name(ok), "{ok}");
        }
        for bad in ["agent-pat", "README", "agent.pat", "", "-a", &"a".repeat(64), "a_b"] {
            assert!(!is_secret_name(bad), "{bad}");
        }
    }
}
