//! node.yaml (docs/reference.md#node-configuration-nodeyaml): strict YAML (an unknown field is an error), `${NAME}` taken from the
//! environment on every line but comments, and validation that lists every problem at once.

use fleet_api::{images::AllowList, names, validate, Capacity};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Executor {
    pub image: String,
    #[serde(default)]
    pub images: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub data_path: Option<String>,
    /// [ext] Capabilities granted back after dropping all (docs/behaviour.md#hardening), e.g. `[NET_BIND_SERVICE]`.
    #[serde(default)]
    pub cap_add: Vec<String>,
    /// [ext] Most processes in one agent container (default 1024).
    #[serde(default)]
    pub pids_limit: Option<i64>,
    /// [ext] The user agent containers run as (`uid[:gid]` or a name the image knows).
    #[serde(default)]
    pub user: Option<String>,
    /// [ext] Resources of an agent that sets none.
    #[serde(default)]
    pub default_resources: Option<ResourceLimits>,
    /// [ext] Most resources an agent of this kind gets; more is clamped.
    #[serde(default)]
    pub max_resources: Option<ResourceLimits>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourceLimits {
    #[serde(default)]
    pub cpus: Option<f64>,
    #[serde(default)]
    pub memory_mb: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CapacityConfig {
    pub slots: u32,
    #[serde(default)]
    pub cpus: Option<f64>,
    #[serde(default)]
    pub memory_mb: Option<u64>,
}

fn default_docker() -> String {
    "unix:///var/run/docker.sock".into()
}
fn default_observe() -> u32 {
    20
}
fn default_prefix() -> String {
    "fleet".into()
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeConfig {
    pub controller_url: String,
    pub name: String,
    #[serde(default)]
    pub labels: Vec<String>,
    pub capacity: CapacityConfig,
    pub executors: BTreeMap<String, Executor>,
    pub state_dir: PathBuf,
    #[serde(default)]
    pub host_state_dir: Option<PathBuf>,
    pub secrets_dir: PathBuf,
    #[serde(default)]
    pub host_secrets_dir: Option<PathBuf>,
    #[serde(default = "default_docker")]
    pub docker_url: String,
    #[serde(default)]
    pub network: Option<String>,
    #[serde(default)]
    pub agent_env: BTreeMap<String, String>,
    #[serde(default)]
    pub join_key_file: Option<PathBuf>,
    #[serde(default = "default_observe")]
    pub observe_seconds: u32,
    #[serde(default = "default_prefix")]
    pub container_prefix: String,
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// [ext] Allows a plain `http://` controllerUrl to a host other than this machine.
    #[serde(default)]
    pub insecure: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("cannot read {path}: {error}")]
    Read { path: String, error: String },
    #[error("unset environment variables: {}", .0.join(", "))]
    Unset(Vec<String>),
    #[error("{path}: {error}")]
    Parse { path: String, error: String },
    #[error("{path}: invalid configuration:\n  - {}", .problems.join("\n  - "))]
    Invalid { path: String, problems: Vec<String> },
}

/// Replaces `${NAME}` from `env` on every line that is not a comment; lists every unset name.
pub fn substitute(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, ConfigError> {
    let mut out = String::with_capacity(text.len());
    let mut unset: Vec<String> = Vec::new();
    for line in text.split_inclusive('\n') {
        if line.trim_start().starts_with('#') {
            out.push_str(line);
            continue;
        }
        let mut rest = line;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            match after.find('}') {
                Some(end) => {
                    let name = &after[..end];
                    match env(name) {
                        Some(v) => out.push_str(&v),
                        None => {
                            if !unset.iter().any(|u| u == name) {
                                unset.push(name.to_string());
                            }
                        }
                    }
                    rest = &after[end + 1..];
                }
                None => {
                    out.push_str(&rest[start..]);
                    rest = "";
                }
            }
        }
        out.push_str(rest);
    }
    if unset.is_empty() {
        Ok(out)
    } else {
        Err(ConfigError::Unset(unset))
    }
}

fn env_name_ok(k: &str) -> bool {
    !k.is_empty() && !k.as_bytes()[0].is_ascii_digit() && k.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// Problems of one environment map: names that are not variable names, or that Fleet sets.
fn env_problems(field: &str, env: &BTreeMap<String, String>, p: &mut Vec<String>) {
    for k in env.keys() {
        if !env_name_ok(k) {
            p.push(format!("{field}: {k:?} is not an environment variable name"));
        }
        if FLEET_ENV.contains(&k.as_str()) {
            p.push(format!("{field}: {k} is set by Fleet itself"));
        }
    }
}

/// Names Fleet sets itself in every agent container; node.yaml may not set them.
pub const FLEET_ENV: [&str; 4] =
    ["CONTROL_PLANE_AGENT_KEY", "IAM_PRINCIPAL", "CONTROL_PLANE_IAM_TENANT", "FLEET_REPLICA"];

/// Problems of a kind's container limits (docs/behaviour.md#hardening), each naming its field.
fn hardening_problems(f: &str, e: &Executor, p: &mut Vec<String>) {
    for (i, cap) in e.cap_add.iter().enumerate() {
        let ok = !cap.is_empty()
            && cap.len() <= 32
            && cap != "ALL"
            && cap.bytes().all(|c| c.is_ascii_uppercase() || c == b'_');
        if !ok {
            p.push(format!("{f}.capAdd[{i}]: {cap:?} is not a capability name like NET_BIND_SERVICE"));
        }
    }
    if let Some(n) = e.pids_limit {
        if !(16..=1_000_000).contains(&n) {
            p.push(format!("{f}.pidsLimit: must be 16–1000000, got {n}"));
        }
    }
    if let Some(u) = &e.user {
        let ok = !u.is_empty() && u.len() <= 64 && u.bytes().all(|c| c.is_ascii_alphanumeric() || b"_.:-".contains(&c));
        if !ok {
            p.push(format!("{f}.user: {u:?} is not uid[:gid] or a user name"));
        }
    }
    for (which, r) in [("defaultResources", &e.default_resources), ("maxResources", &e.max_resources)] {
        let Some(r) = r else { continue };
        if r.cpus.is_some_and(|c| !(c.is_finite() && c > 0.0)) {
            p.push(format!("{f}.{which}.cpus: must be a positive number"));
        }
        if r.memory_mb.is_some_and(|m| m < 6) {
            p.push(format!("{f}.{which}.memoryMb: must be at least 6 (Docker's minimum)"));
        }
    }
    if let (Some(d), Some(m)) = (&e.default_resources, &e.max_resources) {
        let over = |a: Option<f64>, b: Option<f64>| matches!((a, b), (Some(a), Some(b)) if a > b);
        if over(d.cpus, m.cpus) || over(d.memory_mb.map(|v| v as f64), m.memory_mb.map(|v| v as f64)) {
            p.push(format!("{f}.defaultResources: must not exceed maxResources"));
        }
    }
}

impl NodeConfig {
    /// Reads, substitutes, parses and validates `path`.
    pub fn load(path: &Path) -> Result<NodeConfig, ConfigError> {
        let p = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|e| ConfigError::Read { path: p.clone(), error: e.to_string() })?;
        Self::parse(&text, &p, &|k| std::env::var(k).ok())
    }

    pub fn parse(text: &str, path: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<NodeConfig, ConfigError> {
        let text = substitute(text, env)?;
        let cfg: NodeConfig = serde_yaml::from_str(&text)
            .map_err(|e| ConfigError::Parse { path: path.to_string(), error: e.to_string() })?;
        let problems = cfg.problems();
        if problems.is_empty() {
            Ok(cfg)
        } else {
            Err(ConfigError::Invalid { path: path.to_string(), problems })
        }
    }

    /// Every problem, each naming its field.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if !(self.controller_url.starts_with("http://") || self.controller_url.starts_with("https://")) {
            p.push(format!("controllerUrl: {:?} must be an http:// or https:// URL", self.controller_url));
        } else if !self.insecure && fleet_api::urls::is_insecure(&self.controller_url) {
            p.push(format!(
                "controllerUrl: {:?}: plain http:// is allowed only for loopback hosts; use https:// (caFile adds a CA) \
                 or set insecure: true",
                self.controller_url
            ));
        }
        if !names::is_node_name(&self.name) {
            p.push(format!("name: {:?} must match ^[a-z0-9][a-z0-9.-]*$ and be at most 100 characters", self.name));
        }
        for (i, l) in self.labels.iter().enumerate() {
            if !names::is_label(l) {
                p.push(format!(
                    "labels[{i}]: {l:?} is not name or name=value (^[a-z0-9][a-z0-9.-]*(=[a-zA-Z0-9._-]+)?$)"
                ));
            }
        }
        if let Err(e) = validate::capacity(&self.capacity(), "capacity") {
            p.push(format!("{}: {}", e.field, e.message));
        }
        if self.executors.is_empty() {
            p.push("executors: at least one executor kind is required".into());
        }
        for (kind, e) in &self.executors {
            let f = format!("executors.{kind}");
            if !names::is_executor_kind(kind) {
                p.push(format!("{f}: {kind:?} is not an executor kind (^[a-z0-9][a-z0-9._-]{{0,62}}$)"));
            }
            if !fleet_api::images::is_reference(&e.image) {
                p.push(format!("{f}.image: {:?} is not an image reference", e.image));
            }
            if e.images.len() > fleet_api::images::MAX_ENTRIES {
                p.push(format!("{f}.images: at most {} entries", fleet_api::images::MAX_ENTRIES));
            }
            if let Err(errs) = AllowList::parse(&e.images) {
                for err in errs {
                    p.push(format!("{f}.images: {err}"));
                }
            }
            env_problems(&format!("{f}.env"), &e.env, &mut p);
            hardening_problems(&f, e, &mut p);
            if let Some(d) = &e.data_path {
                if !d.starts_with('/') {
                    p.push(format!("{f}.dataPath: {d:?} must be an absolute path"));
                }
            }
        }
        env_problems("agentEnv", &self.agent_env, &mut p);
        for (field, dir) in [
            ("stateDir", Some(&self.state_dir)),
            ("secretsDir", Some(&self.secrets_dir)),
            ("hostStateDir", self.host_state_dir.as_ref()),
            ("hostSecretsDir", self.host_secrets_dir.as_ref()),
        ] {
            if let Some(d) = dir {
                if d.as_os_str().is_empty() {
                    p.push(format!("{field}: must not be empty"));
                }
            }
        }
        if !(self.docker_url.starts_with("unix://") || self.docker_url.starts_with("tcp://")) {
            p.push(format!("dockerUrl: {:?} must start with unix:// or tcp://", self.docker_url));
        }
        if !(5..=300).contains(&self.observe_seconds) {
            p.push(format!("observeSeconds: must be 5–300, got {}", self.observe_seconds));
        }
        let prefix_ok = !self.container_prefix.is_empty()
            && self.container_prefix.len() <= 32
            && self.container_prefix.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
            && self.container_prefix.as_bytes()[0].is_ascii_lowercase();
        if !prefix_ok {
            p.push(format!(
                "containerPrefix: {:?} must be lowercase letters, digits and -, starting with a letter",
                self.container_prefix
            ));
        }
        if let Some(n) = &self.network {
            if n.is_empty() || !n.bytes().all(|c| c.is_ascii_alphanumeric() || b"_.-".contains(&c)) {
                p.push(format!("network: {n:?} is not a Docker network name"));
            }
        }
        p
    }

    pub fn capacity(&self) -> Capacity {
        Capacity { slots: self.capacity.slots, cpus: self.capacity.cpus, memory_mb: self.capacity.memory_mb }
    }

    pub fn host_state_dir(&self) -> &Path {
        self.host_state_dir.as_deref().unwrap_or(&self.state_dir)
    }

    pub fn host_secrets_dir(&self) -> &Path {
        self.host_secrets_dir.as_deref().unwrap_or(&self.secrets_dir)
    }

    /// Kinds announced, sorted.
    pub fn kinds(&self) -> Vec<String> {
        self.executors.keys().cloned().collect()
    }

    /// Allow-lists announced: kinds with an empty list omitted, entries sorted.
    pub fn images(&self) -> BTreeMap<String, Vec<String>> {
        self.executors
            .iter()
            .filter(|(_, e)| !e.images.is_empty())
            .map(|(k, e)| {
                let mut v = e.images.clone();
                v.sort();
                v.dedup();
                (k.clone(), v)
            })
            .collect()
    }

    pub fn sorted_labels(&self) -> Vec<String> {
        let mut v = self.labels.clone();
        v.sort();
        v.dedup();
        v
    }
}

#[cfg(test)]
mod tests;
