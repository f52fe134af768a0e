//! The guard's own typed reading of a create body (docs/behaviour.md#what-the-guard-checks-and-why).
//! The policy judges this value and the proxy forwards this value, serialised again — never
//! the bytes received — so what the engine decodes is what was checked, whatever its decoder
//! would have made of the original. The fields are the allow-lists of [`super::shape`];
//! `deny_unknown_fields` keeps the two from drifting apart silently.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct ContainerBody {
    pub image: Option<String>,
    pub user: Option<String>,
    pub env: Option<Vec<String>>,
    pub labels: Option<BTreeMap<String, String>>,
    pub host_config: Option<HostConfig>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct HostConfig {
    pub init: Option<bool>,
    pub restart_policy: Option<RestartPolicy>,
    pub mounts: Option<Vec<Mount>>,
    pub nano_cpus: Option<i64>,
    pub memory: Option<i64>,
    pub memory_swap: Option<i64>,
    pub network_mode: Option<String>,
    pub cap_drop: Option<Vec<String>>,
    pub cap_add: Option<Vec<String>>,
    pub security_opt: Option<Vec<String>>,
    pub pids_limit: Option<i64>,
    pub log_config: Option<LogConfig>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct RestartPolicy {
    pub name: Option<String>,
    pub maximum_retry_count: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct Mount {
    pub r#type: Option<String>,
    pub source: Option<String>,
    pub target: Option<String>,
    pub read_only: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct LogConfig {
    pub r#type: Option<String>,
    pub config: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "PascalCase", deny_unknown_fields)]
pub struct VolumeBody {
    pub name: Option<String>,
    pub labels: Option<BTreeMap<String, String>>,
    pub driver: Option<String>,
    pub driver_opts: Option<BTreeMap<String, String>>,
}

/// The typed body of a value that passed its shape check.
pub fn typed<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, String> {
    serde_json::from_value(v).map_err(|e| format!("the body does not read as the guard's typed body: {e}"))
}

/// What is forwarded: the typed body as JSON, absent fields left out (not sent as `null`).
pub fn to_bytes<T: Serialize>(body: &T) -> Vec<u8> {
    let v = serde_json::to_value(body).map(without_nulls).unwrap_or(Value::Null);
    serde_json::to_vec(&v).unwrap_or_default()
}

fn without_nulls(v: Value) -> Value {
    match v {
        Value::Object(o) => {
            Value::Object(o.into_iter().filter(|(_, x)| !x.is_null()).map(|(k, x)| (k, without_nulls(x))).collect())
        }
        Value::Array(a) => Value::Array(a.into_iter().map(without_nulls).collect()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::super::shape::{CONTAINER, VOLUME};
    use super::*;

    /// Every key the allow-lists admit is a field of the typed bodies, and comes back out of
    /// them unchanged: nothing checked is lost on the way to the engine.
    #[test]
    fn the_typed_bodies_carry_every_key_the_shapes_admit() {
        let full = CONTAINER.full();
        let body: ContainerBody = typed(full.clone()).unwrap();
        assert_eq!(serde_json::from_slice::<Value>(&to_bytes(&body)).unwrap(), full);
        let full = VOLUME.full();
        let body: VolumeBody = typed(full.clone()).unwrap();
        assert_eq!(serde_json::from_slice::<Value>(&to_bytes(&body)).unwrap(), full);
    }

    #[test]
    fn absent_fields_are_not_forwarded() {
        let body = ContainerBody { image: Some("a:1".into()), ..Default::default() };
        assert_eq!(to_bytes(&body), br#"{"Image":"a:1"}"#);
    }
}
