//! Today's node against what every earlier release left behind (docs/operations.md#versions-and-upgrades):
//! the corpus under `operator/tests/corpus/<version>/`, recorded by `scripts/record-corpus.sh`
//! with that release's own binaries. Today's node must read every desired state an older
//! controller served, and compute for every container an older node created the same
//! `fleet.spec` hash — otherwise a node upgraded onto this build recreates every container
//! (docs/behaviour.md#container-rules).

use fleet_node::config::NodeConfig;
use fleet_node::daemon::parse_desired;
use fleet_node::plan;
use fleet_node::runtime::{LABEL_SPEC, LABEL_SPEC_ID};
use std::path::{Path, PathBuf};

/// Every release's corpus directory, oldest version first.
fn releases() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../operator/tests/corpus");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("release.json").exists())
        .collect();
    dirs.sort_by_key(|d| version(d));
    assert!(!dirs.is_empty(), "no release corpus under {}", root.display());
    dirs
}

fn version(dir: &Path) -> Vec<u64> {
    let name = dir.file_name().unwrap().to_string_lossy().to_string();
    name.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn todays_node_reads_every_desired_state_an_older_controller_served() {
    for dir in releases() {
        let mut files: Vec<PathBuf> =
            std::fs::read_dir(dir.join("desired")).unwrap().flatten().map(|e| e.path()).collect();
        files.push(dir.join("node/desired.json"));
        for f in files {
            let bytes = std::fs::read(&f).unwrap();
            let d = parse_desired(&bytes).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            let raw = json(&f);
            assert_eq!(Some(d.generation), raw["generation"].as_u64(), "{}", f.display());
            assert_eq!(d.agents.len(), raw["agents"].as_array().unwrap().len(), "{}", f.display());
            for (a, r) in d.agents.iter().zip(raw["agents"].as_array().unwrap()) {
                assert_eq!(a.identity.credential.credential_id, r["identity"]["credential"]["credentialId"]);
                assert_eq!(a.spec_id.as_deref(), r["specId"].as_str(), "{}", f.display());
            }
        }
    }
}

#[test]
fn todays_node_adopts_every_container_an_older_node_created() {
    for dir in releases() {
        let yaml = std::fs::read_to_string(dir.join("node/node.yaml")).unwrap();
        let cfg = NodeConfig::parse(&yaml, "node.yaml", &|_| None).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let desired = parse_desired(&std::fs::read(dir.join("node/desired.json")).unwrap()).unwrap();
        let containers = json(&dir.join("containers.json"));
        let containers = containers.as_array().unwrap();
        assert!(!containers.is_empty(), "{}: no container recorded", dir.display());
        for c in containers {
            let labels = &c["labels"];
            let agent = labels["fleet.agent"].as_str().unwrap();
            let replica: u32 = labels["fleet.replica"].as_str().unwrap().parse().unwrap();
            let a = desired.agents.iter().find(|a| a.agent_key == agent).expect("the container's agent is desired");
            let spec = plan::spec(a, replica, c["image"].as_str().unwrap(), &cfg);
            assert_eq!(
                spec.hash(),
                labels[LABEL_SPEC].as_str().unwrap(),
                "{}: today's node would recreate {} (its fleet.spec differs)",
                dir.display(),
                c["name"]
            );
            assert_eq!(spec.labels.get(LABEL_SPEC_ID).map(String::as_str), labels[LABEL_SPEC_ID].as_str());
            assert_eq!(spec.name, c["name"].as_str().unwrap());
        }
    }
}
