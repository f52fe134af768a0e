//! Prometheus metrics (docs/behaviour.md#logs-and-metrics), served on their own port. Values are pushed by the code
//! that knows them (the pass sets gauges from what it computed); encoding never calls back
//! into the registry.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Typed label sets, one per family: a report or a call counts without building strings.
/// A node-protocol route (`desired`, `observed`, `exchange`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    pub status: &'static str,
    pub health: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PlacementLabels {
    pub status: &'static str,
    /// A reason code, or empty.
    pub reason: String,
}

/// The outcome of a report, a join or a PAT event.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    pub event: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub service: &'static str,
    pub call: &'static str,
    pub outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MirrorLabels {
    pub kind: &'static str,
    pub op: &'static str,
    pub outcome: String,
}

/// The kind of a work item (`reconcile::work::WorkKey`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkLabels {
    pub kind: &'static str,
}

pub struct Metrics {
    registry: Registry,
    pub nodes: Family<NodeLabels, Gauge>,
    pub placements: Family<PlacementLabels, Gauge>,
    pub pass_seconds: Histogram,
    pub passes: Counter,
    pub pass_errors: Counter,
    /// Desired bodies a pass built because their inputs' hash changed or was unknown.
    pub desired_built: Counter,
    pub longpolls_held: Gauge,
    pub reports: Family<OutcomeLabels, Counter>,
    pub node_requests: Family<RouteLabels, Counter>,
    pub platform_calls: Family<CallLabels, Counter>,
    pub pats: Family<EventLabels, Counter>,
    /// Rollouts by state (docs/behaviour.md#rolling-out-a-change); complete ones are not held.
    pub rollouts: Family<StateLabels, Gauge>,
    pub rollout_replicas_updated: Counter,
    pub queue_depth: Gauge,
    pub work_retries: Counter,
    pub work_seconds: Family<WorkLabels, Histogram>,
    pub work_failures: Family<WorkLabels, Counter>,
    pub agents_skipped: Counter,
    pub agent_fields_replaced: Counter,
    pub joins: Family<OutcomeLabels, Counter>,
    pub mirror_writes: Family<MirrorLabels, Counter>,
    /// 1 while the Kubernetes mirror's calls are answered and its checks pass.
    pub mirror_up: Gauge,
    /// The mirror's calls the API server did not answer (unreachable, 5xx, 429).
    pub mirror_api_failures: Counter,
    pub connections_refused: Counter,
    pub connections_refused_per_ip: Counter,
    /// Connections closed to keep strangers' buffers within FLEET_UNAUTH_BUFFER_BYTES.
    pub unauth_shed: Counter,
    pub unauth_buffer_bytes: Gauge,
    pub memory_allocated: Gauge,
    pub memory_resident: Gauge,
    pub memory_active: Gauge,
    pub memory_metadata: Gauge,
    /// 1 on the replica that holds the lease (always 1 on SQLite), else 0 (docs/behaviour.md#high-availability).
    pub leader: Gauge,
}

