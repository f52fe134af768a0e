//! Object names of mirrors (docs/behaviour.md#kubernetes-mirror): a node's name where it is a valid DNS subdomain, else
//! `node-` plus a short hash of it; a placement's `<agentKey>.<node object name>` (or
//! `<agentKey>.pending` / `<agentKey>.stopped`), hashed as `placement-<hash>` where too long.

use sha2::{Digest, Sha256};

/// RFC 1123 subdomain, as Kubernetes checks object names: dot-separated labels of
/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 253 characters in all.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter().all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        })
}

fn short_hash(s: &str) -> String {
    let d = Sha256::digest(s.as_bytes());
    d[..5].iter().map(|b| format!("{b:02x}")).collect()
}

pub fn node_object(node_name: &str) -> String {
    if is_dns_subdomain(node_name) {
        node_name.to_string()
    } else {
        format!("node-{}", short_hash(node_name))
    }
}

/// `where_` is the node's name, or `pending` / `stopped`.
pub fn placement_object(agent_key: &str, where_: &str) -> String {
    let name = format!("{agent_key}.{}", node_object(where_));
    if is_dns_subdomain(&name) {
        name
    } else {
        format!("placement-{}", short_hash(&format!("{agent_key}.{where_}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_names_are_kept_and_others_hashed() {
        assert_eq!(node_object("gpu-1.lab"), "gpu-1.lab");
        for bad in ["a-", "a..b", "-a", &"x".repeat(64)] {
            let n = node_object(bad);
            assert!(n.starts_with("node-") && n.len() == 15 && is_dns_subdomain(&n), "{bad} → {n}");
        }
        assert_ne!(node_object("a-"), node_object("b-"));
        assert_eq!(placement_object("coder", "gpu-1"), "coder.gpu-1");
        assert_eq!(placement_object("coder", "pending"), "coder.pending");
        assert_eq!(placement_object("coder", "a-"), format!("coder.{}", node_object("a-")));
        let long = "n".repeat(63) + "." + &"n".repeat(63) + "." + &"n".repeat(63) + "." + &"n".repeat(61);
        assert!(is_dns_subdomain(&long));
        let p = placement_object("coder", &long);
        assert!(p.starts_with("placement-") && is_dns_subdomain(&p), "{p}");
    }
}
