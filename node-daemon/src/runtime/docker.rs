//! The bollard implementation. The API version is negotiated with the engine (through
//! `/version`) on first contact, so an older engine works.

use super::contract::{Bind, ContainerSpec, RtError, RunInfo, Runtime, Seen, LABEL_MANAGED, LABEL_NODE};
use bollard::models::{
    ContainerCreateBody, HostConfig, HostConfigLogConfig, Mount, MountType, RestartPolicy, RestartPolicyNameEnum,
    VolumeCreateRequest,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
    StopContainerOptionsBuilder,
};
use bollard::{Docker, API_DEFAULT_VERSION};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Calls other than stop must answer within this.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone)]
pub struct DockerRuntime {
    docker: Arc<Mutex<Docker>>,
    negotiated: Arc<std::sync::atomic::AtomicBool>,
    node: String,
}

fn map(e: bollard::errors::Error) -> RtError {
    use bollard::errors::Error as E;
    match e {
        E::DockerResponseServerError { status_code: 404, .. } => RtError::NotFound,
        E::DockerResponseServerError { status_code, message } => {
            RtError::Failed(format!("Docker answered {status_code}: {message}"))
        }
        E::HyperResponseError { .. } | E::IOError { .. } | E::SocketNotFoundError(_) | E::RequestTimeoutError => {
            RtError::Unreachable(e.to_string())
        }
        other => RtError::Failed(other.to_string()),
    }
}

/// Creating and starting a container: a 404 is a missing image or network, not a missing
/// container, and Docker's own message says which (`No such image: agent-runner:1.4.0`,
/// `network fleet-agents not found`), so it is passed on whole (docs/behaviour.md#container-rules).
fn map_start(e: bollard::errors::Error) -> RtError {
    match e {
        bollard::errors::Error::DockerResponseServerError { message, .. } => RtError::Failed(message),
        other => map(other),
    }
}

async fn timed<T>(f: impl std::future::Future<Output = Result<T, bollard::errors::Error>>) -> Result<T, RtError> {
    timed_as(f, map).await
}

async fn timed_as<T>(
    f: impl std::future::Future<Output = Result<T, bollard::errors::Error>>,
    map: fn(bollard::errors::Error) -> RtError,
) -> Result<T, RtError> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(r) => r.map_err(map),
        Err(_) => Err(RtError::Unreachable("Docker did not answer in time".into())),
    }
}

impl DockerRuntime {
    /// `url` is `unix://PATH` or `tcp://HOST:PORT`. Connecting does not contact the engine.
    pub fn connect(url: &str, node: &str) -> Result<DockerRuntime, RtError> {
        // Stops may take as long as an agent's drain: the client's own limit is generous and
        // every other call has its own shorter one.
        let client_timeout = 3700;
        let docker = if let Some(path) = url.strip_prefix("unix://") {
            Docker::connect_with_unix(path, client_timeout, API_DEFAULT_VERSION)
        } else if url.starts_with("tcp://") {
            Docker::connect_with_http(url, client_timeout, API_DEFAULT_VERSION)
        } else {
            return Err(RtError::Failed(format!("dockerUrl {url:?} must be unix:// or tcp://")));
        };
        // A missing socket is not fatal at start: the node reports degraded and keeps trying.
        let docker = match docker {
            Ok(d) => d,
            Err(bollard::errors::Error::SocketNotFoundError(_)) => {
                Docker::connect_with_unix(url.trim_start_matches("unix://"), client_timeout, API_DEFAULT_VERSION)
                    .or_else(|_| Docker::connect_with_http("tcp://127.0.0.1:1", client_timeout, API_DEFAULT_VERSION))
                    .map_err(map)?
            }
            Err(e) => return Err(map(e)),
        };
        Ok(DockerRuntime {
            docker: Arc::new(Mutex::new(docker)),
            negotiated: Default::default(),
            node: node.to_string(),
        })
    }

    fn client(&self) -> Docker {
        self.docker.lock().clone()
    }

    async fn negotiate(&self) -> Result<(), RtError> {
        if self.negotiated.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(());
        }
        let d = timed(self.client().negotiate_version()).await?;
        *self.docker.lock() = d;
        self.negotiated.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

impl Runtime for DockerRuntime {
    async fn ping(&self) -> Result<(), RtError> {
        self.negotiate().await?;
        timed(self.client().ping()).await.map(|_| ())
    }

    async fn list(&self) -> Result<Vec<Seen>, RtError> {
        self.negotiate().await?;
        let mut filters: HashMap<&str, Vec<String>> = HashMap::new();
        filters.insert("label", vec![format!("{LABEL_MANAGED}=1"), format!("{LABEL_NODE}={}", self.node)]);
        let opts = ListContainersOptionsBuilder::new().all(true).filters(&filters).build();
        let list = timed(self.client().list_containers(Some(opts))).await?;
        Ok(list
            .into_iter()
            .filter_map(|c| {
                let name = c.names?.first()?.trim_start_matches('/').to_string();
                let labels = c.labels.unwrap_or_default().into_iter().collect();
                let running = matches!(c.state, Some(bollard::models::ContainerSummaryStateEnum::RUNNING));
                let lease_source = c.mounts.into_iter().flatten().find_map(|m| {
                    (m.destination.as_deref() == Some(crate::lease::TARGET)).then_some(m.source).flatten()
                });
                Some(Seen { id: c.id?, name, labels, running, lease_source })
            })
            .collect())
    }

