//! Who owns what on a mirror object (docs/behaviour.md#kubernetes-mirror), from the object the
//! API server returned: the other field managers that own part of its status, whether it
//! carries this fleet's labels, and the apply that takes optional status fields back.
//!
//! Server-side apply takes back only the fields an apply names: a field another manager added
//! (`kubectl patch --subresource=status -p '{"status":{"reason":"hand-made"}}'`) stays, owned by
//! that manager, however often the controller applies its own status. So the mirror applies
//! once with `null` in every optional field it does not want, which makes them its own (forced)
//! and empties them, then once without them, which removes them; and a manager still listed
//! for the status after that (one that applied a value equal to the controller's) has its
//! entry removed from `managedFields` by a JSON patch.

use super::crd::{FLEET_LABEL, MANAGED_BY};
use super::kind::{lookup, Kind};
use kube::api::DynamicObject;
use serde_json::{json, Value};

/// The `managedFields` entries of managers other than `manager` that own part of the status:
/// their position in the list and their name.
pub fn foreign_status_managers(obj: &DynamicObject, manager: &str) -> Vec<(usize, String)> {
    let entries = obj.metadata.managed_fields.iter().flatten().enumerate();
    entries
        .filter(|(_, e)| e.manager.as_deref() != Some(manager))
        .filter(|(_, e)| e.fields_v1.as_ref().is_some_and(|f| f.0.get("f:status").is_some()))
        .map(|(i, e)| (i, e.manager.clone().unwrap_or_default()))
        .collect()
}

/// Whether the object carries the labels that make it this fleet's mirror.
pub fn labels_ok(obj: &DynamicObject, fleet_id: &str) -> bool {
    let labels = obj.metadata.labels.as_ref();
    let has = |k: &str, v: &str| labels.and_then(|l| l.get(k)).is_some_and(|x| x == v);
    has(MANAGED_BY.0, MANAGED_BY.1) && has(FLEET_LABEL, fleet_id)
}

/// The fleet an object's label names; `None` for an object without one.
pub fn fleet_of(obj: &DynamicObject) -> Option<&str> {
    obj.metadata.labels.as_ref()?.get(FLEET_LABEL).map(String::as_str)
}

/// Whether Fleet made the object (its `managed-by` label), whatever fleet.
pub fn made_by_fleet(obj: &DynamicObject) -> bool {
    obj.metadata.labels.as_ref().and_then(|l| l.get(MANAGED_BY.0)).is_some_and(|v| v == MANAGED_BY.1)
}

/// The wanted status with `null` in each optional field the server holds (bits of `present`)
/// and the wanted status lacks: applied with force, it makes those fields the controller's
/// and empty, so the next apply of `wanted` removes them.
pub fn nulls_for_extras(kind: Kind, wanted: &Value, present: u16) -> Value {
    let mut out = wanted.clone();
    for (i, path) in kind.optional_status_fields().iter().enumerate() {
        if present & (1 << i) != 0 && lookup(wanted, path).is_none() {
            set_null(&mut out, path);
        }
    }
    out
}

fn set_null(v: &mut Value, path: &str) {
    let mut at = v;
    let mut keys = path.split('.').peekable();
    while let Some(key) = keys.next() {
        let Some(obj) = at.as_object_mut() else { return };
        if keys.peek().is_none() {
            obj.insert(key.to_string(), Value::Null);
            return;
        }
        at = obj.entry(key.to_string()).or_insert_with(|| json!({}));
    }
}

/// A JSON patch that removes the `managedFields` entries of these managers, each guarded by a
/// test of its name at its position (a list changed meanwhile fails the patch, `422`), from the
/// last so the positions hold.
pub fn drop_managers_patch(foreign: &[(usize, String)]) -> Value {
    let mut ops = Vec::new();
    let mut sorted: Vec<_> = foreign.to_vec();
    sorted.sort_by_key(|e| std::cmp::Reverse(e.0));
    for (i, name) in sorted {
        ops.push(json!({"op": "test", "path": format!("/metadata/managedFields/{i}/manager"), "value": name}));
        ops.push(json!({"op": "remove", "path": format!("/metadata/managedFields/{i}")}));
    }
    Value::Array(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(v: Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn other_managers_of_the_status_are_found_with_their_position() {
        let obj = object(json!({
            "apiVersion": "fleet.taimen.dev/v1alpha1", "kind": "FleetNode",
            "metadata": {"name": "gpu-1", "managedFields": [
                {"manager": "fleet-controller", "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}},
                {"manager": "kubectl-label", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}},
                {"manager": "fleet-controller", "operation": "Apply", "subresource": "status", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}},
                {"manager": "kubectl-patch", "operation": "Update", "subresource": "status", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:reason": {}}}}
            ]}
        }));
        let foreign = foreign_status_managers(&obj, "fleet-controller");
        assert_eq!(foreign, [(3, "kubectl-patch".to_string())], "a label's manager is left alone");
        assert_eq!(
            drop_managers_patch(&foreign),
            json!([{"op": "test", "path": "/metadata/managedFields/3/manager", "value": "kubectl-patch"},
                   {"op": "remove", "path": "/metadata/managedFields/3"}])
        );
    }

    #[test]
    fn the_take_back_apply_nulls_only_the_extras_the_server_holds() {
        let wanted = json!({"agentKey": "coder", "replicas": 1, "status": "placed", "node": "gpu-1"});
        let server = json!({"agentKey": "coder", "replicas": 1, "status": "placed", "node": "gpu-1",
                            "reason": "hand-made", "rollout": "halted"});
        let present = Kind::Placement.optional_mask(Some(&server));
        let patch = nulls_for_extras(Kind::Placement, &wanted, present);
        assert_eq!(patch["reason"], Value::Null);
        assert_eq!(patch["rollout"], Value::Null);
        assert_eq!(patch["node"], "gpu-1", "a wanted optional field keeps its value");
        assert!(patch.get("nodeId").is_none(), "a field absent on both sides stays absent");
        let node = json!({"capacity": {"slots": 2}});
        let patch =
            nulls_for_extras(Kind::Node, &node, Kind::Node.optional_mask(Some(&json!({"capacity": {"cpus": 4}}))));
        assert_eq!(patch, json!({"capacity": {"slots": 2, "cpus": null}}));
    }

    #[test]
    fn an_object_is_this_fleets_by_both_labels() {
        let with = |labels: Value| {
            object(json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "a", "labels": labels}}))
        };
        let ours = with(json!({"app.kubernetes.io/managed-by": "fleet-controller", "fleet.taimen.dev/fleet": "f1"}));
        assert!(labels_ok(&ours, "f1") && !labels_ok(&ours, "f2"));
        assert_eq!(fleet_of(&ours), Some("f1"));
        let legacy = with(json!({"app.kubernetes.io/managed-by": "fleet-controller"}));
        assert!(!labels_ok(&legacy, "f1") && made_by_fleet(&legacy) && fleet_of(&legacy).is_none());
        assert!(!made_by_fleet(&with(json!({}))));
    }
}
