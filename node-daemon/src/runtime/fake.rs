//! An in-memory runtime for supervisor tests: containers that exit when told to, creates that
//! fail on demand, an engine that can be "down", and a log of calls. Stops honour SIGTERM at
//! once unless the container is set to ignore it, then take the whole timeout (paused clock).

use super::contract::{ContainerSpec, RtError, RunInfo, Runtime, Seen};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct FakeContainer {
    pub id: String,
    pub spec: ContainerSpec,
    pub running: bool,
    pub exit_code: Option<i64>,
    pub starts: u32,
    pub ignores_term: bool,
}

#[derive(Debug, Default)]
pub struct FakeState {
    pub containers: BTreeMap<String, FakeContainer>,
    pub next_id: u64,
    pub fail_create: Option<String>,
    /// What starting an existing container answers instead of starting it.
    pub fail_start: Option<String>,
    /// Images the engine does not have (every other one is present).
    pub missing_images: Vec<String>,
    pub down: bool,
    pub calls: Vec<String>,
}

#[derive(Clone, Default)]
pub struct FakeRuntime {
    pub state: Arc<Mutex<FakeState>>,
}

impl FakeRuntime {
    /// Makes the running container named `name` exit with `code`.
    pub fn exit(&self, name: &str, code: i64) {
        let mut st = self.state.lock();
        let c = st.containers.values_mut().find(|c| c.spec.name == name).expect("container exists");
        assert!(c.running, "{name} is not running");
        c.running = false;
        c.exit_code = Some(code);
    }

    pub fn by_name(&self, name: &str) -> Option<FakeContainer> {
        self.state.lock().containers.values().find(|c| c.spec.name == name).cloned()
    }

    pub fn calls(&self) -> Vec<String> {
        self.state.lock().calls.clone()
    }

    pub fn count(&self, prefix: &str) -> usize {
        self.state.lock().calls.iter().filter(|c| c.starts_with(prefix)).count()
    }

    fn check(&self, call: String) -> Result<(), RtError> {
        let mut st = self.state.lock();
        if st.down {
            return Err(RtError::Unreachable("fake engine is down".into()));
        }
        st.calls.push(call);
        Ok(())
    }
}

impl Runtime for FakeRuntime {
    async fn ping(&self) -> Result<(), RtError> {
        if self.state.lock().down {
            return Err(RtError::Unreachable("fake engine is down".into()));
        }
        Ok(())
    }

    async fn list(&self) -> Result<Vec<Seen>, RtError> {
        if self.state.lock().down {
            return Err(RtError::Unreachable("fake engine is down".into()));
        }
        Ok(self
            .state
            .lock()
            .containers
            .values()
            .map(|c| Seen {
                id: c.id.clone(),
                name: c.spec.name.clone(),
                labels: c.spec.labels.clone(),
                running: c.running,
                lease_source: c.spec.lease_dir.clone(),
            })
            .collect())
    }

    async fn inspect(&self, id: &str) -> Result<RunInfo, RtError> {
        self.check(format!("inspect {id}"))?;
        let st = self.state.lock();
        let c = st.containers.get(id).ok_or(RtError::NotFound)?;
        Ok(RunInfo { running: c.running, exit_code: c.exit_code })
    }

    async fn image_present(&self, image: &str) -> Result<(), RtError> {
        self.check(format!("image {image}"))?;
        match self.state.lock().missing_images.iter().any(|m| m == image) {
            true => Err(RtError::NotFound),
            false => Ok(()),
        }
    }

    async fn create(&self, spec: &ContainerSpec) -> Result<String, RtError> {
        self.check(format!("create {}", spec.name))?;
        let mut st = self.state.lock();
        if let Some(e) = &st.fail_create {
            return Err(RtError::Failed(e.clone()));
        }
        if st.containers.values().any(|c| c.spec.name == spec.name) {
            return Err(RtError::Failed(format!("Conflict. The container name {:?} is already in use", spec.name)));
        }
        st.next_id += 1;
        let id = format!("c{}", st.next_id);
        st.containers.insert(
            id.clone(),
            FakeContainer {
                id: id.clone(),
                spec: spec.clone(),
                running: false,
                exit_code: None,
                starts: 0,
                ignores_term: false,
            },
        );
        Ok(id)
    }

    async fn start(&self, id: &str) -> Result<(), RtError> {
        self.check(format!("start {id}"))?;
        let mut st = self.state.lock();
        if let Some(m) = st.fail_start.clone() {
            return Err(RtError::Failed(m));
        }
        let c = st.containers.get_mut(id).ok_or(RtError::NotFound)?;
        c.running = true;
        c.exit_code = None;
        c.starts += 1;
        Ok(())
    }

    async fn stop(&self, id: &str, timeout: Duration) -> Result<(), RtError> {
        self.check(format!("stop {id} {}s", timeout.as_secs()))?;
        let ignores = self.state.lock().containers.get(id).map(|c| c.ignores_term && c.running).unwrap_or(false);
        if ignores {
            tokio::time::sleep(timeout).await;
        }
        if let Some(c) = self.state.lock().containers.get_mut(id) {
            if c.running {
                c.running = false;
                c.exit_code = Some(if ignores { 137 } else { 0 });
            }
        }
        Ok(())
    }

    async fn remove(&self, id: &str) -> Result<(), RtError> {
        self.check(format!("remove {id}"))?;
        self.state.lock().containers.remove(id);
        Ok(())
    }
}
