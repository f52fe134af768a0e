//! Where the supervisor reads its replicas' busy leases (docs/behaviour.md#busy-replicas):
//! from their directories here, or, for a container whose lease directory is the Docker
//! guard's, from the guard.

use crate::guard::{busy, Upstream};
use crate::lease::{Lease, Leases};

#[derive(Debug, Clone)]
pub struct LeaseReader {
    pub dirs: Leases,
    guard: Option<Upstream>,
}

impl LeaseReader {
    /// `docker_url`: node.yaml's `dockerUrl`, the guard when there is one.
    pub fn new(dirs: Leases, docker_url: &str) -> LeaseReader {
        LeaseReader { dirs, guard: Upstream::parse(docker_url).ok() }
    }

    /// The lease of container `name`, whose bind at `/run/fleet/busy` is `source`.
    pub async fn read(&self, name: &str, source: &str) -> Result<Option<Lease>, String> {
        if self.dirs.is_local(name, source) {
            return self.dirs.read(name);
        }
        match &self.guard {
            Some(guard) => busy::ask(guard, name).await,
            None => Err(format!("bound from {source}, not this node's")),
        }
    }
}
