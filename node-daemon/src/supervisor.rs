//! The per-replica state machine of docs/behaviour.md#container-rules, driven by ticks: each tick lists this node's
//! containers once and moves every wanted replica a step — create, adopt, restart after an
//! exit (at once for 0/75, at most once per 10 s; else after 5, 10, 20 … 300 s, `crashloop`
//! after three failures in a row), drain and recreate on a changed spec, refuse at no cost.
//! Stops always run in the background; while a replica's old container drains its name is
//! taken and it reports `draining`. Each running replica's busy lease is read every tick
//! ([`crate::lease`]); every other replica is idle.

use crate::lease;
use crate::plan::{container_name, Plan, Wanted, VANISHED_STOP};
use crate::runtime::{RtError, Runtime, Seen, LABEL_AGENT, LABEL_SPEC, LABEL_SPEC_ID};
use fleet_api::codes::refusal;
use fleet_api::{ReplicaReport, ReplicaState};
pub use leases::LeaseReader;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::Notify;
use tokio::time::Instant;

/// A run this long clears the failure count.
pub const STABLE_RUN: Duration = Duration::from_secs(600);
/// Immediate restarts after exit 0/75 are at most this frequent.
pub const MIN_RESTART_GAP: Duration = Duration::from_secs(10);
pub const CRASHLOOP_AFTER: u32 = 3;

