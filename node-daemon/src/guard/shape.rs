//! The allow-lists of the guard (docs/behaviour.md#what-the-guard-checks-and-why): for every
//! object a body may hold, the keys it may have, each with the type of its value. They hold
//! exactly what fleet-node sends; a key Docker has and fleet-node does not use is refused,
//! empty or not (an empty `MaskedPaths` unmasks `/proc`), and so is a key Docker would take
//! for an allowed one only because it compares keys case-insensitively.

use super::json::go_fold;
use serde_json::Value;

/// The type a value must have.
#[derive(Debug)]
pub enum Shape {
    Bool,
    Int,
    Str,
    /// An array of strings.
    Strings,
    /// An object of free keys with string values (labels, options).
    StrMap,
    Obj(&'static [(&'static str, Shape)]),
    List(&'static Shape),
}

/// `POST /containers/create`, as fleet-node's Docker adapter builds it.
pub const CONTAINER: Shape = Shape::Obj(&[
    ("Image", Shape::Str),
    ("User", Shape::Str),
    ("Env", Shape::Strings),
    ("Labels", Shape::StrMap),
    ("HostConfig", HOST_CONFIG),
]);

const HOST_CONFIG: Shape = Shape::Obj(&[
    ("Init", Shape::Bool),
    ("RestartPolicy", Shape::Obj(&[("Name", Shape::Str), ("MaximumRetryCount", Shape::Int)])),
    ("Mounts", Shape::List(&MOUNT)),
    ("NanoCpus", Shape::Int),
    ("Memory", Shape::Int),
    ("MemorySwap", Shape::Int),
    ("NetworkMode", Shape::Str),
    ("CapDrop", Shape::Strings),
    ("CapAdd", Shape::Strings),
    ("SecurityOpt", Shape::Strings),
    ("PidsLimit", Shape::Int),
    ("LogConfig", Shape::Obj(&[("Type", Shape::Str), ("Config", Shape::StrMap)])),
]);

const MOUNT: Shape =
    Shape::Obj(&[("Type", Shape::Str), ("Source", Shape::Str), ("Target", Shape::Str), ("ReadOnly", Shape::Bool)]);

/// `POST /volumes/create`. `Driver` and `DriverOpts` are listed so that their refusal can say
/// why (only `local`, no options), not just that the key is unknown.
pub const VOLUME: Shape = Shape::Obj(&[
    ("Name", Shape::Str),
    ("Labels", Shape::StrMap),
    ("Driver", Shape::Str),
    ("DriverOpts", Shape::StrMap),
]);

/// Checks `v` against `shape`; `at` is the path so far (`HostConfig.Mounts[1].`), for the
/// refusal. `null` is accepted anywhere: Docker reads it as absent, and so does the guard's
/// typed body.
pub fn check(v: &Value, shape: &Shape, at: &str) -> Result<(), String> {
    let here = at.trim_end_matches('.');
    let fits = match (shape, v) {
        (_, Value::Null) => true,
        (Shape::Bool, Value::Bool(_)) | (Shape::Str, Value::String(_)) => true,
        (Shape::Int, Value::Number(n)) => n.is_i64(),
        (Shape::Strings, Value::Array(a)) => a.iter().all(Value::is_string),
        (Shape::StrMap, Value::Object(o)) => o.values().all(Value::is_string),
        (Shape::List(item), Value::Array(a)) => {
            for (i, x) in a.iter().enumerate() {
                check(x, item, &format!("{here}[{i}]."))?;
            }
            true
        }
        (Shape::Obj(fields), Value::Object(o)) => {
            for (k, x) in o {
                check(x, field(fields, k, at)?, &format!("{at}{k}."))?;
            }
            true
        }
        _ => false,
    };
    if fits {
        Ok(())
    } else {
        let what = if here.is_empty() { "the body" } else { here };
        Err(format!("{what} must be {}", shape.describe()))
    }
}

