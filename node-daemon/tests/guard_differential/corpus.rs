//! The named create bodies: each bypass of docs/behaviour.md#what-the-guard-checks-and-why, its
//! case and duplicate variants and nested tricks, built from fleet-node's own body so that
//! only the trick differs. Raw text, since a repeated key cannot be written as a `Value`.

use serde_json::{json, Value};
use std::path::Path;

pub struct Case {
    pub what: &'static str,
    pub body: String,
    /// What the refusal must say.
    pub rule: &'static str,
}

/// `own` with `key` of `HostConfig` replaced (or added) by raw JSON `value`.
fn host_with(own: &Value, key: &str, value: &str) -> String {
    let mut b = own.clone();
    b["HostConfig"][key] = json!("@@");
    b.to_string().replace("\"@@\"", value)
}

/// `own` with `key` at the top replaced (or added) by raw JSON `value`.
fn top_with(own: &Value, key: &str, value: &str) -> String {
    let mut b = own.clone();
    b[key] = json!("@@");
    b.to_string().replace("\"@@\"", value)
}

/// `own` with raw `extra` members added at the end of its `HostConfig` object.
fn host_plus(own: &Value, extra: &str) -> String {
    let host = own["HostConfig"].to_string();
    let grown = format!("{},{extra}}}", &host[..host.len() - 1]);
    own.to_string().replace(&host, &grown)
}

