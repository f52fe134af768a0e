//! What `docker inspect` of an admitted container must show (docs/behaviour.md#what-the-guard-checks-and-why):
//! read from the engine's own account of the container, not from the body sent.

use super::Lab;
use serde_json::Value;

/// Whether an inspected field is as it may be.
type Allowed = fn(&Value) -> bool;

/// Options no create body may change: each must be the engine's default.
const DEFAULTS: &[(&str, Allowed)] = &[
    ("Privileged", |v| v == false),
    ("PidMode", |v| v.as_str().unwrap_or("").is_empty()),
    ("UTSMode", |v| v.as_str().unwrap_or("").is_empty()),
    ("UsernsMode", |v| v.as_str().unwrap_or("").is_empty()),
    ("IpcMode", |v| matches!(v.as_str(), Some("private" | "shareable" | ""))),
    ("CgroupnsMode", |v| v.as_str() != Some("host") || !cgroup_v2()),
    ("Devices", empty),
    ("DeviceRequests", empty),
    ("DeviceCgroupRules", empty),
    ("Binds", empty),
    ("Tmpfs", empty),
    ("Sysctls", empty),
    ("PortBindings", empty),
    ("VolumesFrom", empty),
    ("CgroupParent", |v| v.as_str().unwrap_or("").is_empty()),
    ("OomKillDisable", |v| v != true),
    ("PublishAllPorts", |v| v != true),
];

fn empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

fn cgroup_v2() -> bool {
    std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// Panics, naming `what` and the field, unless container `c` is as fleet-node's rules allow.
pub fn assert_clean(lab: &Lab, c: &Value, what: &str) {
    let host = &c["HostConfig"];
    let fail = |field: &str| -> ! { panic!("{what}: the engine created a container with {field}: {}", host) };
    for (field, ok) in DEFAULTS {
        if !ok(&host[*field]) {
            fail(field);
        }
    }
    let kind = &lab.cfg.executors["k"];
    if host["CapDrop"] != serde_json::json!(["ALL"]) {
        fail("CapDrop other than [ALL]");
    }
    let caps: Vec<&str> = host["CapAdd"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    if caps.iter().any(|cap| !kind.cap_add.iter().any(|k| k == cap || format!("CAP_{k}") == *cap)) {
        fail("a capability the kind does not grant");
    }
    let opts: Vec<&str> = host["SecurityOpt"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    if opts.is_empty() || opts.iter().any(|o| !o.starts_with("no-new-privileges")) {
        fail("SecurityOpt other than no-new-privileges");
    }
    if empty(&host["MaskedPaths"]) || empty(&host["ReadonlyPaths"]) {
        fail("masked or read-only paths removed");
    }
    let pids = host["PidsLimit"].as_i64().unwrap_or(0);
    if pids <= 0 || pids > kind.pids_limit.unwrap_or(1024) {
        fail("PidsLimit outside the kind's");
    }
    let memory = host["Memory"].as_i64().unwrap_or(0);
    if memory <= 0 || memory > 256 << 20 || host["MemorySwap"].as_i64() != Some(memory) {
        fail("Memory or MemorySwap outside the kind's maximum");
    }
    let cpus = host["NanoCpus"].as_i64().unwrap_or(0);
    if cpus <= 0 || cpus > 1_000_000_000 {
        fail("NanoCpus outside the kind's maximum");
    }
    if !matches!(host["NetworkMode"].as_str(), Some("default" | "bridge" | "none" | "")) {
        fail("a network other than the default");
    }
    if c["Config"]["User"].as_str() != kind.user.as_deref() {
        panic!("{what}: the engine created a container running as {}", c["Config"]["User"]);
    }
    if c["Config"]["Image"].as_str() != Some(kind.image.as_str()) {
        panic!("{what}: the engine created a container of image {}", c["Config"]["Image"]);
    }
    for m in c["Mounts"].as_array().into_iter().flatten() {
        assert_mount_clean(lab, m, what);
    }
}

/// A bind is read-only, one of the guard's own files (a copy of the PAT or of a secret, in a
/// directory of `guardDir`), and holds what its source held; a volume is local and named
/// with the prefix.
fn assert_mount_clean(lab: &Lab, m: &Value, what: &str) {
    let source = std::path::Path::new(m["Source"].as_str().unwrap_or(""));
    let ok = match m["Type"].as_str() {
        Some("bind") => {
            let in_guard = source.parent().and_then(|d| d.parent()) == Some(lab.cfg.guard_dir.as_path());
            let copied = match source.file_name().and_then(|n| n.to_str()) {
                // The one writable bind: the container's lease directory, the guard's own.
                Some("busy") => return assert_lease_dir(m, in_guard, what),
                Some("agent-pat") => Some(lab.cfg.state_dir.join("agents/coder/agent-pat")),
                Some(n) => n.strip_prefix("secret-").map(|s| lab.cfg.secrets_dir.join(s)),
                None => None,
            };
            let same = copied.is_some_and(|c| std::fs::read(c).ok() == std::fs::read(source).ok());
            m["RW"] == false && in_guard && same && !std::fs::symlink_metadata(source).is_ok_and(|f| f.is_symlink())
        }
        Some("volume") => {
            m["Driver"] == "local" && m["Name"].as_str().unwrap_or("").starts_with(&format!("{}-", lab.prefix))
        }
        _ => false,
    };
    assert!(ok, "{what}: the engine created a container with the mount {m}");
}

/// The lease directory a container may write (docs/behaviour.md#busy-replicas): made by the
/// guard in its own directory, a real directory, bound at `/run/fleet/busy` only.
fn assert_lease_dir(m: &Value, in_guard: bool, what: &str) {
    let source = std::path::Path::new(m["Source"].as_str().unwrap_or(""));
    let real_dir = std::fs::symlink_metadata(source).is_ok_and(|f| f.is_dir());
    let ok = in_guard && real_dir && m["Destination"] == "/run/fleet/busy";
    assert!(ok, "{what}: the engine created a container with the mount {m}");
}
