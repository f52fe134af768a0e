//! The CRDs as checked in: they match the Rust types (drift fails here), `fleet-controller
//! crds` prints them, and they declare the names, scope, status subresource and printer
//! columns of docs/behaviour.md#kubernetes-mirror. The mirror itself runs against a real API
//! server in `k8s_real.rs` and `k8s_outage.rs`.

use serde_json::{json, Value};
use std::path::Path;

fn crds_file() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds/fleet.taimen.dev.yaml")).unwrap()
}

#[test]
fn checked_in_crds_match_the_rust_types() {
    let generated = fleet_controller::k8s::crd::crds_yaml();
    assert!(
        generated == crds_file(),
        "crds/fleet.taimen.dev.yaml is stale: run `cargo run -p fleet-controller -- crds > crds/fleet.taimen.dev.yaml`"
    );
    let chart_copy = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/fleet-controller/crds/fleet.taimen.dev.yaml"),
    )
    .unwrap();
    assert!(
        chart_copy == generated,
        "the chart's CRDs are stale: cp crds/fleet.taimen.dev.yaml charts/fleet-controller/crds/"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fleet-controller")).arg("crds").output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap(), generated);
}

#[test]
fn crds_declare_names_scope_status_and_printer_columns() {
    let docs: Vec<Value> = crds_file()
        .split("\n---\n")
        .skip(1)
        .map(|d| serde_json::to_value(serde_yaml::from_str::<serde_yaml::Value>(d).unwrap()).unwrap())
        .collect();
    assert_eq!(docs.len(), 2);
    let cols = |d: &Value| -> Vec<String> {
        d["spec"]["versions"][0]["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect()
    };
    for (d, name, short) in
        [(&docs[0], "fleetnodes.fleet.taimen.dev", "fnode"), (&docs[1], "fleetplacements.fleet.taimen.dev", "fplace")]
    {
        assert_eq!(d["metadata"]["name"], name);
        assert_eq!(d["spec"]["group"], "fleet.taimen.dev");
        assert_eq!(d["spec"]["scope"], "Namespaced");
        assert_eq!(d["spec"]["names"]["shortNames"], json!([short]));
        let v = &d["spec"]["versions"][0];
        assert_eq!(v["name"], "v1alpha1");
        assert_eq!(v["served"], true);
        assert_eq!(v["storage"], true);
        assert_eq!(v["subresources"]["status"], json!({}));
    }
    let node_cols =
        ["Status", "Health", "Scheduling", "Slots", "Version", "Last Seen", "Node", "Kinds", "Drain Blocked"];
    assert_eq!(cols(&docs[0]), [&node_cols[..], &["Fleet", "Age"]].concat());
    let placement_cols =
        ["Agent", "Node", "Replicas", "Busy", "Status", "Reason", "Rollout", "Revision", "Fleet", "Age"];
    assert_eq!(cols(&docs[1]), placement_cols);
    // `-o wide` only: the node's own name, its kinds, a drain's blocked replicas, the revision
    // and the fleet.
    let wide = |d: &Value| -> Vec<String> {
        d["spec"]["versions"][0]["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["priority"] == 1)
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(wide(&docs[0]), ["Node", "Kinds", "Drain Blocked", "Fleet"]);
    assert_eq!(wide(&docs[1]), ["Revision", "Fleet"]);
}
