//! What the Docker API guard admits (docs/behaviour.md#packaging-and-the-docker-guard [ext]), as pure functions of one request: the
//! routes fleet-node uses and nothing else, and every container- and volume-create body held
//! to this node's node.yaml. A path-only proxy would still let a compromised node create a
//! privileged container with `/` bound; here the body is the policy. Each refusal names the
//! rule it broke.

use crate::config::NodeConfig;
use crate::runtime::{LABEL_MANAGED, LABEL_NODE};
use fleet_api::images::AllowList;
use serde_json::{Map, Value};
use std::path::{Component, Path, PathBuf};

/// A refused request: the rule, as the 403 body's `message` says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub String);

fn refuse<T>(rule: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal(rule.into()))
}

/// What an admitted request is, for the proxy to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `/_ping`, `/version`, listing containers or volumes: forwarded as is.
    Plain,
    /// `POST /containers/create`: the body is checked first.
    CreateContainer,
    /// `POST /volumes/create`: the body is checked first.
    CreateVolume,
    /// Start, stop, inspect or remove one container: only one of this node's.
    Container(String),
}

/// The routes fleet-node uses, with or without a `/v1.NN` version prefix.
pub fn route(method: &str, path: &str) -> Result<Route, Refusal> {
    let path = strip_version(path);
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let route = match (method, parts.as_slice()) {
        ("GET" | "HEAD", ["_ping"]) | ("GET", ["version"]) => Route::Plain,
        ("GET", ["containers", "json"]) | ("GET", ["volumes"]) => Route::Plain,
        ("POST", ["containers", "create"]) => Route::CreateContainer,
        ("POST", ["volumes", "create"]) => Route::CreateVolume,
        ("GET", ["containers", id, "json"])
        | ("POST", ["containers", id, "start" | "stop"])
        | ("DELETE", ["containers", id])
            if is_container_ref(id) =>
        {
            Route::Container(id.to_string())
        }
        _ => return refuse(format!("{method} {path} is not an endpoint fleet-node uses")),
    };
    Ok(route)
}

