//! Reading a body the way the guard must, given that the engine reads it with Go's
//! `encoding/json` (docs/behaviour.md#what-the-guard-checks-and-why): a key repeated in one
//! object is a refusal here, because Go merges a repeated object key into the first value and
//! serde keeps only the last — the two would see different containers. Key comparison is
//! also where Go is lenient (case-insensitive, with Unicode folding); [`go_fold`] reproduces
//! it, so a key that Go would take for an allowed field can be named in the refusal.

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use std::fmt;

/// `bytes` as JSON, refused when any object repeats a key.
pub fn parse_unique(bytes: &[u8]) -> Result<Value, String> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let v = de.deserialize_any(UniqueKeys).map_err(|e| format!("the body is not JSON the guard accepts: {e}"))?;
    de.end().map_err(|e| format!("the body is not JSON the guard accepts: {e}"))?;
    Ok(v)
}

/// A key as Go's `encoding/json` compares it with a struct field: each character folded to
/// one case, including the folds outside ASCII (`ſ` is `s`, the Kelvin sign is `k`).
pub fn go_fold(key: &str) -> String {
    key.chars().flat_map(char::to_uppercase).flat_map(char::to_lowercase).collect()
}

struct UniqueKeys;

impl<'de> de::Deserialize<'de> for Unique {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueKeys).map(Unique)
    }
}

/// One JSON value read with [`UniqueKeys`] (the visitor recurses through it).
struct Unique(Value);

impl<'de> Visitor<'de> for UniqueKeys {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }
    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Value, E> {
        Number::from_f64(n).map(Value::Number).ok_or_else(|| E::custom("a number out of range"))
    }
    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_string()))
    }
    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(Unique(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(de::Error::custom(format!(
                    "the key {key:?} appears twice in one object (Docker would merge the two)"
                )));
            }
            let Unique(v) = map.next_value()?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_key_at_any_depth_is_refused() {
        for body in [
            r#"{"HostConfig":{"Privileged":true},"HostConfig":{}}"#,
            r#"{"HostConfig":{"Mounts":[{"Type":"tmpfs","Type":"bind"}]}}"#,
            r#"{"Labels":{"a":"1","a":"2"}}"#,
            // The same key, written once with an escape.
            r#"{"Image":"a","Im\u0061ge":"b"}"#,
        ] {
            let e = parse_unique(body.as_bytes()).unwrap_err();
            assert!(e.contains("appears twice in one object"), "{body}: {e}");
        }
        assert!(parse_unique(br#"{"a":{"b":1},"c":[{"b":2},{"b":3}]}"#).is_ok(), "the same key in sibling objects");
    }

    #[test]
    fn what_is_not_one_json_value_is_refused() {
        for body in ["", "{", r#"{"a":1} {"a":2}"#, "{\"a\":\"\u{0}\"", "[1,]"] {
            assert!(parse_unique(body.as_bytes()).is_err(), "{body:?}");
        }
        assert!(parse_unique(&[b'"', 0xff, b'"']).is_err(), "invalid UTF-8 (Go would read U+FFFD)");
    }

    #[test]
    fn keys_fold_as_go_folds_them() {
        assert_eq!(go_fold("HostConfig"), go_fold("hostconfig"));
        assert_eq!(go_fold("\u{17f}ecurityOpt"), go_fold("SecurityOpt"), "long s");
        assert_eq!(go_fold("\u{212a}ernelMemory"), go_fold("KernelMemory"), "Kelvin sign");
        assert_ne!(go_fold("Privileged"), go_fold("Privilege"));
    }
}