fn field<'a>(fields: &'a [(&'static str, Shape)], key: &str, at: &str) -> Result<&'a Shape, String> {
    if let Some((_, s)) = fields.iter().find(|(name, _)| *name == key) {
        return Ok(s);
    }
    let folded = go_fold(key);
    if let Some((name, _)) = fields.iter().find(|(name, _)| go_fold(name) == folded) {
        return Err(format!(
            "{at}{key} is refused: Docker would read it as {at}{name} (keys are matched without case); \
             spell it {name}"
        ));
    }
    Err(format!("{at}{key} is not allowed (not a key fleet-node sends)"))
}

impl Shape {
    fn describe(&self) -> &'static str {
        match self {
            Shape::Bool => "true or false",
            Shape::Int => "an integer",
            Shape::Str => "a string",
            Shape::Strings => "an array of strings",
            Shape::StrMap => "an object of strings",
            Shape::Obj(_) => "an object",
            Shape::List(_) => "an array",
        }
    }

    /// A value with every key of the shape set (for testing that the typed bodies take
    /// every key this table admits).
    #[cfg(test)]
    pub fn full(&self) -> Value {
        use serde_json::json;
        match self {
            Shape::Bool => json!(true),
            Shape::Int => json!(7),
            Shape::Str => json!("s"),
            Shape::Strings => json!(["a", "b"]),
            Shape::StrMap => json!({"k": "v"}),
            Shape::Obj(fields) => Value::Object(fields.iter().map(|(k, s)| (k.to_string(), s.full())).collect()),
            Shape::List(item) => json!([item.full()]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refusal(v: Value) -> String {
        check(&v, &CONTAINER, "").unwrap_err()
    }

    #[test]
    fn a_key_outside_the_list_is_refused_even_when_empty() {
        assert_eq!(
            refusal(json!({"HostConfig": {"MaskedPaths": []}})),
            "HostConfig.MaskedPaths is not allowed (not a key fleet-node sends)"
        );
        assert_eq!(
            refusal(json!({"HostConfig": {"Mounts": [{"Type": "volume", "VolumeOptions": {}}]}})),
            "HostConfig.Mounts[0].VolumeOptions is not allowed (not a key fleet-node sends)"
        );
        assert!(
            refusal(json!({"HostConfig": {"Privileged": false}})).starts_with("HostConfig.Privileged is not allowed")
        );
    }

    #[test]
    fn a_key_docker_would_match_without_case_is_named_with_the_field() {
        let e = refusal(json!({"hostconfig": {}}));
        assert!(e.starts_with("hostconfig is refused: Docker would read it as HostConfig"), "{e}");
        let e = refusal(json!({"HostConfig": {"Mounts": [{"type": "bind"}]}}));
        assert!(
            e.starts_with("HostConfig.Mounts[0].type is refused: Docker would read it as HostConfig.Mounts[0].Type"),
            "{e}"
        );
        let e = refusal(json!({"HostConfig": {"\u{17f}ecurityOpt": []}}));
        assert!(e.contains("Docker would read it as HostConfig.SecurityOpt"), "{e}");
    }

    #[test]
    fn values_of_the_wrong_type_are_refused() {
        assert_eq!(refusal(json!({"HostConfig": {"PidsLimit": 1.5}})), "HostConfig.PidsLimit must be an integer");
        assert_eq!(refusal(json!({"Labels": {"a": 1}})), "Labels must be an object of strings");
        assert_eq!(refusal(json!({"HostConfig": {"Mounts": {}}})), "HostConfig.Mounts must be an array");
        assert_eq!(refusal(json!([])), "the body must be an object");
    }

    #[test]
    fn the_full_shapes_pass_their_own_check() {
        check(&CONTAINER.full(), &CONTAINER, "").unwrap();
        check(&VOLUME.full(), &VOLUME, "").unwrap();
    }
}