    async fn inspect(&self, id: &str) -> Result<RunInfo, RtError> {
        let i = timed(self.client().inspect_container(id, None)).await?;
        let st = i.state.unwrap_or_default();
        Ok(RunInfo { running: st.running.unwrap_or(false), exit_code: st.exit_code })
    }

    async fn create(&self, spec: &ContainerSpec) -> Result<String, RtError> {
        self.negotiate().await?;
        if let Some((vol, _)) = &spec.volume {
            timed_as(self.client().create_volume(volume_body(vol, &self.node)), map_start).await?;
        }
        let opts = CreateContainerOptionsBuilder::new().name(&spec.name).build();
        Ok(timed_as(self.client().create_container(Some(opts), container_body(spec)), map_start).await?.id)
    }

    async fn start(&self, id: &str) -> Result<(), RtError> {
        timed_as(self.client().start_container(id, None), map_start).await
    }

    async fn stop(&self, id: &str, timeout: Duration) -> Result<(), RtError> {
        let opts = StopContainerOptionsBuilder::new().t(timeout.as_secs().min(3600) as i32).build();
        match self.client().stop_container(id, Some(opts)).await.map_err(map) {
            Ok(()) | Err(RtError::NotFound) => Ok(()),
            // 304: already stopped
            Err(RtError::Failed(m)) if m.contains("304") => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn image_present(&self, image: &str) -> Result<(), RtError> {
        self.negotiate().await?;
        // A 404 is the image missing: the supervisor says so as `create` would
        // (`No such image: …`), where inspect's own text varies between engine versions.
        timed(self.client().inspect_image(image)).await.map(|_| ())
    }

    async fn remove(&self, id: &str) -> Result<(), RtError> {
        // Data volumes are never removed: `v` stays false.
        let opts = RemoveContainerOptionsBuilder::new().force(true).v(false).build();
        match timed(self.client().remove_container(id, Some(opts))).await {
            Ok(()) | Err(RtError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// The volume-create body of a replica's data volume, with this node's labels.
pub fn volume_body(name: &str, node: &str) -> VolumeCreateRequest {
    let labels = [(LABEL_MANAGED.to_string(), "1".to_string()), (LABEL_NODE.to_string(), node.to_string())];
    VolumeCreateRequest {
        name: Some(name.to_string()),
        labels: Some(labels.into_iter().collect()),
        ..Default::default()
    }
}

/// The container-create body of a replica (docs/behaviour.md#the-agent-container): what the
/// Docker guard's allow-lists are made of.
pub fn container_body(spec: &ContainerSpec) -> ContainerCreateBody {
    let mut mounts: Vec<Mount> = spec
        .binds
        .iter()
        .map(|Bind { source, target }| Mount {
            target: Some(target.clone()),
            source: Some(source.clone()),
            typ: Some(MountType::BIND),
            read_only: Some(true),
            ..Default::default()
        })
        .collect();
    if let Some((vol, target)) = &spec.volume {
        mounts.push(Mount {
            target: Some(target.clone()),
            source: Some(vol.clone()),
            typ: Some(MountType::VOLUME),
            read_only: Some(false),
            ..Default::default()
        });
    }
    let mut env = spec.env.clone();
    if let Some(dir) = &spec.lease_dir {
        // The one writable bind: the replica's own lease directory (crate::lease).
        mounts.push(Mount {
            target: Some(crate::lease::TARGET.into()),
            source: Some(dir.clone()),
            typ: Some(MountType::BIND),
            read_only: Some(false),
            ..Default::default()
        });
        env.push(crate::lease::env_entry());
    }
    let h = &spec.hardening;
    let host = HostConfig {
        init: Some(true),
        restart_policy: Some(RestartPolicy { name: Some(RestartPolicyNameEnum::NO), maximum_retry_count: None }),
        mounts: Some(mounts),
        nano_cpus: spec.nano_cpus,
        memory: spec.memory_bytes,
        // No swap beyond the memory limit: the limit means what it says.
        memory_swap: spec.memory_bytes,
        network_mode: spec.network.clone(),
        // docs/behaviour.md#hardening: nothing but what the kind grants back, no privilege gained by exec.
        cap_drop: Some(vec!["ALL".into()]),
        cap_add: (!h.cap_add.is_empty()).then(|| h.cap_add.clone()),
        security_opt: Some(vec!["no-new-privileges".into()]),
        pids_limit: Some(h.pids_limit),
        log_config: Some(HostConfigLogConfig {
            typ: Some("json-file".into()),
            config: Some([("max-size", "10m"), ("max-file", "3")].map(|(k, v)| (k.into(), v.into())).into()),
        }),
        ..Default::default()
    };
    ContainerCreateBody {
        user: h.user.clone(),
        image: Some(spec.image.clone()),
        env: Some(env),
        labels: Some(spec.labels.clone().into_iter().collect()),
        host_config: Some(host),
        ..Default::default()
    }
}