fn work_histogram() -> Histogram {
    Histogram::new([0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0].into_iter())
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("fleet");
        let m = Metrics {
            nodes: Family::default(),
            placements: Family::default(),
            pass_seconds: Histogram::new([0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0].into_iter()),
            passes: Counter::default(),
            pass_errors: Counter::default(),
            desired_built: Counter::default(),
            longpolls_held: Gauge::default(),
            reports: Family::default(),
            node_requests: Family::default(),
            platform_calls: Family::default(),
            pats: Family::default(),
            rollouts: Family::default(),
            rollout_replicas_updated: Counter::default(),
            queue_depth: Gauge::default(),
            work_retries: Counter::default(),
            work_seconds: Family::new_with_constructor(work_histogram),
            work_failures: Family::default(),
            agents_skipped: Counter::default(),
            agent_fields_replaced: Counter::default(),
            joins: Family::default(),
            mirror_writes: Family::default(),
            mirror_up: Gauge::default(),
            mirror_api_failures: Counter::default(),
            connections_refused: Counter::default(),
            connections_refused_per_ip: Counter::default(),
            unauth_shed: Counter::default(),
            unauth_buffer_bytes: Gauge::default(),
            memory_allocated: Gauge::default(),
            memory_resident: Gauge::default(),
            memory_active: Gauge::default(),
            memory_metadata: Gauge::default(),
            leader: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register("nodes", "Nodes by status and health", m.nodes.clone());
        registry.register("placements", "Placement items by status and reason", m.placements.clone());
        registry.register("pass_duration_seconds", "Duration of a reconcile pass", m.pass_seconds.clone());
        registry.register("passes", "Reconcile passes run", m.passes.clone());
        registry.register("leader", "1 on the replica that leads (runs the pass), else 0", m.leader.clone());
        registry.register("pass_errors", "Reconcile passes that failed", m.pass_errors.clone());
        registry.register(
            "desired_built",
            "Nodes' desired bodies built by passes (their inputs changed or their hash was not known)",
            m.desired_built.clone(),
        );
        registry.register("longpolls_held", "Desired-state long-polls held open", m.longpolls_held.clone());
        registry.register("reports", "Observed reports by outcome", m.reports.clone());
        registry.register(
            "node_requests",
            "Node-protocol requests by route: exchange from current nodes, desired and observed from older ones",
            m.node_requests.clone(),
        );
        registry.register("platform_calls", "CP and IAM calls by service, call and outcome", m.platform_calls.clone());
        registry.register("pats", "PATs issued, rotated, revoked and failed", m.pats.clone());
        registry.register("rollouts", "Rollouts not complete, by state", m.rollouts.clone());
        registry.register(
            "rollout_replicas_updated",
            "Replicas handed a new template by a rollout step",
            m.rollout_replicas_updated.clone(),
        );
        registry.register("work_queue_depth", "Work items waiting", m.queue_depth.clone());
        registry.register("work_retries", "Work items retried after a failure", m.work_retries.clone());
        registry.register("work_duration_seconds", "Duration of a work item by kind", m.work_seconds.clone());
        registry.register("work_failures", "Work items that failed by kind", m.work_failures.clone());
        registry.register("agents_skipped", "CP agent items skipped as invalid", m.agents_skipped.clone());
        registry.register(
            "agent_fields_replaced",
            "Wrong fields of CP agent items replaced by a clamped, last good or default value",
            m.agent_fields_replaced.clone(),
        );
        registry.register("joins", "Join attempts by outcome", m.joins.clone());
        register_mirror(&mut registry, &m);
        register_connections(&mut registry, &m);
        register_memory(&mut registry, &m);
        Metrics { registry, ..m }
    }
}

/// What the server sheds to stay within its limits (`fleet_connections_refused*`,
/// `fleet_unauth_*`).
fn register_connections(registry: &mut Registry, m: &Metrics) {
    registry.register(
        "connections_refused",
        "Connections closed at accept because FLEET_MAX_CONNECTIONS were open",
        m.connections_refused.clone(),
    );
    registry.register(
        "connections_refused_per_ip",
        "Connections closed at accept because FLEET_MAX_CONNECTIONS_PER_IP were open from their address",
        m.connections_refused_per_ip.clone(),
    );
    registry.register(
        "unauth_connections_shed",
        "Connections closed because their unauthenticated buffer was the largest when FLEET_UNAUTH_BUFFER_BYTES was full",
        m.unauth_shed.clone(),
    );
    registry.register(
        "unauth_buffer_bytes",
        "Bytes held for peers not yet authenticated (request heads, join bodies)",
        m.unauth_buffer_bytes.clone(),
    );
}

/// The Kubernetes mirror's (`fleet_mirror_*`).
fn register_mirror(registry: &mut Registry, m: &Metrics) {
    registry.register(
        "mirror_writes",
        "Kubernetes mirror requests by kind, operation and outcome",
        m.mirror_writes.clone(),
    );
    registry.register(
        "mirror_up",
        "1 while the Kubernetes mirror's calls are answered and its start-up checks pass",
        m.mirror_up.clone(),
    );
    registry.register(
        "mirror_api_failures",
        "Kubernetes mirror calls the API server did not answer (unreachable, 5xx, 429)",
        m.mirror_api_failures.clone(),
    );
}

