use super::*;
use fleet_api::windows::MaintenanceWindow;
use fleet_api::Capacity;

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

/// The problems without their lines.
fn problems(text: &str) -> Vec<String> {
    match parse(text) {
        Err(ConfigError::Invalid { problems, .. }) => problems.iter().map(Problem::what).collect(),
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

/// Every problem with its line, as `fleet-node check` prints them.
fn lines_of(text: &str) -> Vec<String> {
    match parse(text) {
        Err(ConfigError::Invalid { problems, .. }) => problems.iter().map(Problem::to_string).collect(),
        other => panic!("expected invalid, got {other:?}"),
    }
}

const TOP_FIELDS: &str = "controllerUrl, name, labels, capacity, executors, stateDir, hostStateDir, secretsDir, \
                          hostSecretsDir, guardDir, dockerUrl, network, agentEnv, joinKeyFile, observeSeconds, containerPrefix, \
                          caFile, insecure, checkBeforeStop, maintenanceWindows";
const EXECUTOR_FIELDS: &str =
    "image, images, env, dataPath, capAdd, pidsLimit, user, defaultResources, maxResources, secrets";

/// docs/reference.md#node-configuration-nodeyaml: two unknown fields, a wrong type and two bad
/// capacity fields are five problems in one error, each with its line.
#[test]
fn five_problems_are_listed_at_once_each_with_its_line() {
    let text = include_str!("../../tests/data/five-problems.yaml");
    assert_eq!(
        lines_of(text),
        [
            format!("line 5: unknown field `labelz`; expected one of: {TOP_FIELDS}"),
            "line 7: capacity.slots: expected a whole number, got \"four\"".into(),
            "line 8: capacity.cpus: must be a positive number, got 0".into(),
            "line 9: capacity.memoryMb: must be at least 64, got 32".into(),
            format!("line 13: unknown field `dataPth` in executors.claude-code; expected one of: {EXECUTOR_FIELDS}"),
        ]
    );
}

/// MINIMAL with `extra` lines (from line 7 on).
fn with(extra: &str) -> String {
    format!("{MINIMAL}{extra}")
}

/// MINIMAL with `capacity` (on line 3) instead of its own.
fn with_capacity(capacity: &str) -> String {
    MINIMAL.replace("capacity: {slots: 1}", &format!("capacity: {capacity}"))
}

/// What the reader finds before any rule runs: each with its line, none stopping the others.
#[test]
fn parse_stage_problems_name_their_line() {
    let cases = [
        (with("gpus: 2\n"), "line 7: unknown field `gpus`; expected one of: controllerUrl,"),
        (with("observeSeconds: [1]\n"), "line 7: observeSeconds: expected a whole number, got a list"),
        (
            with("observeSeconds: 4294967296\n"),
            "line 7: observeSeconds: expected a whole number from 0 to 4294967295, got 4294967296",
        ),
        (with("insecure: yes\n"), "line 7: insecure: expected true or false, got \"yes\""),
        (with("labels: {a: b}\n"), "line 7: labels: expected a list, got a mapping"),
        (with("labels:\n  - ok\n  - [x]\n"), "line 9: labels[1]: expected a string, got a list"),
        (with("agentEnv: {A: {b: c}}\n"), "line 7: agentEnv.A: expected a string, got a mapping"),
        (with("name: w2\n"), "line 7: duplicate field `name` (first on line 2)"),
        (with("agentEnv:\n  A: x\n  A: y\n"), "line 9: duplicate key `A` in agentEnv (first on line 8)"),
        (with("executors: {}\n"), "line 7: duplicate field `executors` (first on line 4)"),
        (with_capacity("\"{slots: 1}\""), "line 3: capacity: expected a mapping, got \"{slots: 1}\""),
        (with_capacity("{slots: \"1\"}"), "line 3: capacity.slots: expected a whole number, got \"1\""),
        (with_capacity("{slots: 1.5}"), "line 3: capacity.slots: expected a whole number, got 1.5"),
        (with_capacity("{slots: 1, memoryMb: -1}"), "line 3: capacity.memoryMb: expected a whole number from 0 to"),
        (with_capacity("{slots: 1, cpus: two}"), "line 3: capacity.cpus: expected a number, got \"two\""),
        (with_capacity("{cpus: 2}"), "line 3: missing field `slots` in capacity"),
        (
            with_capacity("{slots: 1, gpus: 1}"),
            "line 3: unknown field `gpus` in capacity; expected one of: slots, cpus, memoryMb",
        ),
        (with_capacity("{slots: 1, [a]: 1}"), "line 3: a key in capacity must be a name, not a list"),
        (MINIMAL.replace("{k: {image: img:1}}", "{k: 5}"), "line 4: executors.k: expected a mapping, got 5"),
        (MINIMAL.replace("{k: {image: img:1}}", "{k: {images: []}}"), "line 4: missing field `image` in executors.k"),
        (MINIMAL.replace("name: w1\n", ""), "missing field `name`"),
        ("- a list\n".to_string(), "line 1: expected a mapping of node.yaml's fields, got a list"),
        (String::new(), "line 1: expected a mapping of node.yaml's fields, got nothing"),
    ];
    for (text, want) in &cases {
        let got = lines_of(text);
        assert!(got.iter().any(|p| p.starts_with(want)), "{text}: want {want:?} in {got:#?}");
    }
}

/// A field missing or of the wrong type is reported once: no rule also judges its placeholder.
#[test]
fn a_placeholder_brings_no_second_problem() {
    let cases = [
        (MINIMAL.replace("name: w1", "name: {a: b}"), "line 2: name: expected a string, got a mapping"),
        (MINIMAL.replace("executors: {k: {image: img:1}}\n", ""), "missing field `executors`"),
        (MINIMAL.replace("{k: {image: img:1}}", "{k: [img:1]}"), "line 4: executors.k: expected a mapping, got a list"),
        (
            MINIMAL.replace("{k: {image: img:1}}", "{k: {image: [img:1]}}"),
            "line 4: executors.k.image: expected a string, got a list",
        ),
        (MINIMAL.replace("stateDir: /s", "stateDir:"), "line 5: stateDir: expected a string, got nothing"),
    ];
    for (text, want) in &cases {
        assert_eq!(lines_of(text), [*want], "{text}");
    }
}

/// The rules' problems carry the line of the field they name.
#[test]
fn rule_problems_carry_the_line_of_their_field() {
    let text =
        "controllerUrl: ftp://c\nname: w1\nlabels:\n  - ok\n  - Bad\ncapacity: {slots: 101}\nexecutors:\n  k:\n    \
                image: img:1\n    pidsLimit: 3\nstateDir: /s\nsecretsDir: /x\nobserveSeconds: 4\n";
    assert_eq!(
        lines_of(text),
        [
            "line 1: controllerUrl: \"ftp://c\" must be an http:// or https:// URL",
            "line 5: labels[1]: \"Bad\" is not name or name=value (^[a-z0-9][a-z0-9.-]*(=[a-zA-Z0-9._-]+)?$)",
            "line 6: capacity.slots: must be 0–100, got 101",
            "line 10: executors.k.pidsLimit: must be 16–1000000, got 3",
            "line 13: observeSeconds: must be 5–300, got 4",
        ]
    );
}

/// Text that is not YAML stops the reading, with the line and column where it stops being YAML.
#[test]
fn syntax_errors_name_their_line() {
    let flow = format!("a: {}", "[".repeat(100_000));
    let block: String = (0..100).map(|depth| format!("{}k:\n", " ".repeat(depth))).collect();
    let bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n\
                c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n\
                e: [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n";
    let cases = [
        ("name: w1\ncapacity: {slots: 1\n", "node.yaml: line 3, column 1: "),
        ("name: w1\n  bad: indent\n", "node.yaml: line 2, column "),
        ("a: 1\n---\nb: 2\n", "node.yaml: line 2, column 1: node.yaml must be a single YAML document"),
        ("a: !custom 1\n", "node.yaml: line 1, column 4: the tag !custom means nothing in node.yaml"),
        ("a: *nowhere\n", "node.yaml: line 1, column 4: "),
        (&flow, "node.yaml: line 1, column 259: recursion limit exceeded"),
        (&block, "node.yaml: line 65, column 65: nested more than 64 levels deep"),
        (bomb, "node.yaml: line 5, column "),
    ];
    for (text, want) in cases {
        let e = parse(text).unwrap_err();
        assert!(matches!(e, ConfigError::Parse { .. }), "{text}: {e:?}");
        assert!(e.to_string().starts_with(want), "{:.80}: want {want:?}, got {e}", text);
    }
}

/// YAML 1.2's core schema: `yes` is a string, `0x1e` a number, an anchor can be named again.
#[test]
fn values_are_read_as_yaml_1_2() {
    let c = parse(&format!("{MINIMAL}observeSeconds: 0x1e\ninsecure: True\n")).unwrap();
    assert_eq!((c.observe_seconds, c.insecure), (30, true));
    let c = parse(&MINIMAL.replace("{k: {image: img:1}}", "{k: {image: img:1, user: 10001, env: {N: 1.50}}}")).unwrap();
    assert_eq!(c.executors["k"].user.as_deref(), Some("10001"), "a number where a string goes is its text");
    assert_eq!(c.executors["k"].env["N"], "1.50");
    let aliased = MINIMAL.replace("{k: {image: img:1}}", "\n  a: &kind {image: img:1, env: {X: \"1\"}}\n  b: *kind");
    let c = parse(&aliased).unwrap();
    assert_eq!(c.executors["a"], c.executors["b"]);
    assert!(problems(&with_capacity("{slots: 1, cpus: .inf}"))
        .contains(&"capacity.cpus: must be a positive number, got inf".to_string()));
    assert_eq!(lines_of(&with("insecure: \"true\"\n")), ["line 7: insecure: expected true or false, got \"true\""]);
}

/// Each field is read under its own name: a file naming every field gives every value (the
/// struct literal below names every field, so a new one must be added here too).
#[test]
fn every_field_is_read_by_its_name() {
    let text = r#"
controllerUrl: https://c.example.com
name: w1
labels: [gpu]
capacity: {slots: 2, cpus: 1.5, memoryMb: 1024}
executors:
  k:
    image: img:1
    images: [img:*]
    secrets: [github-token]
    env: {A: b}
    dataPath: /data
    capAdd: [NET_BIND_SERVICE]
    pidsLimit: 64
    user: "10001:10001"
    defaultResources: {cpus: 0.5, memoryMb: 128}
    maxResources: {cpus: 1, memoryMb: 256}
stateDir: /s
hostStateDir: /hs
secretsDir: /x
hostSecretsDir: /hx
guardDir: /g
dockerUrl: tcp://d:2375
network: net
agentEnv: {C: d}
joinKeyFile: /j
observeSeconds: 30
containerPrefix: fl
caFile: /ca.pem
insecure: true
checkBeforeStop: true
maintenanceWindows:
  - {schedule: "0 2 * * 6", durationMinutes: 120, timeZone: Europe/Paris}
"#;
    let kind = Executor {
        image: "img:1".into(),
        images: vec!["img:*".into()],
        secrets: Some(vec!["github-token".into()]),
        env: [("A".to_string(), "b".to_string())].into(),
        data_path: Some("/data".into()),
        cap_add: vec!["NET_BIND_SERVICE".into()],
        pids_limit: Some(64),
        user: Some("10001:10001".into()),
        default_resources: Some(ResourceLimits { cpus: Some(0.5), memory_mb: Some(128) }),
        max_resources: Some(ResourceLimits { cpus: Some(1.0), memory_mb: Some(256) }),
    };
    let want = NodeConfig {
        controller_url: "https://c.example.com".into(),
        name: "w1".into(),
        labels: vec!["gpu".into()],
        capacity: CapacityConfig { slots: 2, cpus: Some(1.5), memory_mb: Some(1024) },
        executors: [("k".to_string(), kind)].into(),
        state_dir: "/s".into(),
        host_state_dir: Some("/hs".into()),
        secrets_dir: "/x".into(),
        host_secrets_dir: Some("/hx".into()),
        guard_dir: "/g".into(),
        docker_url: "tcp://d:2375".into(),
        network: Some("net".into()),
        agent_env: [("C".to_string(), "d".to_string())].into(),
        join_key_file: Some("/j".into()),
        observe_seconds: 30,
        container_prefix: "fl".into(),
        ca_file: Some("/ca.pem".into()),
        insecure: true,
        check_before_stop: true,
        maintenance_windows: vec![MaintenanceWindow {
            schedule: "0 2 * * 6".into(),
            duration_minutes: 120,
            time_zone: "Europe/Paris".into(),
        }],
    };
    assert_eq!(parse(text).unwrap(), want);
}

/// docs/behaviour.md#maintenance-windows: node.yaml's windows are read as the controller
/// reads them, at load; each bad one is a problem naming its field and line, as is a list
/// longer than the controller takes.
#[test]
fn maintenance_windows_are_checked_at_load_naming_the_window() {
    let got = problems(&with(
        "maintenanceWindows:\n  - {schedule: \"*/5 * * * *\", durationMinutes: 2, timeZone: Europe/Paris}\n  - {schedule: \"* * *\", durationMinutes: 2, timeZone: UTC}\n  - {schedule: \"0 2 * * *\", durationMinutes: 60, timeZone: Mars/Olympus}\n  - {schedule: \"0 2 * * *\", durationMinutes: 0, timeZone: UTC}\n  - {schedule: \"0 2 * * *\", durationMinutes: 60, timezone: UTC}\n",
    ));
    let want = [
        "maintenanceWindows[1].schedule: schedule \"* * *\" is not five cron fields",
        "maintenanceWindows[2].timeZone: timeZone \"Mars/Olympus\" is not an IANA time zone",
        "maintenanceWindows[3].durationMinutes: durationMinutes 0 must be 1…10080",
        "missing field `timeZone` in maintenanceWindows[4]",
        "unknown field `timezone` in maintenanceWindows[4]",
    ];
    assert_eq!(got.len(), want.len(), "{got:#?}");
    for w in want {
        assert!(got.iter().any(|g| g.contains(w)), "{w} not in {got:#?}");
    }
    let many =
        (0..17).map(|_| "  - {schedule: \"0 2 * * *\", durationMinutes: 60, timeZone: UTC}\n").collect::<String>();
    let got = problems(&with(&format!("maintenanceWindows:\n{many}")));
    assert!(got.iter().any(|g| g.contains("maintenanceWindows: at most 16 windows, got 17")), "{got:#?}");
    assert!(parse(&with("")).unwrap().maintenance_windows.is_empty(), "none by default: always open");
}

/// Input never makes the reader panic (as fuzz/fuzz_targets/node_yaml.rs asks): every cut of a
/// file, mid-token included, is read or refused.
#[test]
fn every_prefix_of_a_file_is_read_or_refused() {
    for text in [SPEC_EXAMPLE, include_str!("../../tests/data/five-problems.yaml")] {
        for (end, _) in text.char_indices() {
            let _ = parse(&text[..end]);
        }
    }
}

/// docs/behaviour.md#secrets: `executors.<k>.secrets` lists what an agent of the kind may mount;
/// a bad name is a problem naming its entry, a kind without the list may mount every secret (a
/// start-up warning says so), and a listed secret missing from `secretsDir` is a warning, not a
/// problem: secret files come and go while the node runs.
#[test]
fn secrets_per_kind_are_read_checked_and_warned_of() {
    let text = MINIMAL.replace(
        "executors: {k: {image: img:1}}",
        "executors: {k: {image: img:1, secrets: [github-token, mail]}, open: {image: img:1}}",
    );
    let c = parse(&text).unwrap();
    assert_eq!(c.executors["k"].secrets, Some(vec!["github-token".to_string(), "mail".to_string()]));
    assert_eq!(c.executors["open"].secrets, None);
    assert!(c.secret_allowed("k", "mail") && !c.secret_allowed("k", "aws"), "k: only its list");
    assert!(c.secret_allowed("open", "aws"), "a kind without a list: every secret");

    let present: std::collections::BTreeSet<String> = ["github-token".to_string(), "aws".to_string()].into();
    assert_eq!(c.offered_secrets(&present), [("k".to_string(), vec!["github-token".to_string()])].into());
    assert_eq!(
        c.secret_warnings(&present),
        [
            "executors.k.secrets names mail, which is not in secretsDir: an agent naming it is refused until the file is there",
            "executors.open.secrets is not set: agents of kind open may mount every secret in secretsDir; list the ones they need",
        ]
    );

    let bad = MINIMAL
        .replace("executors: {k: {image: img:1}}", "executors: {k: {image: img:1, secrets: [gh, agent-pat, Bad]}}");
    let p = problems(&bad);
    assert!(p.iter().any(|m| m.starts_with("executors.k.secrets[1]: \"agent-pat\" is not a secret name")), "{p:?}");
    assert!(p.iter().any(|m| m.starts_with("executors.k.secrets[2]: \"Bad\" is not a secret name")), "{p:?}");
    assert_eq!(p.len(), 2, "{p:?}");
}