/// A container id or name as the node uses them: no encoded separators reach the engine.
fn is_container_ref(id: &str) -> bool {
    !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

fn strip_version(path: &str) -> &str {
    let Some(rest) = path.strip_prefix("/v") else { return path };
    match rest.find('/') {
        Some(i) if rest[..i].chars().all(|c| c.is_ascii_digit() || c == '.') => &rest[i..],
        _ => path,
    }
}

/// The node's side of the policy, from its node.yaml.
#[derive(Debug, Clone)]
pub struct Policy {
    pub node: String,
    pub prefix: String,
    /// Agent PAT directories live under here (`hostStateDir/agents`).
    pub pat_root: PathBuf,
    pub secrets_dir: PathBuf,
    pub network: Option<String>,
    /// Capabilities some kind grants (`executors.<kind>.capAdd`).
    caps: std::collections::BTreeSet<String>,
    /// Default images of the kinds, and their allow-lists.
    images: Vec<String>,
    allow: Vec<AllowList>,
}

impl Policy {
    pub fn from_config(cfg: &NodeConfig) -> Policy {
        Policy {
            node: cfg.name.clone(),
            prefix: cfg.container_prefix.clone(),
            pat_root: cfg.host_state_dir().join("agents"),
            secrets_dir: cfg.host_secrets_dir().to_path_buf(),
            network: cfg.network.clone(),
            caps: cfg.executors.values().flat_map(|e| e.cap_add.iter().cloned()).collect(),
            images: cfg.executors.values().map(|e| e.image.clone()).collect(),
            allow: cfg.executors.values().filter_map(|e| AllowList::parse(&e.images).ok()).collect(),
        }
    }

    /// Whether a container's labels say it is one of this node's.
    pub fn owns(&self, labels: &Map<String, Value>) -> bool {
        labels.get(LABEL_MANAGED).and_then(Value::as_str) == Some("1")
            && labels.get(LABEL_NODE).and_then(Value::as_str) == Some(self.node.as_str())
    }

    /// A container-create body (`ContainerCreateBody` as JSON).
    pub fn check_container(&self, body: &Value) -> Result<(), Refusal> {
        let Some(body) = body.as_object() else { return refuse("the create body is not a JSON object") };
        only_keys(body, "", &["Image", "Env", "Labels", "HostConfig", "User", "Cmd", "WorkingDir", "StopTimeout"])?;
        let labels = body.get("Labels").and_then(Value::as_object).cloned().unwrap_or_default();
        if !self.owns(&labels) {
            return refuse(format!("Labels must carry {LABEL_MANAGED}=1 and {LABEL_NODE}={}", self.node));
        }
        let image = body.get("Image").and_then(Value::as_str).unwrap_or("");
        if !self.images.iter().any(|i| i == image) && !self.allow.iter().any(|l| l.admits(image)) {
            return refuse(format!("Image {image:?} is neither a kind's image nor admitted by an images list"));
        }
        match body.get("HostConfig") {
            None | Some(Value::Null) => Ok(()),
            Some(Value::Object(host)) => self.check_host(host),
            Some(_) => refuse("HostConfig is not an object"),
        }
    }

    fn check_host(&self, host: &Map<String, Value>) -> Result<(), Refusal> {
        only_keys(
            host,
            "HostConfig.",
            &[
                "Init",
                "RestartPolicy",
                "Mounts",
                "Binds",
                "NanoCpus",
                "Memory",
                "MemorySwap",
                "NetworkMode",
                "CapDrop",
                "CapAdd",
                "SecurityOpt",
                "PidsLimit",
                "LogConfig",
                "Privileged",
                "PidMode",
                "IpcMode",
                "UTSMode",
                "UsernsMode",
            ],
        )?;
        if host.get("Privileged").and_then(Value::as_bool) == Some(true) {
            return refuse("HostConfig.Privileged is not allowed");
        }
        for key in ["PidMode", "IpcMode", "UTSMode", "UsernsMode"] {
            if let Some(mode) = host.get(key).and_then(Value::as_str).filter(|m| !m.is_empty() && *m != "private") {
                return refuse(format!("HostConfig.{key} {mode:?} is not allowed: no host or shared namespaces"));
            }
        }
        if let Some(mode) = host.get("NetworkMode").and_then(Value::as_str) {
            let own = self.network.as_deref() == Some(mode);
            if !own && !matches!(mode, "" | "default" | "bridge" | "none") {
                return refuse(format!("HostConfig.NetworkMode {mode:?} is not allowed: only node.yaml's network"));
            }
        }
        for cap in strings(host.get("CapAdd")) {
            if !self.caps.contains(cap) {
                return refuse(format!(
                    "HostConfig.CapAdd {cap:?} is not allowed: node.yaml's capAdd does not grant it"
                ));
            }
        }
        if let Some(t) = host.get("LogConfig").and_then(|l| l.get("Type")).and_then(Value::as_str) {
            if !matches!(t, "" | "json-file" | "local") {
                return refuse(format!("HostConfig.LogConfig.Type {t:?} is not allowed: only json-file or local"));
            }
        }
        for opt in strings(host.get("SecurityOpt")) {
            if !opt.starts_with("no-new-privileges") {
                return refuse(format!("HostConfig.SecurityOpt {opt:?} is not allowed"));
            }
        }
        for bind in strings(host.get("Binds")) {
            self.check_bind_source(bind.split(':').next().unwrap_or(""))?;
        }
        for mount in host.get("Mounts").and_then(Value::as_array).into_iter().flatten() {
            self.check_mount(mount)?;
        }
        Ok(())
    }

    fn check_mount(&self, m: &Value) -> Result<(), Refusal> {
        let source = m.get("Source").and_then(Value::as_str).unwrap_or("");
        match m.get("Type").and_then(Value::as_str).unwrap_or("volume") {
            "bind" => self.check_bind_source(source),
            "volume" => self.check_volume_name(source),
            "tmpfs" => Ok(()),
            other => refuse(format!("mount type {other:?} is not allowed")),
        }
    }

    /// Binds come only from agent PAT directories and from files directly in `secretsDir`.
    fn check_bind_source(&self, source: &str) -> Result<(), Refusal> {
        let path = Path::new(source);
        let clean =
            path.is_absolute() && path.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        let under_pats = path.starts_with(&self.pat_root) && path != self.pat_root;
        let a_secret = path.parent() == Some(self.secrets_dir.as_path());
        if clean && (under_pats || a_secret) {
            return Ok(());
        }
        refuse(format!(
            "bind source {source:?} is not allowed: only {}/… and files in {}",
            self.pat_root.display(),
            self.secrets_dir.display()
        ))
    }

    fn check_volume_name(&self, name: &str) -> Result<(), Refusal> {
        if name.starts_with(&format!("{}-", self.prefix)) {
            return Ok(());
        }
        refuse(format!("volume {name:?} is not allowed: only volumes named {}-…", self.prefix))
    }

    /// A volume-create body (`VolumeCreateRequest` as JSON).
    pub fn check_volume(&self, body: &Value) -> Result<(), Refusal> {
        let Some(body) = body.as_object() else { return refuse("the volume body is not a JSON object") };
        only_keys(body, "", &["Name", "Labels"])?;
        self.check_volume_name(body.get("Name").and_then(Value::as_str).unwrap_or(""))?;
        let labels = body.get("Labels").and_then(Value::as_object).cloned().unwrap_or_default();
        if !self.owns(&labels) {
            return refuse(format!("volume Labels must carry {LABEL_MANAGED}=1 and {LABEL_NODE}={}", self.node));
        }
        Ok(())
    }
}

/// Refuses any key outside `allowed` whose value is not empty (null, false, 0, "", [], {}):
/// an allow-list, so an option Docker adds later is refused until it is looked at.
fn only_keys(obj: &Map<String, Value>, at: &str, allowed: &[&str]) -> Result<(), Refusal> {
    for (k, v) in obj {
        if !allowed.contains(&k.as_str()) && !is_empty(v) {
            return refuse(format!("{at}{k} is not allowed"));
        }
    }
    Ok(())
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

fn strings(v: Option<&Value>) -> impl Iterator<Item = &str> {
    v.and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str)
}

#[cfg(test)]
mod tests;