/// The allocator's own figures (`fleet_memory_*`).
fn register_memory(registry: &mut Registry, m: &Metrics) {
    registry.register(
        "memory_allocated_bytes",
        "Heap bytes in use, as the allocator (jemalloc) counts them",
        m.memory_allocated.clone(),
    );
    registry.register(
        "memory_resident_bytes",
        "Bytes the allocator holds in physical memory (heap in use plus its free pages)",
        m.memory_resident.clone(),
    );
    registry.register(
        "memory_active_bytes",
        "Bytes in the allocator's pages in use: above the heap in use, what its partly used pages hold free",
        m.memory_active.clone(),
    );
    registry.register(
        "memory_metadata_bytes",
        "Bytes the allocator spends on its own bookkeeping",
        m.memory_metadata.clone(),
    );
}

impl Metrics {
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = encode(&mut out, &self.registry);
        out
    }

    pub fn call(&self, service: &'static str, call: &'static str, outcome: &'static str) {
        self.platform_calls.get_or_create(&CallLabels { service, call, outcome }).inc();
    }

    pub fn report(&self, outcome: &'static str) {
        self.reports.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    pub fn node_request(&self, route: &'static str) {
        self.node_requests.get_or_create(&RouteLabels { route }).inc();
    }

    pub fn join(&self, outcome: &'static str) {
        self.joins.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    /// Times one pass: observed into the pass histogram when dropped, however the pass ends.
    pub fn pass_timer(&self) -> Timer<'_> {
        Timer { histogram: &self.pass_seconds, started: std::time::Instant::now() }
    }

    /// Times one work item of `kind` the same way.
    pub fn work_timer(&self, kind: &'static str) -> OwnedTimer {
        OwnedTimer {
            histogram: self.work_seconds.get_or_create(&WorkLabels { kind }).clone(),
            started: std::time::Instant::now(),
        }
    }

    /// Samples the allocator's counters into the memory gauges. jemalloc caches them until its
    /// epoch advances; both reads are a few microseconds, so every pass samples. A process
    /// whose allocator is not jemalloc (library tests) reads jemalloc's own small bookkeeping.
    pub fn sample_memory(&self) {
        use tikv_jemalloc_ctl::{epoch, stats};
        if epoch::advance().is_err() {
            return;
        }
        if let Ok(n) = stats::allocated::read() {
            self.memory_allocated.set(n as i64);
        }
        if let Ok(n) = stats::resident::read() {
            self.memory_resident.set(n as i64);
        }
        if let Ok(n) = stats::active::read() {
            self.memory_active.set(n as i64);
        }
        if let Ok(n) = stats::metadata::read() {
            self.memory_metadata.set(n as i64);
        }
    }

    pub fn pat(&self, event: &'static str) {
        self.pats.get_or_create(&EventLabels { event }).inc();
    }
}

/// How often [`trace_memory`] writes a line.
pub const MEMORY_TRACE_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// Appends a line of the process's memory to `path` every [`MEMORY_TRACE_EVERY`], on a thread
/// of its own, for the life of the process (`FLEET_MEMORY_TRACE`, profiling only). The gauges
/// are set as a pass ends, and a pass's own peak falls between two of them; this shows it,
/// with what of it is jemalloc's and what is not. Each time `VmRSS` passes its highest so far
/// by a MiB, jemalloc's statistics by size class (JSON) replace `<path>.peak.json` (how full
/// each class's slabs are at the peak) and the process's mappings `<path>.peak.smaps` (what
/// is resident outside jemalloc); docs/performance.md#how-to-measure.
pub fn trace_memory(path: std::path::PathBuf) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
    writeln!(out, "# unix_seconds allocated_mib active_mib resident_mib metadata_mib vm_rss_mib")?;
    let beside = |suffix: &str| {
        let mut p = path.clone().into_os_string();
        p.push(suffix);
        std::path::PathBuf::from(p)
    };
    let (peak_json, peak_smaps) = (beside(".peak.json"), beside(".peak.smaps"));
    let mut highest = 0.0;
    std::thread::Builder::new().name("memory-trace".into()).spawn(move || loop {
        let rss = vm_rss_mib();
        if writeln!(out, "{}", memory_line(rss)).is_err() {
            return;
        }
        if rss > highest + 1.0 {
            highest = rss;
            let _ = write_size_classes(&peak_json);
            let _ = std::fs::copy("/proc/self/smaps", &peak_smaps);
        }
        std::thread::sleep(MEMORY_TRACE_EVERY);
    })?;
    Ok(())
}

