//! Lists cut to this node's own objects (docs/behaviour.md#what-the-guard-checks-and-why): the
//! node sees no other workload on the host — not its names, images or labels — whatever
//! filter it asked the engine for.

use super::policy::Policy;
use serde_json::Value;

/// The engine's answer to `GET /containers/json`, keeping this node's containers only.
pub fn containers(policy: &Policy, answer: &[u8]) -> Result<Vec<u8>, String> {
    let list: Vec<Value> = serde_json::from_slice(answer).map_err(|e| format!("container list: {e}"))?;
    let mine: Vec<Value> = list.into_iter().filter(|c| owned(policy, &c["Labels"])).collect();
    serde_json::to_vec(&mine).map_err(|e| e.to_string())
}

/// The engine's answer to `GET /volumes`, keeping the volumes with this node's labels.
pub fn volumes(policy: &Policy, answer: &[u8]) -> Result<Vec<u8>, String> {
    let mut v: Value = serde_json::from_slice(answer).map_err(|e| format!("volume list: {e}"))?;
    if let Some(list) = v.get_mut("Volumes").and_then(Value::as_array_mut) {
        list.retain(|vol| owned(policy, &vol["Labels"]));
    }
    serde_json::to_vec(&v).map_err(|e| e.to_string())
}

fn owned(policy: &Policy, labels: &Value) -> bool {
    policy.owns(|k| labels.get(k).and_then(Value::as_str))
}

/// A policy for tests of this module and the proxy's.
#[cfg(test)]
pub fn test_policy() -> Policy {
    let yaml = "controllerUrl: https://c.example\nname: n1\ncapacity: {slots: 2}\n\
                executors:\n  k: {image: \"agent:1\"}\nstateDir: /var/lib/fleet-node\n\
                secretsDir: /etc/fleet-node/secrets\ncontainerPrefix: fl\n";
    Policy::from_config(&crate::config::NodeConfig::parse(yaml, "node.yaml", &|_| None).unwrap(), (1000, 1000))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn other_workloads_are_not_listed() {
        let p = test_policy();
        let all = json!([
            {"Id": "a", "Labels": {"fleet.managed": "1", "fleet.node": "n1"}},
            {"Id": "b", "Labels": {"fleet.managed": "1", "fleet.node": "n2"}},
            {"Id": "c", "Labels": {}},
            {"Id": "d", "Labels": null},
        ]);
        let out: Value = serde_json::from_slice(&containers(&p, all.to_string().as_bytes()).unwrap()).unwrap();
        assert_eq!(out, json!([{"Id": "a", "Labels": {"fleet.managed": "1", "fleet.node": "n1"}}]));
        let vols = json!({"Volumes": [
            {"Name": "fl-a-0-data", "Labels": {"fleet.managed": "1", "fleet.node": "n1"}},
            {"Name": "postgres", "Labels": null},
        ], "Warnings": null});
        let out: Value = serde_json::from_slice(&volumes(&p, vols.to_string().as_bytes()).unwrap()).unwrap();
        assert_eq!(out["Volumes"].as_array().unwrap().len(), 1);
        assert_eq!(out["Volumes"][0]["Name"], "fl-a-0-data");
        assert!(containers(&p, b"not json").is_err());
    }
}
