//! The rule each node.yaml value must keep beyond its type (docs/reference.md#node-configuration-nodeyaml):
//! every broken rule is one problem naming its field, and all are listed at once.

use super::problem::Problem;
use super::types::{CapacityConfig, Executor, NodeConfig};
use fleet_api::{images::AllowList, names, validate, Capacity};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Names Fleet sets itself in every agent container; node.yaml may not set them.
pub const FLEET_ENV: [&str; 5] =
    ["CONTROL_PLANE_AGENT_KEY", "IAM_PRINCIPAL", "CONTROL_PLANE_IAM_TENANT", "FLEET_REPLICA", crate::lease::ENV];

impl NodeConfig {
    /// Every broken rule, each naming its field (the lines are the reader's to add).
    pub fn problems(&self) -> Vec<Problem> {
        let mut p = Vec::new();
        controller_problems(self, &mut p);
        if !names::is_node_name(&self.name) {
            p.push(Problem::of(
                "name",
                format!("{:?} must match ^[a-z0-9][a-z0-9.-]*$ and be at most 100 characters", self.name),
            ));
        }
        for (i, l) in self.labels.iter().enumerate() {
            if !names::is_label(l) {
                let rule = "is not name or name=value (^[a-z0-9][a-z0-9.-]*(=[a-zA-Z0-9._-]+)?$)";
                p.push(Problem::of(format!("labels[{i}]"), format!("{l:?} {rule}")));
            }
        }
        capacity_problems(&self.capacity, &mut p);
        if self.executors.is_empty() {
            p.push(Problem::of("executors", "at least one executor kind is required"));
        }
        for (kind, e) in &self.executors {
            executor_problems(&format!("executors.{kind}"), kind, e, &mut p);
        }
        env_problems("agentEnv", &self.agent_env, &mut p);
        host_problems(self, &mut p);
        window_problems(&self.maintenance_windows, &mut p);
        p
    }
}

fn controller_problems(c: &NodeConfig, p: &mut Vec<Problem>) {
    let url = &c.controller_url;
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        p.push(Problem::of("controllerUrl", format!("{url:?} must be an http:// or https:// URL")));
    } else if !c.insecure && fleet_api::urls::is_insecure(url) {
        let rule =
            "plain http:// is allowed only for loopback hosts; use https:// (caFile adds a CA) or set insecure: true";
        p.push(Problem::of("controllerUrl", format!("{url:?}: {rule}")));
    }
}

/// Each bad capacity field: the shared rule stops at the first, so it is given one field at a time.
fn capacity_problems(c: &CapacityConfig, p: &mut Vec<Problem>) {
    let one_at_a_time = [
        Capacity { slots: c.slots, cpus: None, memory_mb: None },
        Capacity { slots: 0, cpus: c.cpus, memory_mb: None },
        Capacity { slots: 0, cpus: None, memory_mb: c.memory_mb },
    ];
    for one in one_at_a_time {
        if let Err(e) = validate::capacity(&one, "capacity") {
            p.push(Problem::of(e.field, e.message));
        }
    }
}

fn executor_problems(f: &str, kind: &str, e: &Executor, p: &mut Vec<Problem>) {
    if !names::is_executor_kind(kind) {
        p.push(Problem::of(f, format!("{kind:?} is not an executor kind (^[a-z0-9][a-z0-9._-]{{0,62}}$)")));
    }
    if !fleet_api::images::is_reference(&e.image) {
        p.push(Problem::of(format!("{f}.image"), format!("{:?} is not an image reference", e.image)));
    }
    if e.images.len() > fleet_api::images::MAX_ENTRIES {
        p.push(Problem::of(format!("{f}.images"), format!("at most {} entries", fleet_api::images::MAX_ENTRIES)));
    }
    if let Err(errs) = AllowList::parse(&e.images) {
        for err in errs {
            p.push(Problem::of(format!("{f}.images"), err.to_string()));
        }
    }
    secret_problems(f, e, p);
    env_problems(&format!("{f}.env"), &e.env, p);
    hardening_problems(f, e, p);
    if let Some(d) = &e.data_path {
        if !d.starts_with('/') {
            p.push(Problem::of(format!("{f}.dataPath"), format!("{d:?} must be an absolute path")));
        }
    }
}

/// A kind's secret list: names as `secretsDir` announces them (docs/behaviour.md#secrets).
fn secret_problems(f: &str, e: &Executor, p: &mut Vec<Problem>) {
    let Some(list) = &e.secrets else { return };
    if list.len() > validate::MAX_SECRETS {
        p.push(Problem::of(format!("{f}.secrets"), format!("at most {} entries", validate::MAX_SECRETS)));
    }
    for (i, s) in list.iter().enumerate() {
        if !names::is_secret_name(s) {
            let rule = "is not a secret name (^[a-z0-9][a-z0-9-]{0,62}$, not agent-pat)";
            p.push(Problem::of(format!("{f}.secrets[{i}]"), format!("{s:?} {rule}")));
        }
    }
}