/// jemalloc's statistics, merged over its arenas, by size class, as JSON.
fn write_size_classes(path: &std::path::Path) -> std::io::Result<()> {
    let mut options = tikv_jemalloc_ctl::stats_print::Options::default();
    options.json_format = true;
    options.skip_per_arena = true;
    options.skip_mutex_statistics = true;
    let mut buf = Vec::new();
    tikv_jemalloc_ctl::stats_print::stats_print(&mut buf, options)?;
    std::fs::write(path, buf)
}

/// The process's resident set (`VmRSS`) in MiB; -1 when it cannot be read.
fn vm_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(-1024.0);
    rss_kib / 1024.0
}

/// One line of [`trace_memory`]: the time, jemalloc's allocated, active, resident and metadata
/// bytes, and the process's resident set (`VmRSS`, read by the caller), in MiB.
pub fn memory_line(vm_rss_mib: f64) -> String {
    use tikv_jemalloc_ctl::{epoch, stats};
    let _ = epoch::advance();
    let mib = |n: Result<usize, _>| n.map_or(-1.0, |n| n as f64 / 1048576.0);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!(
        "{:.2} {:.1} {:.1} {:.1} {:.1} {:.1}",
        now.as_secs_f64(),
        mib(stats::allocated::read()),
        mib(stats::active::read()),
        mib(stats::resident::read()),
        mib(stats::metadata::read()),
        vm_rss_mib
    )
}

/// Observes the time since it was made into a histogram when dropped (an RAII guard, as in
/// kube-rs's controller-rs): an early return or an error is timed too.
pub struct Timer<'a> {
    histogram: &'a Histogram,
    started: std::time::Instant,
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        self.histogram.observe(self.started.elapsed().as_secs_f64());
    }
}

/// A [`Timer`] that owns its histogram (a family member), so it can live across `.await`.
pub struct OwnedTimer {
    histogram: Histogram,
    started: std::time::Instant,
}

impl Drop for OwnedTimer {
    fn drop(&mut self) {
        self.histogram.observe(self.started.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    /// A line is the time and five figures in MiB, every one of them read.
    #[test]
    fn a_memory_line_is_the_time_and_five_figures_read() {
        let figures: Vec<f64> =
            super::memory_line(super::vm_rss_mib()).split(' ').map(|x| x.parse().unwrap()).collect();
        assert_eq!(figures.len(), 6, "{figures:?}");
        assert!(figures[0] > 1.7e9, "unix seconds: {figures:?}");
        assert!(figures[1..].iter().all(|&x| x >= 0.0), "a figure not read: {figures:?}");
        assert!(figures[5] > 1.0, "VmRSS: {figures:?}");
    }

    /// The trace file gets its header, then a line every 100 ms; the peak's size classes go beside it.
    #[test]
    fn the_trace_appends_a_line_every_tenth_of_a_second() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory.txt");
        super::trace_memory(path.clone()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(450));
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines = text.lines();
        assert!(lines.next().unwrap().starts_with("# unix_seconds allocated_mib"), "{text}");
        assert!(lines.filter(|l| l.split(' ').count() == 6).count() >= 3, "{text}");
        let peak = std::fs::read_to_string(dir.path().join("memory.txt.peak.json")).unwrap();
        let peak: serde_json::Value = serde_json::from_str(&peak).unwrap();
        let bins = &peak["jemalloc"]["stats.arenas"]["merged"]["bins"];
        assert!(bins.as_array().is_some_and(|b| !b.is_empty()), "size classes at the peak: {peak}");
        let smaps = std::fs::read_to_string(dir.path().join("memory.txt.peak.smaps")).unwrap();
        assert!(smaps.contains("Rss:"), "{smaps}");
    }
}
