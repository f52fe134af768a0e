use super::*;

const SPEC_EXAMPLE: &str = r#"
controllerUrl: https://platform.example.com/fleet
name: worker-1
labels: [claude-subscription, repos]
capacity: {slots: 4, cpus: 8, memoryMb: 16384}
executors:
  claude-code: {image: agent-runner:1.4.0, dataPath: /runner,
                env: {CP_TEST_DATABASE_URL: "postgresql+psycopg://test:test@db-test:5432/test"}}
  observer:
    image: observer-base:1.0.0
    dataPath: /data
    images: [registry.example.com/observers/mail:1.*, registry.example.com/observers/tickets:2.0.3]
stateDir: /var/lib/fleet-node
secretsDir: /etc/fleet-node/secrets
dockerUrl: tcp://docker-proxy:2375
network: fleet-agents
agentEnv: {CONTROL_PLANE_SERVER: https://platform.example.com}
joinKeyFile: /etc/fleet-node/join-key
observeSeconds: 20
"#;

const MINIMAL: &str = "controllerUrl: http://127.0.0.1:8040\nname: w1\ncapacity: {slots: 1}\nexecutors: {k: {image: img:1}}\nstateDir: /s\nsecretsDir: /x\n";

fn no_env(_: &str) -> Option<String> {
    None
}

fn parse(text: &str) -> Result<NodeConfig, ConfigError> {
    NodeConfig::parse(text, "node.yaml", &no_env)
}

fn problems(text: &str) -> Vec<String> {
    match parse(text) {
        Err(ConfigError::Invalid { problems, .. }) => problems,
        other => panic!("expected invalid, got {other:?}"),
    }
}

#[test]
fn spec_example_parses() {
    let c = parse(SPEC_EXAMPLE).unwrap();
    assert_eq!(c.name, "worker-1");
    assert_eq!(c.capacity(), Capacity { slots: 4, cpus: Some(8.0), memory_mb: Some(16384) });
    assert_eq!(c.kinds(), vec!["claude-code", "observer"]);
    assert_eq!(c.images().len(), 1, "kinds with an empty list are omitted");
    assert_eq!(c.executors["claude-code"].data_path.as_deref(), Some("/runner"));
    assert_eq!(c.docker_url, "tcp://docker-proxy:2375");
    assert_eq!(c.host_state_dir(), Path::new("/var/lib/fleet-node"));
}

#[test]
fn defaults() {
    let c = parse(MINIMAL).unwrap();
    assert_eq!(c.docker_url, "unix:///var/run/docker.sock");
    assert_eq!(c.observe_seconds, 20);
    assert_eq!(c.container_prefix, "fleet");
    assert!(c.labels.is_empty() && c.agent_env.is_empty() && c.network.is_none() && c.join_key_file.is_none());
    assert_eq!(c.host_secrets_dir(), Path::new("/x"));
}

#[test]
fn unknown_and_missing_fields_are_named() {
    let e = parse(&format!("{MINIMAL}gpus: 2\n")).unwrap_err().to_string();
    assert!(e.contains("unknown field `gpus`"), "{e}");
    let e = parse(&MINIMAL.replace("executors: {k: {image: img:1}}", "executors: {k: {image: img:1, tag: x}}"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown field `tag`"), "{e}");
    let e = parse(&MINIMAL.replace("name: w1\n", "")).unwrap_err().to_string();
    assert!(e.contains("missing field `name`"), "{e}");
}

#[test]
fn substitution_lists_every_unset_name_and_skips_comments() {
    let text = "# a comment with ${NOT_CHECKED}\ncontrollerUrl: ${URL}\nname: ${A}-${B}\ncapacity: {slots: 1}\nexecutors: {k: {image: img:1}}\nstateDir: ${A}\nsecretsDir: /x\n";
    let e = parse(text).unwrap_err();
    assert_eq!(e, ConfigError::Unset(vec!["URL".into(), "A".into(), "B".into()]));
    assert_eq!(e.to_string(), "unset environment variables: URL, A, B");
    let env = |k: &str| match k {
        "URL" => Some("http://localhost".to_string()),
        "A" => Some("w".into()),
        "B" => Some("1".into()),
        _ => None,
    };
    let c = NodeConfig::parse(text, "node.yaml", &env).unwrap();
    assert_eq!((c.controller_url.as_str(), c.name.as_str()), ("http://localhost", "w-1"));
    assert_eq!(substitute("x: ${UNCLOSED\n", &no_env).unwrap(), "x: ${UNCLOSED\n");
}

#[test]
fn every_rule_is_checked_and_all_problems_listed_at_once() {
    let bad = r#"
controllerUrl: ftp://c
name: Worker_1
labels: [ok, Bad, "gpu="]
capacity: {slots: 101, memoryMb: 32, cpus: -1}
executors:
  "Bad Kind": {image: "img:1"}
  k: {image: "img:*", images: ["a*:1", "b:**"], env: {"1X": v, FLEET_REPLICA: "3"}, dataPath: relative}
stateDir: /s
secretsDir: /x
dockerUrl: http://docker
observeSeconds: 4
containerPrefix: Fleet
network: "bad net"
agentEnv: {IAM_PRINCIPAL: x}
"#;
    let p = problems(bad);
    let expect = [
        "controllerUrl",
        "name:",
        "labels[1]",
        "labels[2]",
        "capacity.slots",
        "executors.Bad Kind:",
        "executors.k.image",
        "executors.k.images: image pattern \"a*:1\"",
        "executors.k.images: image pattern \"b:**\"",
        "executors.k.env: \"1X\"",
        "executors.k.env: FLEET_REPLICA is set by Fleet itself",
        "executors.k.dataPath",
        "dockerUrl",
        "observeSeconds",
        "containerPrefix",
        "network",
        "agentEnv: IAM_PRINCIPAL is set by Fleet itself",
    ];
    for e in expect {
        assert!(p.iter().any(|x| x.starts_with(e) || x.contains(e)), "missing problem {e:?} in {p:#?}");
    }
    let text = parse(bad).unwrap_err().to_string();
    assert!(text.starts_with("node.yaml: invalid configuration:"), "{text}");
}

#[test]
fn capacity_rules() {
    assert!(problems(&MINIMAL.replace("{slots: 1}", "{slots: 1, memoryMb: 63}"))
        .iter()
        .any(|p| p.contains("capacity.memoryMb")));
    assert!(parse(&MINIMAL.replace("{slots: 1}", "{slots: 0}")).is_ok(), "slots 0 is allowed");
    assert!(parse(&MINIMAL.replace("{slots: 1}", "{slots: 100, memoryMb: 64}")).is_ok());
    assert!(problems(&MINIMAL.replace("executors: {k: {image: img:1}}", "executors: {}"))
        .iter()
        .any(|p| p.starts_with("executors")));
}

#[test]
fn observe_seconds_edges() {
    assert!(parse(&format!("{MINIMAL}observeSeconds: 5\n")).is_ok());
    assert!(parse(&format!("{MINIMAL}observeSeconds: 300\n")).is_ok());
    assert!(parse(&format!("{MINIMAL}observeSeconds: 301\n")).is_err());
}

/// docs/behaviour.md#hardening: a plain http:// controllerUrl only to this machine, unless `insecure: true`.
#[test]
fn plain_http_to_another_host_needs_insecure() {
    let remote = MINIMAL.replace("http://127.0.0.1:8040", "http://controller.example.com/fleet");
    let p = problems(&remote);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].starts_with(
            "controllerUrl: \"http://controller.example.com/fleet\": plain http:// is allowed only for loopback hosts"
        ),
        "{p:?}"
    );
    parse(&format!("{remote}insecure: true\n")).unwrap();
    parse(&MINIMAL.replace("http://127.0.0.1:8040", "https://controller.example.com/fleet")).unwrap();
}

/// docs/behaviour.md#hardening: the kind's container limits are validated like the rest of node.yaml.
#[test]
fn container_limits_are_validated_naming_the_field() {
    let with = |extra: &str| MINIMAL.replace("{k: {image: img:1}}", &format!("{{k: {{image: img:1, {extra}}}}}"));
    parse(&with("capAdd: [NET_BIND_SERVICE], pidsLimit: 64, user: \"10001:10001\", defaultResources: {cpus: 0.5, memoryMb: 128}, maxResources: {cpus: 2, memoryMb: 4096}")).unwrap();
    for (extra, field) in [
        ("capAdd: [ALL]", "executors.k.capAdd[0]"),
        ("capAdd: [sys_admin]", "executors.k.capAdd[0]"),
        ("pidsLimit: 1", "executors.k.pidsLimit"),
        ("user: \"root; rm\"", "executors.k.user"),
        ("maxResources: {memoryMb: 2}", "executors.k.maxResources.memoryMb"),
        ("defaultResources: {cpus: 4}, maxResources: {cpus: 2}", "executors.k.defaultResources"),
    ] {
        let p = problems(&with(extra));
        assert!(p.iter().any(|m| m.starts_with(&format!("{field}:"))), "{extra}: {p:?}");
    }
}
