use super::*;
use serde_json::json;

fn policy() -> Policy {
    let yaml = "controllerUrl: https://c.example\nname: n1\ncapacity: {slots: 2}\n\
                executors:\n  k: {image: \"agent:1\", images: [\"reg/obs:1.*\"], capAdd: [NET_BIND_SERVICE]}\n\
                stateDir: /var/lib/fleet-node\nhostStateDir: /srv/state\nsecretsDir: /etc/fleet-node/secrets\n\
                hostSecretsDir: /srv/secrets\nnetwork: fleet-agents\ncontainerPrefix: fl\n";
    Policy::from_config(&NodeConfig::parse(yaml, "node.yaml", &|_| None).unwrap())
}

/// The body fleet-node sends for a replica (docs/behaviour.md#the-agent-container), as bollard serialises it.
fn create() -> Value {
    json!({
        "Image": "agent:1",
        "Env": ["CONTROL_PLANE_AGENT_KEY=coder"],
        "Labels": {"fleet.managed": "1", "fleet.node": "n1", "fleet.agent": "coder"},
        "HostConfig": {
            "Init": true,
            "RestartPolicy": {"Name": "no"},
            "NetworkMode": "fleet-agents",
            "Memory": 1073741824,
            "MemorySwap": 1073741824,
            "CapDrop": ["ALL"],
            "SecurityOpt": ["no-new-privileges"],
            "PidsLimit": 1024,
            "LogConfig": {"Type": "json-file", "Config": {"max-size": "10m", "max-file": "3"}},
            "Mounts": [
                {"Target": "/run/secrets/agent-pat", "Source": "/srv/state/agents/coder/agent-pat", "Type": "bind", "ReadOnly": true},
                {"Target": "/run/secrets/gh", "Source": "/srv/secrets/gh", "Type": "bind", "ReadOnly": true},
                {"Target": "/data", "Source": "fl-coder-0-data", "Type": "volume", "ReadOnly": false}
            ]
        }
    })
}

fn refused(body: Value) -> String {
    policy().check_container(&body).expect_err("refused").0
}

#[test]
fn only_the_endpoints_fleet_node_uses_are_routed() {
    assert_eq!(route("GET", "/_ping"), Ok(Route::Plain));
    assert_eq!(route("HEAD", "/v1.41/_ping"), Ok(Route::Plain));
    assert_eq!(route("GET", "/v1.47/version"), Ok(Route::Plain));
    assert_eq!(route("GET", "/v1.41/containers/json"), Ok(Route::Plain));
    assert_eq!(route("GET", "/v1.41/volumes"), Ok(Route::Plain));
    assert_eq!(route("POST", "/v1.41/containers/create"), Ok(Route::CreateContainer));
    assert_eq!(route("POST", "/v1.41/volumes/create"), Ok(Route::CreateVolume));
    let own = [
        ("GET", "/containers/abc/json"),
        ("POST", "/containers/abc/start"),
        ("POST", "/containers/abc/stop"),
        ("DELETE", "/containers/abc"),
    ];
    for (m, p) in own {
        assert_eq!(route(m, &format!("/v1.41{p}")), Ok(Route::Container("abc".into())), "{m} {p}");
    }
    for (m, p) in [
        ("POST", "/v1.41/containers/abc/exec"),
        ("POST", "/exec/abc/start"),
        ("PUT", "/v1.41/containers/abc/archive"),
        ("GET", "/v1.41/containers/abc/archive"),
        ("GET", "/v1.41/containers/abc/export"),
        ("POST", "/v1.41/containers/abc/kill"),
        ("POST", "/v1.41/images/create"),
        ("POST", "/v1.41/networks/create"),
        ("POST", "/v1.41/build"),
        ("DELETE", "/v1.41/volumes/fl-x"),
        ("GET", "/v1.41/info"),
        ("POST", "/v1.41/containers/..%2Fimages%2Fcreate/start"),
    ] {
        let e = route(m, p).expect_err(p).0;
        assert!(e.ends_with("is not an endpoint fleet-node uses"), "{e}");
    }
}

#[test]
fn the_node_s_own_create_body_passes() {
    assert_eq!(policy().check_container(&create()), Ok(()));
    let mut b = create();
    b["Image"] = json!("reg/obs:1.4");
    assert_eq!(policy().check_container(&b), Ok(()), "an image the allow-list admits");
}

