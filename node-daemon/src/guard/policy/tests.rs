use super::*;
use crate::runtime::docker::{container_body, volume_body};
use crate::runtime::{Bind, ContainerSpec, Hardening};
use serde_json::{json, Value};
use std::path::Path;

/// A node.yaml with two kinds, and its host directories (a PAT and a secret in them).
struct Node {
    dir: tempfile::TempDir,
    cfg: crate::config::NodeConfig,
    policy: Policy,
}

fn node() -> Node {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().display().to_string();
    std::fs::create_dir_all(dir.path().join("state/agents/coder")).unwrap();
    std::fs::write(dir.path().join("state/agents/coder/agent-pat"), "pat").unwrap();
    std::fs::create_dir_all(dir.path().join("secrets")).unwrap();
    std::fs::write(dir.path().join("secrets/gh"), "s").unwrap();
    let yaml = format!(
        "controllerUrl: https://c.example\nname: n1\ncapacity: {{slots: 2}}\n\
         executors:\n  k: {{image: \"agent:1\", images: [\"reg/obs:1.*\"], capAdd: [NET_BIND_SERVICE], pidsLimit: 256,\n\
         \x20    user: \"1000:1000\", maxResources: {{cpus: 2, memoryMb: 1024}}, secrets: [gh]}}\n\
         \x20 plain: {{image: \"plain:1\", secrets: [other]}}\n\
         stateDir: /var/lib/fleet-node\nhostStateDir: {host}/state\nsecretsDir: /etc/fleet-node/secrets\n\
         hostSecretsDir: {host}/secrets\nnetwork: fleet-agents\ncontainerPrefix: fl\n"
    );
    let cfg = crate::config::NodeConfig::parse(&yaml, "node.yaml", &|_| None).unwrap();
    Node { policy: Policy::from_config(&cfg, (4242, 4243)), cfg, dir }
}

/// The spec of a replica of kind `k` as plan.rs makes it.
fn spec(host: &Path) -> ContainerSpec {
    let labels = [("fleet.managed", "1"), ("fleet.node", "n1"), ("fleet.agent", "coder"), ("fleet.kind", "k")];
    ContainerSpec {
        name: "fl-coder-0".into(),
        image: "agent:1".into(),
        env: vec!["CONTROL_PLANE_AGENT_KEY=coder".into()],
        labels: labels.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        binds: vec![
            Bind {
                source: format!("{}/state/agents/coder/agent-pat", host.display()),
                target: "/run/secrets/agent-pat".into(),
            },
            Bind { source: format!("{}/secrets/gh", host.display()), target: "/run/secrets/gh".into() },
        ],
        volume: Some(("fl-coder-0-data".into(), "/data".into())),
        nano_cpus: Some(1_000_000_000),
        memory_bytes: Some(512 << 20),
        network: Some("fleet-agents".into()),
        hardening: Hardening {
            cap_add: vec!["NET_BIND_SERVICE".into()],
            pids_limit: 256,
            user: Some("1000:1000".into()),
        },
        note: None,
        lease_dir: Some(format!("{}/state/leases/fl-coder-0", host.display())),
    }
}

impl Node {
    /// fleet-node's own create body for the replica, as bollard serialises it.
    fn own_body(&self) -> Value {
        serde_json::to_value(container_body(&spec(self.dir.path()))).unwrap()
    }

    fn create(&self, body: &Value) -> Result<Value, String> {
        self.create_raw(body.to_string().as_bytes())
    }

    fn create_raw(&self, bytes: &[u8]) -> Result<Value, String> {
        self.admit(bytes).map(|a| serde_json::from_slice(&body::to_bytes(&a.body)).unwrap())
    }

    fn admit(&self, bytes: &[u8]) -> Result<Admitted, String> {
        self.policy.container_request(Some("fl-coder-0"), bytes).map_err(|r| r.0)
    }