fn env_name_ok(k: &str) -> bool {
    !k.is_empty() && !k.as_bytes()[0].is_ascii_digit() && k.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// Problems of one environment map: names that are not variable names, or that Fleet sets.
fn env_problems(field: &str, env: &BTreeMap<String, String>, p: &mut Vec<Problem>) {
    for k in env.keys() {
        if !env_name_ok(k) {
            p.push(Problem::of(field, format!("{k:?} is not an environment variable name")));
        }
        if FLEET_ENV.contains(&k.as_str()) {
            p.push(Problem::of(field, format!("{k} is set by Fleet itself")));
        }
    }
}

/// Problems of a kind's container limits (docs/behaviour.md#hardening), each naming its field.
fn hardening_problems(f: &str, e: &Executor, p: &mut Vec<Problem>) {
    for (i, cap) in e.cap_add.iter().enumerate() {
        let ok = !cap.is_empty()
            && cap.len() <= 32
            && cap != "ALL"
            && cap.bytes().all(|c| c.is_ascii_uppercase() || c == b'_');
        if !ok {
            p.push(Problem::of(
                format!("{f}.capAdd[{i}]"),
                format!("{cap:?} is not a capability name like NET_BIND_SERVICE"),
            ));
        }
    }
    if let Some(n) = e.pids_limit {
        if !(16..=1_000_000).contains(&n) {
            p.push(Problem::of(format!("{f}.pidsLimit"), format!("must be 16–1000000, got {n}")));
        }
    }
    if let Some(u) = &e.user {
        let ok = !u.is_empty() && u.len() <= 64 && u.bytes().all(|c| c.is_ascii_alphanumeric() || b"_.:-".contains(&c));
        if !ok {
            p.push(Problem::of(format!("{f}.user"), format!("{u:?} is not uid[:gid] or a user name")));
        }
    }
    for (which, r) in [("defaultResources", &e.default_resources), ("maxResources", &e.max_resources)] {
        let Some(r) = r else { continue };
        if r.cpus.is_some_and(|c| !(c.is_finite() && c > 0.0)) {
            p.push(Problem::of(format!("{f}.{which}.cpus"), "must be a positive number"));
        }
        if r.memory_mb.is_some_and(|m| m < 6) {
            p.push(Problem::of(format!("{f}.{which}.memoryMb"), "must be at least 6 (Docker's minimum)"));
        }
    }
    if let (Some(d), Some(m)) = (&e.default_resources, &e.max_resources) {
        let over = |a: Option<f64>, b: Option<f64>| matches!((a, b), (Some(a), Some(b)) if a > b);
        if over(d.cpus, m.cpus) || over(d.memory_mb.map(|v| v as f64), m.memory_mb.map(|v| v as f64)) {
            p.push(Problem::of(format!("{f}.defaultResources"), "must not exceed maxResources"));
        }
    }
}

/// The directories, the engine, the period, the names on the engine.
fn host_problems(c: &NodeConfig, p: &mut Vec<Problem>) {
    let dirs: [(&str, Option<&PathBuf>); 4] = [
        ("stateDir", Some(&c.state_dir)),
        ("secretsDir", Some(&c.secrets_dir)),
        ("hostStateDir", c.host_state_dir.as_ref()),
        ("hostSecretsDir", c.host_secrets_dir.as_ref()),
    ];
    for (field, dir) in dirs {
        if dir.is_some_and(|d| d.as_os_str().is_empty()) {
            p.push(Problem::of(field, "must not be empty"));
        }
    }
    if !c.guard_dir.is_absolute() {
        p.push(Problem::of("guardDir", format!("{:?} must be an absolute path on the host", c.guard_dir)));
    }
    if !(c.docker_url.starts_with("unix://") || c.docker_url.starts_with("tcp://")) {
        p.push(Problem::of("dockerUrl", format!("{:?} must start with unix:// or tcp://", c.docker_url)));
    }
    if !(5..=300).contains(&c.observe_seconds) {
        p.push(Problem::of("observeSeconds", format!("must be 5–300, got {}", c.observe_seconds)));
    }
    let prefix = &c.container_prefix;
    let prefix_ok = !prefix.is_empty()
        && prefix.len() <= 32
        && prefix.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && prefix.as_bytes()[0].is_ascii_lowercase();
    if !prefix_ok {
        let rule = "must be lowercase letters, digits and -, starting with a letter";
        p.push(Problem::of("containerPrefix", format!("{prefix:?} {rule}")));
    }
    if let Some(n) = &c.network {
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b)) {
            p.push(Problem::of("network", format!("{n:?} is not a Docker network name")));
        }
    }
}

/// Each window read as the controller reads it (fleet_api::windows), its problem naming the
/// window by its index; more than the controller takes is one problem of the list.
fn window_problems(list: &[fleet_api::windows::MaintenanceWindow], p: &mut Vec<Problem>) {
    use fleet_api::windows::{Window, MAX_WINDOWS};
    if list.len() > MAX_WINDOWS {
        p.push(Problem::of("maintenanceWindows", format!("at most {MAX_WINDOWS} windows, got {}", list.len())));
    }
    for (i, w) in list.iter().enumerate() {
        if let Err(e) = Window::parse(w) {
            // The message opens with the window's field it is about: the problem is that
            // field's, so it carries its line and a field already reported missing is not
            // reported again.
            let about = ["schedule", "durationMinutes", "timeZone"].into_iter().find(|f| e.starts_with(f));
            let field = match about {
                Some(f) => format!("maintenanceWindows[{i}].{f}"),
                None => format!("maintenanceWindows[{i}]"),
            };
            p.push(Problem::of(field, e));
        }
    }
}