#[test]
fn privileged_host_namespaces_devices_and_capabilities_are_refused() {
    let mut b = create();
    b["HostConfig"]["Privileged"] = json!(true);
    assert_eq!(refused(b), "HostConfig.Privileged is not allowed");
    for key in ["PidMode", "IpcMode", "UTSMode", "UsernsMode"] {
        let mut b = create();
        b["HostConfig"][key] = json!("host");
        assert!(refused(b).starts_with(&format!("HostConfig.{key} \"host\" is not allowed")), "{key}");
    }
    let mut b = create();
    b["HostConfig"]["NetworkMode"] = json!("host");
    assert!(refused(b).starts_with("HostConfig.NetworkMode \"host\" is not allowed"));
    let mut b = create();
    b["HostConfig"]["NetworkMode"] = json!("container:db");
    assert!(refused(b).starts_with("HostConfig.NetworkMode \"container:db\""));
    let mut b = create();
    b["HostConfig"]["Devices"] = json!([{"PathOnHost": "/dev/sda"}]);
    assert_eq!(refused(b), "HostConfig.Devices is not allowed");
    let mut b = create();
    b["HostConfig"]["CapAdd"] = json!(["SYS_ADMIN"]);
    assert_eq!(refused(b), "HostConfig.CapAdd \"SYS_ADMIN\" is not allowed: node.yaml's capAdd does not grant it");
    let mut b = create();
    b["HostConfig"]["CapAdd"] = json!(["NET_BIND_SERVICE"]);
    assert_eq!(policy().check_container(&b), Ok(()), "what node.yaml grants");
    let mut b = create();
    b["HostConfig"]["LogConfig"] = json!({"Type": "syslog", "Config": {"syslog-address": "udp://x:514"}});
    assert!(refused(b).starts_with("HostConfig.LogConfig.Type \"syslog\" is not allowed"));
    let mut b = create();
    b["HostConfig"]["SecurityOpt"] = json!(["seccomp=unconfined"]);
    assert_eq!(refused(b), "HostConfig.SecurityOpt \"seccomp=unconfined\" is not allowed");
    let mut b = create();
    b["HostConfig"]["CgroupParent"] = json!("/");
    assert_eq!(refused(b), "HostConfig.CgroupParent is not allowed", "anything not looked at is refused");
    let mut b = create();
    b["HostConfig"]["Privileged"] = json!(false);
    b["HostConfig"]["CgroupParent"] = json!("");
    assert_eq!(policy().check_container(&b), Ok(()), "empty values of other keys are fine");
}

#[test]
fn binds_come_only_from_pat_directories_and_secret_files() {
    let sources = [
        "/",
        "/srv/state",
        "/srv/state/agents",
        "/srv/state/agents/../node.key",
        "/srv/secrets/a/b",
        "/etc",
        "relative/x",
    ];
    for source in sources {
        let mut b = create();
        b["HostConfig"]["Mounts"][0]["Source"] = json!(source);
        assert!(refused(b).starts_with(&format!("bind source {source:?} is not allowed")), "{source}");
        let mut b = create();
        b["HostConfig"]["Binds"] = json!([format!("{source}:/host")]);
        assert!(refused(b).starts_with(&format!("bind source {source:?}")), "Binds {source}");
    }
    let mut b = create();
    b["HostConfig"]["Binds"] = json!(["/srv/secrets/gh:/run/secrets/gh:ro"]);
    assert_eq!(policy().check_container(&b), Ok(()));
    let mut b = create();
    b["HostConfig"]["Mounts"][2]["Source"] = json!("postgres-data");
    assert_eq!(refused(b), "volume \"postgres-data\" is not allowed: only volumes named fl-…");
    let mut b = create();
    b["HostConfig"]["Mounts"][2]["Type"] = json!("npipe");
    assert_eq!(refused(b), "mount type \"npipe\" is not allowed");
}

#[test]
fn labels_image_and_top_level_keys_are_held_to_the_node() {
    let mut b = create();
    b["Labels"]["fleet.node"] = json!("other-node");
    assert_eq!(refused(b), "Labels must carry fleet.managed=1 and fleet.node=n1");
    let mut b = create();
    b["Labels"] = json!({});
    assert!(refused(b).starts_with("Labels must carry"));
    let mut b = create();
    b["Image"] = json!("alpine:3.20");
    assert!(refused(b).starts_with("Image \"alpine:3.20\" is neither"));
    let mut b = create();
    b["Volumes"] = json!({"/x": {}});
    assert_eq!(refused(b), "Volumes is not allowed");
    assert_eq!(policy().check_container(&json!([])), Err(Refusal("the create body is not a JSON object".into())));
}

#[test]
fn volumes_are_created_only_with_the_prefix_and_the_node_s_labels() {
    let ok = json!({"Name": "fl-coder-0-data", "Labels": {"fleet.managed": "1", "fleet.node": "n1"}});
    assert_eq!(policy().check_volume(&ok), Ok(()));
    let mut b = ok.clone();
    b["Name"] = json!("data");
    assert!(policy().check_volume(&b).unwrap_err().0.starts_with("volume \"data\" is not allowed"));
    let mut b = ok.clone();
    b["Labels"] = json!({});
    assert!(policy().check_volume(&b).unwrap_err().0.starts_with("volume Labels must carry"));
    let mut b = ok;
    b["Driver"] = json!("local-persist");
    assert_eq!(policy().check_volume(&b).unwrap_err().0, "Driver is not allowed");
}

#[test]
fn ownership_reads_the_labels() {
    let p = policy();
    let mine = json!({"fleet.managed": "1", "fleet.node": "n1"});
    let theirs = json!({"fleet.managed": "1", "fleet.node": "n2"});
    assert!(p.owns(mine.as_object().unwrap()));
    assert!(!p.owns(theirs.as_object().unwrap()));
    assert!(!p.owns(&Map::new()));
}
