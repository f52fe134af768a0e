//! Text a node or the CP wrote, made safe to print (docs/reference.md#fleetctl): a node's
//! message or a CP field could carry terminal escapes that rewrite the admin's screen or hide a
//! line, so every string of an API answer has its control characters replaced before fleetctl
//! shows it — C0 and C1 controls, DEL, and the bidirectional overrides that reorder text.

use serde_json::Value;

/// `s` with each control character replaced: line breaks and tabs by a space, the rest by `�`.
pub fn text(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '\t' | '\n' | '\r' => ' ',
            c if is_control(c) => '\u{fffd}',
            c => c,
        })
        .collect()
}

fn is_control(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Every string of `v`, keys included, cleaned with [`text`].
pub fn value(v: Value) -> Value {
    match v {
        Value::String(s) => Value::String(text(&s)),
        Value::Array(a) => Value::Array(a.into_iter().map(value).collect()),
        Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (text(&k), value(v))).collect()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn escapes_breaks_and_overrides_are_replaced() {
        assert_eq!(text("ok\x1b[2J\x1b]0;pwned\x07 done"), "ok\u{fffd}[2J\u{fffd}]0;pwned\u{fffd} done");
        assert_eq!(text("line\nfake line\r"), "line fake line ");
        assert_eq!(text("\u{9b}31m \u{7f} a\u{202e}txt.exe"), "\u{fffd}31m \u{fffd} a\u{fffd}txt.exe");
        assert_eq!(text("zone=eu ünïcode ✓"), "zone=eu ünïcode ✓");
        let v = value(json!({"items": [{"name": "n\x1b1", "n": 3}], "k\x07": true}));
        assert_eq!(v, json!({"items": [{"name": "n\u{fffd}1", "n": 3}], "k\u{fffd}": true}));
    }
}