pub fn cases(own: &Value, host: &Path) -> Vec<Case> {
    let host_json = own["HostConfig"].to_string();
    let evil_host = r#"{"Privileged":true,"Binds":["/:/h"],"CapDrop":[],"SecurityOpt":[]}"#;
    let without_host = {
        let mut b = own.clone();
        b.as_object_mut().unwrap().remove("HostConfig");
        b.to_string()
    };
    let top = &without_host[..without_host.len() - 1];
    let h = host.display();
    let link = host.join("state/agents/evil");
    let _ = std::os::unix::fs::symlink("/", &link);
    let mut cases = vec![
        Case {
            what: "HostConfig twice: privileged and / bound, then the node's own",
            body: format!("{top},\"HostConfig\":{evil_host},\"HostConfig\":{host_json}}}"),
            rule: "\"HostConfig\" appears twice",
        },
        Case {
            what: "HostConfig twice: the node's own, then privileged",
            body: format!("{top},\"HostConfig\":{host_json},\"HostConfig\":{evil_host}}}"),
            rule: "\"HostConfig\" appears twice",
        },
        Case {
            what: "a tmpfs mount that Docker reads as a bind of /",
            body: host_with(own, "Mounts", r#"[{"Type":"tmpfs","Source":"/","Target":"/h","type":"bind"}]"#),
            rule: "HostConfig.Mounts[0].type is refused: Docker would read it as HostConfig.Mounts[0].Type",
        },
        Case {
            what: "MaskedPaths empty: /proc unmasked",
            body: host_with(own, "MaskedPaths", "[]"),
            rule: "HostConfig.MaskedPaths is not allowed",
        },
        Case {
            what: "ReadonlyPaths empty",
            body: host_with(own, "ReadonlyPaths", "[]"),
            rule: "HostConfig.ReadonlyPaths is not allowed",
        },
        Case {
            what: "hostconfig in lower case",
            body: top_with(own, "hostconfig", evil_host),
            rule: "hostconfig is refused",
        },
        Case {
            what: "privileged in lower case",
            body: host_plus(own, r#""privileged":true"#),
            rule: "HostConfig.privileged is not allowed",
        },
        Case {
            what: "SecurityOpt with a long s",
            body: host_plus(own, "\"\u{17f}ecurityOpt\":[\"seccomp=unconfined\"]"),
            rule: "Docker would read it as HostConfig.SecurityOpt",
        },
        Case {
            what: "Privileged written with an escape, after the node's own keys",
            body: host_plus(own, r#""Privil\u0065ged":true"#),
            rule: "HostConfig.Privileged is not allowed",
        },
        Case {
            what: "a repeated CapAdd",
            body: host_plus(own, r#""CapAdd":["SYS_ADMIN"]"#),
            rule: "\"CapAdd\" appears twice",
        },
        Case {
            what: "a volume mount whose options bind /",
            body: host_with(
                own,
                "Mounts",
                r#"[{"Type":"volume","Source":"X-v","Target":"/h","VolumeOptions":{"DriverConfig":{"Name":"local","Options":{"type":"none","o":"bind","device":"/"}}}}]"#,
            ),
            rule: "HostConfig.Mounts[0].VolumeOptions is not allowed",
        },
        Case {
            what: "a bind through a link planted in the PAT directory",
            body: host_with(
                own,
                "Mounts",
                &format!(r#"[{{"Type":"bind","Source":"{h}/state/agents/evil/etc","Target":"/h","ReadOnly":true}}]"#),
            ),
            rule: "is not allowed: only",
        },
        Case {
            what: "Binds of /",
            body: host_with(own, "Binds", r#"["/:/h"]"#),
            rule: "HostConfig.Binds is not allowed",
        },
        Case {
            what: "a device",
            body: host_with(
                own,
                "Devices",
                r#"[{"PathOnHost":"/dev/mem","PathInContainer":"/dev/mem","CgroupPermissions":"rwm"}]"#,
            ),
            rule: "HostConfig.Devices is not allowed",
        },
        Case {
            what: "the host's PID namespace",
            body: host_with(own, "PidMode", "\"host\""),
            rule: "HostConfig.PidMode",
        },
        Case {
            what: "the host's network",
            body: host_with(own, "NetworkMode", "\"host\""),
            rule: "HostConfig.NetworkMode \"host\"",
        },
        Case {
            what: "no PIDs limit",
            body: host_with(own, "PidsLimit", "-1"),
            rule: "HostConfig.PidsLimit must be set",
        },
        Case { what: "capabilities kept", body: host_with(own, "CapDrop", "[]"), rule: "HostConfig.CapDrop must be" },
        Case {
            what: "seccomp off",
            body: host_with(own, "SecurityOpt", r#"["seccomp=unconfined"]"#),
            rule: "HostConfig.SecurityOpt",
        },
        Case { what: "root", body: top_with(own, "User", "\"0\""), rule: "User must be" },
        Case { what: "memory unlimited", body: host_with(own, "Memory", "0"), rule: "HostConfig.Memory must be set" },
        Case { what: "an image of no kind", body: top_with(own, "Image", "\"fleet-test-agent:exit0\""), rule: "Image" },
        Case {
            what: "the node's labels on another node's name",
            body: top_with(own, "Labels", r#"{"fleet.managed":"1","fleet.node":"someone-else","fleet.kind":"k"}"#),
            rule: "Labels must carry",
        },
        Case {
            what: "an Entrypoint",
            body: top_with(own, "Entrypoint", r#"["/bin/busybox","sh"]"#),
            rule: "Entrypoint is not allowed",
        },
        Case {
            what: "a repeated label",
            body: own.to_string().replacen(
                "\"fleet.managed\":\"1\"",
                "\"fleet.managed\":\"1\",\"fleet.managed\":\"0\"",
                1,
            ),
            rule: "\"fleet.managed\" appears twice",
        },
        Case {
            what: "two documents",
            body: format!("{own} {{\"HostConfig\":{evil_host}}}"),
            rule: "not JSON the guard accepts",
        },
    ];
    for key in ["HOSTCONFIG", "hostConfig", "Hostconfig"] {
        cases.push(Case {
            what: "HostConfig in another case",
            body: top_with(own, key, evil_host),
            rule: "Docker would read it as HostConfig",
        });
    }
    cases
}

/// Volume bodies that would reach the host's files: each refused.
pub fn volume_cases(prefix: &str, node: &str) -> Vec<(Value, &'static str)> {
    let labels = json!({"fleet.managed": "1", "fleet.node": node});
    let name = format!("{prefix}-v");
    vec![
        (
            json!({"Name": name, "Labels": labels, "DriverOpts": {"type": "none", "o": "bind", "device": "/"}}),
            "DriverOpts are not allowed",
        ),
        (json!({"Name": name, "Labels": labels, "driveropts": {"device": "/"}}), "driveropts is refused"),
        (json!({"Name": name, "Labels": labels, "Driver": "vieux/sshfs"}), "Driver \\\"vieux/sshfs\\\" is not allowed"),
        (json!({"Name": "elsewhere", "Labels": labels}), "is not allowed: only volumes named"),
    ]
}
