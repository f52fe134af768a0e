//! Query strings, read once and strictly (docs/behaviour.md#what-the-guard-checks-and-why).
//! The engine reads a query with Go's `url.Values`, whose `Get` takes the **first** of a
//! repeated key, where a reader that keeps the last would check another value than the one
//! used. So each route has an allow-list of keys with the shape of their values; a key given
//! twice, a key not on the list, a value of the wrong shape and an escape that is not one are
//! refused; and what is forwarded is the guard's own encoding of the values it read.

use super::refusal::{refuse, Refusal};

/// The shape a query value must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    /// `true`, `false`, `1` or `0`.
    Bool,
    /// `false` or `0`: an option bollard always sends that fleet-node never sets.
    False,
    /// Digits, at most 9 of them.
    Count,
    /// A container name: letters, digits, `_`, `.` and `-`, at most 128.
    Name,
    /// A JSON object, at most 4 KiB (list filters).
    Filters,
    /// Nothing: the key may be given empty only (bollard's `platform=`).
    Empty,
}

/// The keys a route admits, each with its value's shape.
pub type Allowed = &'static [(&'static str, Value)];

/// A query as read: the admitted keys with their decoded values, in the order given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query(Vec<(&'static str, String)>);

impl Query {
    /// Reads `raw` against `allowed`.
    pub fn read(raw: Option<&str>, allowed: Allowed) -> Result<Query, Refusal> {
        let mut out: Vec<(&'static str, String)> = Vec::new();
        for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let (key, value) = (decode(key)?, decode(value)?);
            let Some(&(name, shape)) = allowed.iter().find(|(k, _)| *k == key) else {
                return refuse(format!("the query key {key:?} is not allowed here ({})", names(allowed)));
            };
            if out.iter().any(|(k, _)| *k == name) {
                return refuse(format!("the query key {name:?} is given twice (the engine would read the first)"));
            }
            check(name, shape, &value)?;
            out.push((name, value));
        }
        Ok(Query(out))
    }

    /// The value read for `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| *k == key).map(|(_, v)| v.as_str())
    }

    /// The query as forwarded: `?k=v&…` in the guard's own encoding, or nothing.
    pub fn encoded(&self) -> String {
        if self.0.is_empty() {
            return String::new();
        }
        let pairs: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={}", encode(v))).collect();
        format!("?{}", pairs.join("&"))
    }
}

fn names(allowed: Allowed) -> String {
    if allowed.is_empty() {
        return "this call takes no query".into();
    }
    let keys: Vec<&str> = allowed.iter().map(|(k, _)| *k).collect();
    format!("only {}", keys.join(", "))
}

fn check(key: &str, shape: Value, v: &str) -> Result<(), Refusal> {
    let ok = match shape {
        Value::Bool => matches!(v, "true" | "false" | "1" | "0"),
        Value::False => matches!(v, "false" | "0"),
        Value::Count => !v.is_empty() && v.len() <= 9 && v.bytes().all(|b| b.is_ascii_digit()),
        Value::Name => {
            !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        }
        Value::Filters => {
            v.len() <= 4096 && serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(v).is_ok()
        }
        Value::Empty => v.is_empty(),
    };
    if ok {
        Ok(())
    } else {
        refuse(format!("the query value of {key:?} is not {}", describe(shape)))
    }
}

fn describe(shape: Value) -> &'static str {
    match shape {
        Value::Bool => "true, false, 1 or 0",
        Value::False => "false or 0",
        Value::Count => "a whole number",
        Value::Name => "a container name",
        Value::Filters => "a JSON object of at most 4 KiB",
        Value::Empty => "empty",
    }
}

/// Percent-decoding as Go's `QueryUnescape`, but strict: `+` is a space, `%` must start two
/// hex digits, `;` is refused (Go refuses it too, and older engines split on it), and the
/// result must be UTF-8.
fn decode(s: &str) -> Result<String, Refusal> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b';' => return refuse("a ';' in the query is refused"),
            b'%' => {
                let hex = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
                let Some(b) = hex else { return refuse(format!("the query escape in {s:?} is not %XX")) };
                out.push(b);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| Refusal(format!("the query part {s:?} is not UTF-8 once decoded")))
}

/// Every byte but the unreserved ones of RFC 3986 escaped.
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CREATE: Allowed = &[("name", Value::Name), ("platform", Value::Empty)];
    const LIST: Allowed = &[("all", Value::Bool), ("filters", Value::Filters)];

    #[test]
    fn a_key_given_twice_is_refused_whatever_its_values() {
        let e = Query::read(Some("name=evil&name=fleet-x"), CREATE).unwrap_err().0;
        assert!(e.contains("\"name\" is given twice"), "{e}");
        // The same key written with an escape is the same key.
        assert!(Query::read(Some("name=fleet-x&n%61me=evil"), CREATE).unwrap_err().0.contains("given twice"));
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        let e = Query::read(Some("name=fleet-x&checkpoint=c1"), CREATE).unwrap_err().0;
        assert_eq!(e, "the query key \"checkpoint\" is not allowed here (only name, platform)");
        let e = Query::read(Some("checkpoint-dir=/tmp"), &[]).unwrap_err().0;
        assert!(e.ends_with("(this call takes no query)"), "{e}");
        assert!(Query::read(Some("name=../x"), CREATE).is_err());
        assert!(Query::read(Some("platform=linux"), CREATE).is_err());
        assert!(Query::read(Some("all=yes"), LIST).is_err());
        assert!(Query::read(Some("filters=[1]"), LIST).is_err());
        assert!(Query::read(Some("name=a%2"), CREATE).unwrap_err().0.contains("not %XX"));
        assert!(Query::read(Some("name=a;name=b"), CREATE).unwrap_err().0.contains("';'"));
        assert!(Query::read(Some("name=%ff"), CREATE).unwrap_err().0.contains("not UTF-8"));
    }

    #[test]
    fn what_is_forwarded_is_the_guards_encoding_of_what_it_read() {
        let q = Query::read(Some("all=1&filters=%7B%22label%22%3A%5B%22a%3Db%22%5D%7D"), LIST).unwrap();
        assert_eq!(q.get("filters"), Some(r#"{"label":["a=b"]}"#));
        assert_eq!(q.encoded(), "?all=1&filters=%7B%22label%22%3A%5B%22a%3Db%22%5D%7D");
        assert_eq!(Query::read(Some("name=fl-a.0&platform="), CREATE).unwrap().encoded(), "?name=fl-a.0&platform=");
        assert_eq!(Query::read(None, CREATE).unwrap().encoded(), "");
        assert_eq!(
            Query::read(Some("filters=%7B%7D+"), LIST).map(|q| q.get("filters").map(str::to_string)),
            Ok(Some("{} ".into()))
        );
    }
}
