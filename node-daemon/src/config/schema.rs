//! node.yaml's fields (docs/reference.md#node-configuration-nodeyaml): which fields each mapping
//! has, the type and default of each, read from the file's tree into [`NodeConfig`]. A field
//! read here is a field the file may have; any other is an unknown field.

use super::read::{At, Reader};
use super::types::{CapacityConfig, Executor, NodeConfig, ResourceLimits};
use super::yaml::Node;
use fleet_api::windows::MaintenanceWindow;
use std::path::PathBuf;

const DEFAULT_DOCKER_URL: &str = "unix:///var/run/docker.sock";
const DEFAULT_OBSERVE_SECONDS: u32 = 20;
const DEFAULT_CONTAINER_PREFIX: &str = "fleet";
/// The Docker guard's own directory (docs/behaviour.md#the-guards-own-files).
pub const DEFAULT_GUARD_DIR: &str = "/var/lib/fleet-guard";

/// The whole file; None (recorded) when it is not a mapping of fields at all.
pub fn node_config(r: &mut Reader, root: &Node) -> Option<NodeConfig> {
    let mut f = r.fields(root, "", None)?;
    let config = NodeConfig {
        controller_url: r.required(&mut f, "controllerUrl", Reader::string),
        name: r.required(&mut f, "name", Reader::string),
        labels: r.optional(&mut f, "labels", strings).unwrap_or_default(),
        capacity: r.required(&mut f, "capacity", capacity),
        executors: r.required(&mut f, "executors", |r, n, at| r.map(n, at, executor)),
        state_dir: r.required(&mut f, "stateDir", path),
        host_state_dir: r.optional(&mut f, "hostStateDir", path),
        secrets_dir: r.required(&mut f, "secretsDir", path),
        host_secrets_dir: r.optional(&mut f, "hostSecretsDir", path),
        guard_dir: r.optional(&mut f, "guardDir", path).unwrap_or_else(|| DEFAULT_GUARD_DIR.into()),
        docker_url: r.optional(&mut f, "dockerUrl", Reader::string).unwrap_or_else(|| DEFAULT_DOCKER_URL.into()),
        network: r.optional(&mut f, "network", Reader::string),
        agent_env: r.optional(&mut f, "agentEnv", env).unwrap_or_default(),
        join_key_file: r.optional(&mut f, "joinKeyFile", path),
        observe_seconds: r.optional(&mut f, "observeSeconds", Reader::whole).unwrap_or(DEFAULT_OBSERVE_SECONDS),
        container_prefix: r
            .optional(&mut f, "containerPrefix", Reader::string)
            .unwrap_or_else(|| DEFAULT_CONTAINER_PREFIX.into()),
        ca_file: r.optional(&mut f, "caFile", path),
        insecure: r.optional(&mut f, "insecure", Reader::boolean).unwrap_or(false),
        check_before_stop: r.optional(&mut f, "checkBeforeStop", Reader::boolean).unwrap_or(false),
        maintenance_windows: r.optional(&mut f, "maintenanceWindows", windows).unwrap_or_default(),
    };
    r.finish(f);
    Some(config)
}

fn capacity(r: &mut Reader, node: &Node, at: At) -> Option<CapacityConfig> {
    let mut f = r.fields(node, at.path, Some(at.line))?;
    let capacity = CapacityConfig {
        slots: r.required(&mut f, "slots", Reader::whole),
        cpus: r.optional(&mut f, "cpus", Reader::number),
        memory_mb: r.optional(&mut f, "memoryMb", Reader::whole),
    };
    r.finish(f);
    Some(capacity)
}

fn executor(r: &mut Reader, node: &Node, at: At) -> Option<Executor> {
    let mut f = r.fields(node, at.path, Some(at.line))?;
    let executor = Executor {
        image: r.required(&mut f, "image", Reader::string),
        images: r.optional(&mut f, "images", strings).unwrap_or_default(),
        env: r.optional(&mut f, "env", env).unwrap_or_default(),
        data_path: r.optional(&mut f, "dataPath", Reader::string),
        cap_add: r.optional(&mut f, "capAdd", strings).unwrap_or_default(),
        pids_limit: r.optional(&mut f, "pidsLimit", Reader::whole),
        user: r.optional(&mut f, "user", Reader::string),
        default_resources: r.optional(&mut f, "defaultResources", resources),
        max_resources: r.optional(&mut f, "maxResources", resources),
        secrets: r.optional(&mut f, "secrets", strings),
    };
    r.finish(f);
    Some(executor)
}

fn resources(r: &mut Reader, node: &Node, at: At) -> Option<ResourceLimits> {
    let mut f = r.fields(node, at.path, Some(at.line))?;
    let limits = ResourceLimits {
        cpus: r.optional(&mut f, "cpus", Reader::number),
        memory_mb: r.optional(&mut f, "memoryMb", Reader::whole),
    };
    r.finish(f);
    Some(limits)
}

fn windows(r: &mut Reader, node: &Node, at: At) -> Option<Vec<MaintenanceWindow>> {
    r.list(node, at, window)
}

/// One window as written; its rules (cron, zone, duration) are checked with the rest.
fn window(r: &mut Reader, node: &Node, at: At) -> Option<MaintenanceWindow> {
    let mut f = r.fields(node, at.path, Some(at.line))?;
    let window = MaintenanceWindow {
        schedule: r.required(&mut f, "schedule", Reader::string),
        duration_minutes: r.required(&mut f, "durationMinutes", Reader::whole),
        time_zone: r.required(&mut f, "timeZone", Reader::string),
    };
    r.finish(f);
    Some(window)
}

fn strings(r: &mut Reader, node: &Node, at: At) -> Option<Vec<String>> {
    r.list(node, at, Reader::string)
}

fn env(r: &mut Reader, node: &Node, at: At) -> Option<std::collections::BTreeMap<String, String>> {
    r.map(node, at, Reader::string)
}

fn path(r: &mut Reader, node: &Node, at: At) -> Option<PathBuf> {
    r.string(node, at).map(PathBuf::from)
}
