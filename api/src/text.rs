//! Text others wrote, made safe for a log line (docs/behaviour.md#hardening): a node's replica
//! message, a CP item's field, a client's path. A line of a text log holds one event, so a
//! newline or any other control character in such text is escaped wherever it is logged —
//! by the log format itself, not by each call remembering to.

use std::borrow::Cow;

/// `s` with every control character but tab escaped as Rust escapes it (`\n`, `\u{1b}`).
pub fn escape_controls(s: &str) -> Cow<'_, str> {
    if !s.chars().any(|c| c.is_control() && c != '\t') {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() && c != '\t' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forged_log_line_stays_on_its_line() {
        let forged = "crash\n2026-12-07T12:00:00Z INFO fleet_controller: became the leader (epoch 999)";
        let shown = escape_controls(forged);
        assert!(!shown.contains('\n') && shown.contains("crash\\n2026"), "{shown}");
        assert_eq!(escape_controls("\u{1b}[31mred\r"), "\\u{1b}[31mred\\r");
        assert!(matches!(escape_controls("plain\ttext é"), Cow::Borrowed(_)));
    }
}