/// Delay before the next try after `failures` failures in a row: 5, 10, 20 … 300 s.
pub fn backoff(failures: u32) -> Duration {
    let secs = 5u64.saturating_mul(1 << failures.saturating_sub(1).min(16));
    Duration::from_secs(secs.min(300))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaStatus {
    pub state: ReplicaState,
    pub restarts: u32,
    pub last_exit_code: Option<i64>,
    pub message: Option<String>,
}

#[derive(Debug)]
struct Record {
    status: ReplicaStatus,
    /// The spec hash this record's counters belong to; a new one is tried at once.
    spec_hash: Option<String>,
    container: Option<String>,
    failures: u32,
    next_attempt: Option<Instant>,
    last_start: Option<Instant>,
    running_since: Option<Instant>,
    /// We believe the container runs: seeing it exited is a new exit.
    watching: bool,
    /// The template of the container that runs now (its `fleet.spec-id`), as reported.
    spec_id: Option<String>,
    /// When this node started the container's current run (wall clock, as a lease file's
    /// time is): a lease written before it is a previous run's. `None` for a container
    /// found running.
    run_began: Option<SystemTime>,
    /// Until when (Unix seconds) the running replica said it is busy.
    busy_until: Option<i64>,
    /// When a lease that cannot be read was last said in the log.
    lease_said: Option<Instant>,
}

impl Record {
    fn new() -> Record {
        Record {
            status: ReplicaStatus { state: ReplicaState::Starting, restarts: 0, last_exit_code: None, message: None },
            spec_hash: None,
            container: None,
            failures: 0,
            next_attempt: None,
            last_start: None,
            running_since: None,
            watching: false,
            spec_id: None,
            run_began: None,
            busy_until: None,
            lease_said: None,
        }
    }

    /// The container `c` runs: adopted when it is not the one this record knew.
    fn watch_running(&mut self, c: &Seen, w: &Wanted, now: Instant) {
        self.spec_id = w.spec_id.clone();
        if self.container.as_deref() != Some(c.id.as_str()) {
            tracing::info!(container = %c.name, "adopted running container");
            self.container = Some(c.id.clone());
            self.running_since = Some(now);
            self.run_began = None;
        }
        self.watching = true;
        if self.running_since.is_some_and(|t| now.duration_since(t) >= STABLE_RUN) && self.failures > 0 {
            self.failures = 0;
            self.status.message = None;
        }
        self.status.state = self.running_state();
    }

    /// A lease the node cannot count, said at most every ten minutes per replica.
    fn say_unreadable(&mut self, name: &str, why: &str) {
        if self.lease_said.is_none_or(|t| t.elapsed() >= lease::UNREADABLE_SAID_EVERY) {
            tracing::warn!(container = %name, problem = %why, "a busy lease cannot be read; the replica counts as idle");
            self.lease_said = Some(Instant::now());
        }
    }

    fn fail(&mut self, now: Instant, message: String) {
        self.failures += 1;
        self.next_attempt = Some(now + backoff(self.failures));
        self.status.state =
            if self.failures >= CRASHLOOP_AFTER { ReplicaState::Crashloop } else { ReplicaState::Starting };
        self.status.message = Some(message);
    }

    /// The running container `c` of an older template stays: the new one cannot start.
    fn block(&mut self, c: &Seen, message: String) {
        self.status.state = ReplicaState::Running;
        self.status.message = Some(message);
        self.spec_id = c.labels.get(LABEL_SPEC_ID).cloned();
    }

    fn running_state(&self) -> ReplicaState {
        if self.failures >= CRASHLOOP_AFTER {
            ReplicaState::Crashloop
        } else {
            ReplicaState::Running
        }
    }
}

/// Longest replica message a report carries (docs/behaviour.md#hardening): Docker's messages are passed on
/// whole, but a peer's text is bounded.
pub const MAX_MESSAGE: usize = 4096;

/// `message` cut to [`MAX_MESSAGE`] bytes on a character boundary.
pub fn cut_message(mut message: String) -> String {
    if message.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    message
}

pub struct Supervisor<R: Runtime> {
    rt: R,
    records: HashMap<(String, u32), Record>,
    /// Names of containers being stopped in the background.
    stopping: Arc<Mutex<HashSet<String>>>,
    /// Woken when a background stop finishes, so the replacement starts promptly.
    pub wake: Arc<Notify>,
    /// node.yaml `checkBeforeStop` (docs/behaviour.md#rolling-out-a-change).
    check_before_stop: bool,
    /// Where the replicas' busy leases are (none: every replica is idle).
    leases: Option<LeaseReader>,
}

impl<R: Runtime> Supervisor<R> {
    pub fn new(rt: R) -> Self {
        Supervisor {
            rt,
            records: HashMap::new(),
            stopping: Default::default(),
            wake: Arc::new(Notify::new()),
            check_before_stop: false,
            leases: None,
        }
    }

    /// Gives each container a lease directory and reads the replicas' leases from them.
    pub fn with_leases(mut self, reader: LeaseReader) -> Self {
        self.leases = Some(reader);
        self
    }

    /// Never stops a running container for a template it cannot start.
    pub fn checking_before_stop(mut self, on: bool) -> Self {
        self.check_before_stop = on;
        self
    }

    pub fn runtime(&self) -> &R {
        &self.rt
    }

    /// The reported state of every wanted replica.
    pub fn reports(&self, wanted: &[Wanted]) -> Vec<ReplicaReport> {
        wanted
            .iter()
            .map(|w| {
                let rec = self.records.get(&(w.agent.clone(), w.replica));
                let s = rec.map(|r| r.status.clone()).unwrap_or(ReplicaStatus {
                    state: ReplicaState::Starting,
                    restarts: 0,
                    last_exit_code: None,
                    message: None,
                });
                // A note of the plan (resources clamped) while nothing else is to be said.
                let note = match &w.plan {
                    Plan::Run(spec) => spec.note.clone(),
                    Plan::Refuse(_) => None,
                };
                ReplicaReport {
                    agent_key: w.agent.clone(),
                    revision: w.revision,
                    replica: w.replica,
                    state: s.state,
                    restarts: s.restarts,
                    last_exit_code: s.last_exit_code,
                    message: s.message.or(note).map(cut_message),
                    spec_id: rec.and_then(|r| r.spec_id.clone()),
                    busy_until: rec
                        .filter(|r| r.status.state == ReplicaState::Running)
                        .and_then(|r| r.busy_until)
                        .map(lease::rfc3339),
                }
            })
            .collect()
    }

    /// Stops and removes a container in the background.
    fn stop_in_background(&self, c: &Seen, timeout: Duration, why: &str) {
        if !self.stopping.lock().insert(c.name.clone()) {
            return;
        }
        tracing::info!(container = %c.name, timeout_seconds = timeout.as_secs(), reason = why, "stopping");
        let (rt, id, name, stopping, wake) =
            (self.rt.clone(), c.id.clone(), c.name.clone(), self.stopping.clone(), self.wake.clone());
        tokio::spawn(async move {
            if let Err(e) = rt.stop(&id, timeout).await {
                tracing::warn!(container = %name, error = %e, "stop failed; removing anyway");
            }
            if let Err(e) = rt.remove(&id).await {
                tracing::warn!(container = %name, error = %e, "remove failed; the next tick retries");
            } else {
                tracing::info!(container = %name, "stopped and removed");
            }
            stopping.lock().remove(&name);
            wake.notify_one();
        });
    }

    /// One step for every replica. `Err` means Docker is unreachable (health degraded).
    pub async fn tick(
        &mut self,
        wanted: &[Wanted],
        drains: &HashMap<String, Duration>,
        prefix: &str,
    ) -> Result<(), RtError> {
        let seen = self.rt.list().await?;
        let now = Instant::now();
        let by_name: HashMap<&str, &Seen> = seen.iter().map(|s| (s.name.as_str(), s)).collect();
        let wanted_names: HashSet<String> =
            wanted.iter().map(|w| container_name(prefix, &w.agent, w.replica)).collect();
        for w in wanted {
            let name = container_name(prefix, &w.agent, w.replica);
            self.step(w, &name, by_name.get(name.as_str()).copied(), now).await;
        }
        self.stop_unwanted(&seen, &wanted_names, drains, prefix);
        self.read_leases(wanted, &by_name, prefix).await;
        self.forget_departed(wanted, &seen, &wanted_names);
        Ok(())
    }

    /// One replica's step, its container (`existing`, named `name`) as listed.
    async fn step(&mut self, w: &Wanted, name: &str, existing: Option<&Seen>, now: Instant) {
        let spec = match &w.plan {
            Plan::Refuse(msg) => return self.refuse(w, existing, msg),
            Plan::Run(spec) => spec,
        };
        let draining = self.stopping.lock().contains(name);
        let rec = self.records.entry((w.agent.clone(), w.replica)).or_insert_with(Record::new);
        if rec.spec_hash.as_deref() != Some(spec.hash()) {
            // A changed spec is tried at once, with fresh counters.
            *rec = Record::new();
            rec.spec_hash = Some(spec.hash().to_string());
        }
        if draining {
            rec.status.state = ReplicaState::Draining;
            return;
        }
        match existing {
            Some(c) if c.labels.get(LABEL_SPEC).map(String::as_str) != Some(spec.hash()) => {
                self.replace(w, c, spec).await
            }
            Some(c) if c.running => rec.watch_running(c, w, now),
            Some(c) => self.exited(w, &c.id, &c.name, now).await,
            None if rec.next_attempt.is_none_or(|t| t <= now) => self.create(w, spec, now).await,
            None => {}
        }
    }

    fn record_mut(&mut self, w: &Wanted) -> &mut Record {
        self.records.entry((w.agent.clone(), w.replica)).or_insert_with(Record::new)
    }

    /// A refused replica: with `checkBeforeStop` a running container of another template
    /// stays (`update_blocked`); else its container goes and it reports `stopped`.
    fn refuse(&mut self, w: &Wanted, existing: Option<&Seen>, msg: &str) {
        if let Some(c) = existing.filter(|c| self.keeps(c, w)) {
            self.record_mut(w).block(c, refusal::update_blocked(msg));
            return;
        }
        if let Some(c) = existing {
            let timeout = if c.running { w.drain } else { Duration::ZERO };
            self.stop_in_background(c, timeout, msg);
        }
        let rec = self.record_mut(w);
        *rec = Record::new();
        rec.status.state = ReplicaState::Stopped;
        rec.status.message = Some(msg.to_string());
    }

    /// The container `c` runs another spec: drained in the background for the new one,
    /// unless `checkBeforeStop` finds the new one cannot start.
    async fn replace(&mut self, w: &Wanted, c: &Seen, spec: &crate::runtime::ContainerSpec) {
        if let Err(cause) = self.can_start(c, w, spec).await {
            self.record_mut(w).block(c, refusal::update_blocked(&cause));
            return;
        }
        let rec = self.record_mut(w);
        rec.status.state = ReplicaState::Draining;
        rec.spec_id = c.labels.get(LABEL_SPEC_ID).cloned();
        self.stop_in_background(c, w.drain, "spec changed");
    }

    /// Containers no longer wanted: the agent's drain when it is still desired, else 30 s.
    /// Only names under this node's prefix are touched: nodes sharing an engine may even
    /// share a name across fleets.
    fn stop_unwanted(
        &self,
        seen: &[Seen],
        wanted_names: &HashSet<String>,
        drains: &HashMap<String, Duration>,
        prefix: &str,
    ) {
        let own = format!("{prefix}-");
        for c in seen {
            if wanted_names.contains(&c.name) || !c.name.starts_with(&own) {
                continue;
            }
            let timeout = c.labels.get(LABEL_AGENT).and_then(|a| drains.get(a)).copied().unwrap_or(VANISHED_STOP);
            let timeout = if c.running { timeout } else { Duration::ZERO };
            self.stop_in_background(c, timeout, "no longer wanted");
        }
    }

    /// Each running replica's busy lease, read from its container's lease directory; every
    /// other replica is idle.
    async fn read_leases(&mut self, wanted: &[Wanted], by_name: &HashMap<&str, &Seen>, prefix: &str) {
        let Some(reader) = self.leases.clone() else { return };
        let wall = SystemTime::now();
        for w in wanted {
            let name = container_name(prefix, &w.agent, w.replica);
            let source = by_name.get(name.as_str()).filter(|c| c.running).and_then(|c| c.lease_source.clone());
            let Some(rec) = self.records.get_mut(&(w.agent.clone(), w.replica)) else { continue };
            rec.busy_until = None;
            let Some(source) = source.filter(|_| rec.status.state == ReplicaState::Running) else { continue };
            match reader.read(&name, &source).await {
                Ok(lease) => rec.busy_until = lease::busy_until(lease.as_ref(), rec.run_began, wall),
                Err(e) => rec.say_unreadable(&name, &e),
            }
        }
    }

    /// Records of replicas no longer wanted are dropped, and the lease directories of
    /// containers neither wanted nor on the engine removed.
    fn forget_departed(&mut self, wanted: &[Wanted], seen: &[Seen], wanted_names: &HashSet<String>) {
        let keep: HashSet<(String, u32)> = wanted.iter().map(|w| (w.agent.clone(), w.replica)).collect();
        self.records.retain(|k, _| keep.contains(k));
        if let Some(reader) = &self.leases {
            reader.dirs.prune(&|n| wanted_names.contains(n) || seen.iter().any(|c| c.name == n));
        }
    }

    /// With `checkBeforeStop`, whether a running container of another template stays
    /// because the wanted one is refused.
    fn keeps(&self, c: &Seen, w: &Wanted) -> bool {
        self.check_before_stop && c.running && c.labels.get(LABEL_SPEC_ID) != w.spec_id.as_ref()
    }

    /// With `checkBeforeStop`, whether the new spec can start before the running container
    /// `c` is stopped for it: `Err` with the engine's words when its image is not there (the
    /// kind, the allow-list, the secrets and the PAT were checked by the plan).
    async fn can_start(&self, c: &Seen, w: &Wanted, spec: &crate::runtime::ContainerSpec) -> Result<(), String> {
        if !self.keeps(c, w) {
            return Ok(());
        }
        match self.rt.image_present(&spec.image).await {
            Ok(()) => Ok(()),
            Err(RtError::NotFound) => Err(format!("No such image: {}", spec.image)),
            Err(RtError::Failed(m)) => Err(m),
            // An engine that does not answer is no reason to stop anything either.
            Err(e @ RtError::Unreachable(_)) => Err(e.to_string()),
        }
    }

    async fn exited(&mut self, w: &Wanted, id: &str, name: &str, now: Instant) {
        let key = (w.agent.clone(), w.replica);
        let new_exit = {
            let rec = self.records.get(&key).expect("record exists");
            rec.watching || rec.container.as_deref() != Some(id)
        };
        if new_exit {
            let code = match self.rt.inspect(id).await {
                Ok(info) if info.running => return, // started between list and inspect
                Ok(info) => info.exit_code,
                Err(e) => {
                    tracing::warn!(container = %name, error = %e, "cannot inspect exited container");
                    return;
                }
            };
            let rec = self.records.get_mut(&key).expect("record exists");
            rec.watching = false;
            rec.container = Some(id.to_string());
            rec.status.last_exit_code = code;
            if rec.running_since.is_some_and(|t| now.duration_since(t) >= STABLE_RUN) {
                rec.failures = 0;
            }
            match code {
                Some(0) | Some(75) => {
                    rec.failures = 0;
                    rec.status.message = None;
                    rec.status.state = ReplicaState::Starting;
                    let earliest = rec.last_start.map(|t| t + MIN_RESTART_GAP).unwrap_or(now);
                    rec.next_attempt = Some(earliest.max(now));
                    tracing::info!(container = %name, code = ?code, "exited; restarting");
                }
                other => {
                    let c = other.map(|c| c.to_string()).unwrap_or_else(|| "unknown".into());
                    rec.fail(now, format!("exited with code {c}"));
                    tracing::warn!(container = %name, code = %c, failures = rec.failures, retry_in = ?backoff(rec.failures), "exited with a failure");
                }
            }
        }
        let rec = self.records.get_mut(&key).expect("record exists");
        if rec.next_attempt.is_some_and(|t| t <= now) {
            rec.run_began = Some(SystemTime::now());
            rec.busy_until = None;
            match self.rt.start(id).await {
                Ok(()) => {
                    rec.status.restarts += 1;
                    rec.last_start = Some(now);
                    rec.running_since = Some(now);
                    rec.watching = true;
                    rec.next_attempt = None;
                    rec.status.state = rec.running_state();
                    tracing::info!(container = %name, restarts = rec.status.restarts, "restarted");
                }
                Err(e) if e.to_string().contains(crate::runtime::NOT_THE_GUARDS_FILES) => {
                    // Made before the Docker guard copied what containers bind: the guard will
                    // not start it again, so it is made anew (the next tick creates it).
                    tracing::warn!(container = %name, error = %e, "removing a container the Docker guard will not start; it is created again");
                    let _ = self.rt.remove(id).await;
                    rec.container = None;
                    rec.next_attempt = None;
                }
                Err(e) => rec.fail(now, fleet_api::codes::refusal::start_failed(&e.to_string())),
            }
        }
    }

    async fn create(&mut self, w: &Wanted, spec: &crate::runtime::ContainerSpec, now: Instant) {
        let key = (w.agent.clone(), w.replica);
        let without_lease;
        let spec = match self.leases {
            Some(_) => spec,
            // No lease directories on this supervisor: the container is made without one.
            None => {
                without_lease = crate::runtime::ContainerSpec { lease_dir: None, ..spec.clone() };
                &without_lease
            }
        };
        self.prepare_lease(spec);
        let began = SystemTime::now();
        let result = async {
            let id = self.rt.create(spec).await?;
            if let Err(e) = self.rt.start(&id).await {
                let _ = self.rt.remove(&id).await;
                return Err(e);
            }
            Ok(id)
        }
        .await;
        let rec = self.records.get_mut(&key).expect("record exists");
        match result {
            Ok(id) => {
                tracing::info!(agent = %w.agent, replica = w.replica, "started {}", spec.name);
                rec.container = Some(id);
                rec.run_began = Some(began);
                rec.spec_id = w.spec_id.clone();
                rec.status.restarts = 0;
                rec.last_start = Some(now);
                rec.running_since = Some(now);
                rec.watching = true;
                rec.next_attempt = None;
                rec.status.state = rec.running_state();
                if rec.failures < CRASHLOOP_AFTER {
                    rec.status.message = None;
                }
            }
            Err(e) => {
                rec.fail(now, fleet_api::codes::refusal::start_failed(&e.to_string()));
                tracing::warn!(agent = %w.agent, replica = w.replica, error = %e, failures = rec.failures, "cannot start the container");
            }
        }
    }
}

impl<R: Runtime> Supervisor<R> {
    /// A fresh lease directory for the container `spec` makes: a new container starts idle.
    fn prepare_lease(&self, spec: &crate::runtime::ContainerSpec) {
        let (Some(reader), Some(_)) = (&self.leases, &spec.lease_dir) else { return };
        let owner = spec.hardening.user.as_deref().and_then(crate::plan::give_to);
        if let Err(e) = reader.dirs.prepare(&spec.name, owner) {
            tracing::warn!(container = %spec.name, error = %e, "cannot make the container's lease directory");
        }
    }
}

mod leases;
#[cfg(test)]
mod tests;