    /// The refusal of the node's own body changed by `change`.
    fn refusal(&self, change: impl FnOnce(&mut Value)) -> String {
        let mut b = self.own_body();
        change(&mut b);
        self.create(&b).expect_err("refused")
    }
}

#[test]
fn the_node_s_own_bodies_pass_and_are_forwarded_as_they_were() {
    let n = node();
    let own = n.own_body();
    assert_eq!(n.create(&own).unwrap(), own, "every key fleet-node sends is on the allow-lists");
    let mut b = own.clone();
    b["Image"] = json!("reg/obs:1.4");
    assert!(n.create(&b).is_ok(), "an image the kind's list admits");
    let vol = serde_json::to_vec(&volume_body("fl-coder-0-data", "n1")).unwrap();
    let out: Value = serde_json::from_slice(&body::to_bytes(&n.policy.volume_request(&vol).unwrap())).unwrap();
    assert_eq!(out, serde_json::from_slice::<Value>(&vol).unwrap());
}

/// What the proxy must settle beside the body: the files the binds carry (copied by the guard,
/// never bound from where the node wrote them), the volumes to check by label, the owner.
#[test]
fn an_admitted_create_names_its_files_volumes_and_user() {
    let n = node();
    let a = n.admit(n.own_body().to_string().as_bytes()).unwrap();
    assert_eq!(a.files, vec![(0, Source::Pat("coder".into())), (1, Source::Secret("gh".into())), (3, Source::Lease)]);
    assert_eq!(a.volumes, vec!["fl-coder-0-data".to_string()]);
    assert_eq!(a.owner, Owner { uid: 1000, gid: Some(1000) });
}

