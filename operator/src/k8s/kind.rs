//! The two kinds of mirror object (docs/behaviour.md#kubernetes-mirror) as the mirror handles
//! them without their Rust types: the API resource, the canonical form of a spec and a status
//! read back from the API server, and the optional fields of each status, read from the CRD's
//! own schema (the structural schema the API server prunes and validates with), so that the
//! mirror can take back an optional field another field manager set.

use super::crd::{FleetNode, FleetNodeSpec, FleetNodeStatus, FleetPlacement, FleetPlacementSpec, FleetPlacementStatus};
use kube::api::DynamicObject;
use kube::core::{ApiResource, CustomResourceExt};
use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;
use std::sync::LazyLock;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Node,
    Placement,
}

impl Kind {
    pub const ALL: [Kind; 2] = [Kind::Node, Kind::Placement];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Node => "FleetNode",
            Kind::Placement => "FleetPlacement",
        }
    }

    pub fn plural(self) -> &'static str {
        match self {
            Kind::Node => "fleetnodes",
            Kind::Placement => "fleetplacements",
        }
    }

    pub fn resource(self) -> ApiResource {
        match self {
            Kind::Node => ApiResource::erase::<FleetNode>(&()),
            Kind::Placement => ApiResource::erase::<FleetPlacement>(&()),
        }
    }

    /// Canonical spec and status of an object read from the API server.
    pub fn canonical(self, obj: &DynamicObject) -> (Value, Value) {
        let spec = obj.data.get("spec");
        let status = obj.data.get("status");
        match self {
            Kind::Node => (canonical::<FleetNodeSpec>(spec), canonical::<FleetNodeStatus>(status)),
            Kind::Placement => (canonical::<FleetPlacementSpec>(spec), canonical::<FleetPlacementStatus>(status)),
        }
    }

    /// The status fields that may be absent, as dotted paths (`capacity.cpus`), in the
    /// schema's order; at most 16 (their presence is kept as a bit mask).
    pub fn optional_status_fields(self) -> &'static [String] {
        static NODE: LazyLock<Vec<String>> = LazyLock::new(|| optional_fields(&FleetNode::crd()));
        static PLACEMENT: LazyLock<Vec<String>> = LazyLock::new(|| optional_fields(&FleetPlacement::crd()));
        match self {
            Kind::Node => &NODE,
            Kind::Placement => &PLACEMENT,
        }
    }

    /// Which optional status fields `status` holds, as bits in the order of
    /// [`Kind::optional_status_fields`]; a field present as `null` counts as present.
    pub fn optional_mask(self, status: Option<&Value>) -> u16 {
        let Some(status) = status else { return 0 };
        let mut mask = 0;
        for (i, path) in self.optional_status_fields().iter().enumerate() {
            if lookup(status, path).is_some() {
                mask |= 1 << i;
            }
        }
        mask
    }
}

/// Canonical form of a spec/status read back from the API server: parsed into the typed
/// structs and serialised again, so field order and defaults match what the mirror wants. A
/// value that does not parse (edited by hand into another shape) canonicalises to `Null`,
/// which never matches and so is put back.
pub fn canonical<T: DeserializeOwned + Serialize>(v: Option<&Value>) -> Value {
    v.and_then(|v| serde_json::from_value::<T>(v.clone()).ok())
        .and_then(|t| serde_json::to_value(t).ok())
        .unwrap_or(Value::Null)
}

/// The value at a dotted path of `v`, `null` included.
pub fn lookup<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |v, key| v.as_object()?.get(key))
}

fn optional_fields(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Vec<String> {
    let schema = serde_json::to_value(&crd.spec.versions[0].schema).expect("a CRD schema serialises");
    let status = &schema["openAPIV3Schema"]["properties"]["status"];
    let mut out = Vec::new();
    walk_optional(status, "", &mut out);
    assert!(out.len() <= 16, "more optional status fields than the mask holds");
    out
}

fn walk_optional(schema: &Value, prefix: &str, out: &mut Vec<String>) {
    let Some(props) = schema["properties"].as_object() else { return };
    let required: Vec<&str> = schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    for (name, sub) in props {
        let path = if prefix.is_empty() { name.clone() } else { format!("{prefix}.{name}") };
        if required.contains(&name.as_str()) {
            walk_optional(sub, &path, out);
        } else {
            out.push(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The optional fields come from the CRD's schema: a new `Option` field of a status is
    /// taken back without a list to keep in step.
    #[test]
    fn optional_status_fields_are_read_from_the_crd_schema() {
        let node = Kind::Node.optional_status_fields();
        assert_eq!(node, ["capacity.cpus", "capacity.memoryMb", "drainBlocked", "scheduling"], "defaulted fields too");
        assert_eq!(
            Kind::Placement.optional_status_fields(),
            ["busy", "busyReplicas", "node", "nodeId", "reason", "rollout"]
        );
        let status = json!({"capacity": {"slots": 1, "memoryMb": null}, "drainBlocked": 7});
        assert_eq!(Kind::Node.optional_mask(Some(&status)), 0b110);
        assert_eq!(Kind::Placement.optional_mask(Some(&json!({"reason": "x"}))), 0b10000);
        assert_eq!(Kind::Node.optional_mask(None), 0);
    }
}