/// The bypasses that were admitted and created by the real engine before the guard read
/// bodies the way Docker does, each refused with the rule named.
#[test]
fn the_bypasses_docker_s_decoder_allowed_are_refused() {
    let n = node();
    let own = n.own_body();
    let host = own["HostConfig"].to_string();
    let rest = format!(r#""Image":"agent:1","Labels":{},"User":"1000:1000""#, own["Labels"]);
    let twice = format!(r#"{{{rest},"HostConfig":{{"Privileged":true,"Binds":["/:/h"]}},"HostConfig":{host}}}"#);
    assert!(n.create_raw(twice.as_bytes()).unwrap_err().contains("\"HostConfig\" appears twice"));
    let mount = r#"{"Type":"tmpfs","Source":"/","Target":"/h","type":"bind"}"#;
    let e = n.refusal(|b| b["HostConfig"]["Mounts"] = serde_json::from_str(&format!("[{mount}]")).unwrap());
    assert!(
        e.starts_with("HostConfig.Mounts[0].type is refused: Docker would read it as HostConfig.Mounts[0].Type"),
        "{e}"
    );
    let e = n.refusal(|b| b["HostConfig"]["MaskedPaths"] = json!([]));
    assert_eq!(e, "HostConfig.MaskedPaths is not allowed (not a key fleet-node sends)");
    let e = n.refusal(|b| b["HostConfig"]["ReadonlyPaths"] = json!([]));
    assert!(e.starts_with("HostConfig.ReadonlyPaths is not allowed"));
    let e = n.refusal(|b| b["hostconfig"] = json!({"privileged": true}));
    assert!(e.starts_with("hostconfig is refused: Docker would read it as HostConfig"), "{e}");
    let e = n.refusal(|b| b["HostConfig"]["privileged"] = json!(true));
    assert!(e.starts_with("HostConfig.privileged is not allowed"), "{e}");
    let e = n.refusal(|b| {
        b["HostConfig"]["Mounts"][2]["VolumeOptions"] =
            json!({"DriverConfig": {"Name": "local", "Options": {"type": "none", "o": "bind", "device": "/"}}})
    });
    assert!(e.starts_with("HostConfig.Mounts[2].VolumeOptions is not allowed"), "{e}");
    let bad_volume = json!({"Name": "fl-x", "Labels": {"fleet.managed": "1", "fleet.node": "n1"}, "DriverOpts": {"type": "none", "o": "bind", "device": "/"}});
    let e = n.policy.volume_request(bad_volume.to_string().as_bytes()).unwrap_err().0;
    assert!(e.starts_with("volume DriverOpts are not allowed"), "{e}");
}

#[test]
fn privilege_namespaces_and_devices_are_not_on_the_lists() {
    let n = node();
    for (key, value) in [
        ("Privileged", json!(true)),
        ("PidMode", json!("host")),
        ("IpcMode", json!("host")),
        ("UTSMode", json!("host")),
        ("UsernsMode", json!("host")),
        ("CgroupnsMode", json!("host")),
        ("Devices", json!([{"PathOnHost": "/dev/sda"}])),
        ("Binds", json!(["/:/host"])),
        ("Tmpfs", json!({"/x": ""})),
        ("CgroupParent", json!("/")),
        ("Sysctls", json!({"kernel.x": "1"})),
    ] {
        let e = n.refusal(|b| b["HostConfig"][key] = value);
        assert_eq!(e, format!("HostConfig.{key} is not allowed (not a key fleet-node sends)"));
    }
    for key in ["Volumes", "Entrypoint", "Cmd", "Healthcheck", "hostname"] {
        let e = n.refusal(|b| b[key] = json!({}));
        assert!(e.starts_with(key), "{key}: {e}");
    }
}

#[test]
fn capabilities_and_security_options_are_the_kind_s() {
    let n = node();
    let e = n.refusal(|b| b["HostConfig"]["CapAdd"] = json!(["SYS_ADMIN"]));
    assert_eq!(e, "HostConfig.CapAdd \"SYS_ADMIN\" is not allowed: executors.k.capAdd does not grant it");
    for drop in [json!(null), json!([]), json!(["NET_RAW"])] {
        let e = n.refusal(|b| b["HostConfig"]["CapDrop"] = drop);
        assert!(e.starts_with("HostConfig.CapDrop must be [\"ALL\"]"), "{e}");
    }
    let e = n.refusal(|b| b["HostConfig"]["SecurityOpt"] = json!(["no-new-privileges", "seccomp=unconfined"]));
    assert_eq!(e, "HostConfig.SecurityOpt \"seccomp=unconfined\" is not allowed: only no-new-privileges");
    let e = n.refusal(|b| b["HostConfig"]["SecurityOpt"] = json!([]));
    assert_eq!(e, "HostConfig.SecurityOpt must hold no-new-privileges");
    let e = n.refusal(|b| b["HostConfig"]["NetworkMode"] = json!("host"));
    assert!(e.starts_with("HostConfig.NetworkMode \"host\" is not allowed"));
    let e = n.refusal(|b| b["HostConfig"]["LogConfig"]["Type"] = json!("syslog"));
    assert!(e.starts_with("HostConfig.LogConfig.Type \"syslog\" is not allowed"));
    let e = n.refusal(|b| b["User"] = json!("0"));
    assert_eq!(e, "User must be \"1000:1000\" (executors.k.user)");
    let e = n.refusal(|b| {
        b.as_object_mut().unwrap().remove("HostConfig");
    });
    assert!(e.starts_with("HostConfig must be set"));
}

#[test]
fn limits_are_set_and_within_the_kind_s() {
    let n = node();
    for pids in [json!(null), json!(0), json!(-1), json!(257)] {
        let e = n.refusal(|b| b["HostConfig"]["PidsLimit"] = pids.clone());
        assert_eq!(e, "HostConfig.PidsLimit must be set, between 1 and 256 (executors.k.pidsLimit)", "{pids}");
    }
    for memory in [json!(null), json!(0), json!(1025i64 << 20)] {
        let e = n.refusal(|b| {
            b["HostConfig"]["Memory"] = memory.clone();
            b["HostConfig"]["MemorySwap"] = memory.clone();
        });
        assert!(
            e.starts_with("HostConfig.Memory must be set within executors.k.maxResources.memoryMb"),
            "{memory}: {e}"
        );
    }
    let e = n.refusal(|b| b["HostConfig"]["NanoCpus"] = json!(2_000_000_001i64));
    assert!(e.starts_with("HostConfig.NanoCpus must be set within"), "{e}");
    for swap in [json!(-1), json!(null)] {
        let e = n.refusal(|b| b["HostConfig"]["MemorySwap"] = swap.clone());
        assert!(e.starts_with("HostConfig.MemorySwap must be set and equal HostConfig.Memory"), "{swap}: {e}");
    }
}

#[test]
fn labels_kind_image_and_name_are_held_to_the_node() {
    let n = node();
    let e = n.refusal(|b| b["Labels"]["fleet.node"] = json!("other-node"));
    assert_eq!(e, "Labels must carry fleet.managed=1 and fleet.node=n1");
    let e = n.refusal(|b| b["Labels"]["fleet.kind"] = json!("nope"));
    assert!(e.starts_with("Labels must name one of node.yaml's executors in fleet.kind"), "{e}");
    let e = n.refusal(|b| b["Image"] = json!("plain:1"));
    assert!(e.starts_with("Image \"plain:1\" is neither kind k's image"), "another kind's image: {e}");
    let body = n.own_body().to_string();
    for name in [None, Some("other-0"), Some("fl-a&x=1"), Some("fl-a b"), Some("fl-a/b")] {
        assert!(n.policy.container_request(name, body.as_bytes()).is_err(), "{name:?}");
    }
}

/// A kind without `user` runs as the node's own user, and never as root unless node.yaml names
/// it: root nodes give their containers 65534:65534.
#[test]
fn a_kind_without_user_runs_as_the_node_s_user() {
    let n = node();
    let plain = |user: Value| {
        let mut b = n.own_body();
        b["Labels"]["fleet.kind"] = json!("plain");
        b["Image"] = json!("plain:1");
        b["User"] = user;
        b["HostConfig"]["Mounts"].as_array_mut().unwrap().remove(1);
        b["HostConfig"]["CapAdd"] = json!(null);
        n.admit(b.to_string().as_bytes())
    };
    assert_eq!(plain(json!("4242:4243")).unwrap().owner, Owner { uid: 4242, gid: Some(4243) });
    for user in [json!("0:0"), json!("0"), json!(null), json!("root"), json!("4242")] {
        let e = plain(user.clone()).unwrap_err();
        assert!(e.starts_with("User must be \"4242:4243\" (the node's own user"), "{user}: {e}");
    }
    assert_eq!(Policy::from_config(&n.cfg, (0, 0)).default_user.to_string(), "65534:65534");
}

#[test]
fn mounts_come_only_from_the_node_s_directories_and_volumes() {
    let n = node();
    let host = n.dir.path().display().to_string();
    for source in [
        "/",
        "/etc",
        &format!("{host}/state"),
        &format!("{host}/state/agents"),
        &format!("{host}/state/agents/coder"),
        &format!("{host}/state/agents/other/agent-pat"),
        &format!("{host}/state/agents/coder/../other/agent-pat"),
        &format!("{host}/state/agents/coder/agent-pat/x"),
        &format!("{host}/secrets/a/b"),
        &format!("{host}/secrets/README.md"),
    ] {
        let e = n.refusal(|b| b["HostConfig"]["Mounts"][0]["Source"] = json!(source));
        assert!(e.starts_with(&format!("bind source {source:?} is not allowed")), "{source}: {e}");
    }
    let e = n.refusal(|b| b["HostConfig"]["Mounts"][0]["ReadOnly"] = json!(false));
    assert!(e.ends_with("must be ReadOnly"), "{e}");
    let e = n.refusal(|b| b["HostConfig"]["Mounts"][2]["Source"] = json!("postgres-data"));
    assert_eq!(e, "volume \"postgres-data\" is not allowed: only volumes named fl-…");
    let e = n.refusal(|b| b["HostConfig"]["Mounts"][2]["Type"] = json!("tmpfs"));
    assert_eq!(e, "mount type \"tmpfs\" is not allowed: only bind and volume");
}

/// docs/behaviour.md#busy-replicas: the one writable bind is the container's own lease
/// directory, named exactly by the container's name at `/run/fleet/busy`; any other writable
/// bind, or another container's lease directory, is refused.
#[test]
fn the_only_writable_bind_is_the_container_s_own_lease_directory() {
    let n = node();
    let host = n.dir.path().display().to_string();
    assert_eq!(n.own_body()["HostConfig"]["Mounts"][3]["Target"], "/run/fleet/busy");
    for source in [
        format!("{host}/state/leases/fl-other-0"),
        format!("{host}/state/leases"),
        format!("{host}/state/leases/fl-coder-0/x"),
        format!("{host}/state/leases/../agents"),
        "/".to_string(),
    ] {
        let e = n.refusal(|b| b["HostConfig"]["Mounts"][3]["Source"] = json!(source));
        assert!(e.ends_with("must be ReadOnly"), "{source}: {e}");
    }
    let e = n.refusal(|b| b["HostConfig"]["Mounts"][3]["Target"] = json!("/etc"));
    assert!(e.ends_with("must be ReadOnly"), "{e}");
    let e = n.refusal(|b| b["HostConfig"]["Mounts"][3]["ReadOnly"] = json!(true));
    assert!(e.contains("is not allowed"), "read-only it is neither a PAT nor a secret: {e}");
}

/// A kind that lists its secrets mounts only those: a compromised node cannot hand another
/// kind's secret to a container.
#[test]
fn secrets_are_mounted_only_by_the_kinds_that_list_them() {
    let n = node();
    std::fs::write(n.dir.path().join("secrets/other"), "s").unwrap();
    let host = n.dir.path().display().to_string();
    let e = n.refusal(|b| b["HostConfig"]["Mounts"][1]["Source"] = json!(format!("{host}/secrets/other")));
    assert_eq!(e, "secret \"other\" is not allowed: executors.k.secrets does not list it");
}

#[test]
fn volumes_are_created_only_with_the_prefix_labels_and_the_local_driver() {
    let n = node();
    let ok = json!({"Name": "fl-coder-0-data", "Labels": {"fleet.managed": "1", "fleet.node": "n1"}});
    let check = |b: &Value| n.policy.volume_request(b.to_string().as_bytes()).map_err(|r| r.0);
    assert!(check(&ok).is_ok());
    for (change, rule) in [
        (json!({"Name": "data"}), "volume \"data\" is not allowed"),
        (json!({"Labels": {}}), "volume Labels must carry"),
        (json!({"Driver": "local-persist"}), "volume Driver \"local-persist\" is not allowed"),
        (json!({"DriverOpts": {"device": "/"}}), "volume DriverOpts are not allowed"),
        (json!({"DriverConfig": {}}), "DriverConfig is not allowed"),
        (json!({"name": "fl-x"}), "name is refused: Docker would read it as Name"),
    ] {
        let mut b = ok.clone();
        for (k, v) in change.as_object().unwrap() {
            b[k] = v.clone();
        }
        let e = check(&b).unwrap_err();
        assert!(e.starts_with(rule), "{change}: {e}");
    }
    assert!(check(&json!({"Name": "fl-x", "Labels": {"fleet.managed": "1", "fleet.node": "n1"}, "Driver": "local"}))
        .is_ok());
}

#[test]
fn ownership_reads_the_labels() {
    let n = node();
    let mine = json!({"fleet.managed": "1", "fleet.node": "n1"});
    let theirs = json!({"fleet.managed": "1", "fleet.node": "n2"});
    assert!(n.policy.owns(|k| mine.get(k).and_then(Value::as_str)));
    assert!(!n.policy.owns(|k| theirs.get(k).and_then(Value::as_str)));
    assert!(!n.policy.owns(|_| None));
}
