//! The hostile-client measurement (`fleet-sim --hostile`, docs/performance.md#hostile-clients): the same window is
//! measured three times — before, during and after an attack by [`crate::hostile`] clients —
//! for the controller's RSS and heap, the nodes' wake latency and their report success.

use crate::hostile::{Attack, Mix};
use crate::measure;
use crate::node::Shared;
use crate::wake;
use fleet_devkit::Devkit;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the measurement needs of the running simulation.
pub struct Fleet<'a> {
    pub dk: &'a Devkit,
    pub shared: &'a Shared,
    pub http: &'a reqwest::Client,
    pub pid: u32,
    pub agents: usize,
    pub addr: SocketAddr,
    pub metrics_url: &'a str,
}

/// One measured window.
#[derive(Debug, Default)]
struct Window {
    rss_mean_mib: f64,
    rss_max_mib: f64,
    /// jemalloc's allocated bytes: includes capacity reserved and not yet touched (hyper's
    /// read buffers), so it can exceed the RSS.
    heap_max_mib: f64,
    wake: wake::Samples,
    reports_ok: u64,
    reports_failed: u64,
}

impl Window {
    fn success_percent(&self) -> Option<f64> {
        let all = self.reports_ok + self.reports_failed;
        (all > 0).then(|| self.reports_ok as f64 * 100.0 / all as f64)
    }

    fn json(&self) -> Value {
        json!({
            "rssMeanMiB": self.rss_mean_mib, "rssMaxMiB": self.rss_max_mib, "heapMaxMiB": self.heap_max_mib,
            "wakeSamples": self.wake.wake.len(), "wakeP50Ms": self.wake.wake_p(0.5), "wakeP99Ms": self.wake.wake_p(0.99),
            "reportsOk": self.reports_ok, "reportsFailed": self.reports_failed,
            "reportSuccessPercent": self.success_percent(),
        })
    }
}

/// Samples the controller's RSS and jemalloc heap every 250 ms until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(Vec<f64>, f64)>,
}

impl Sampler {
    fn start(fleet: &Fleet) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let (pid, http, url, flag) = (fleet.pid, fleet.http.clone(), fleet.metrics_url.to_string(), stop.clone());
        let task = tokio::spawn(async move {
            let (mut rss, mut heap_max) = (Vec::new(), 0f64);
            while !flag.load(Ordering::Relaxed) {
                rss.extend(measure::rss_mib(pid));
                if let Some(h) = heap_mib(&http, &url).await {
                    heap_max = heap_max.max(h);
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            (rss, heap_max)
        });
        Sampler { stop, task }
    }

    async fn finish(self, w: &mut Window) {
        self.stop.store(true, Ordering::Relaxed);
        let (rss, heap_max) = self.task.await.unwrap_or_default();
        w.rss_mean_mib = rss.iter().sum::<f64>() / rss.len().max(1) as f64;
        w.rss_max_mib = rss.iter().copied().fold(0.0, f64::max);
        w.heap_max_mib = heap_max;
    }
}

async fn metrics_text(http: &reqwest::Client, url: &str) -> Option<String> {
    http.get(url).send().await.ok()?.text().await.ok()
}

async fn heap_mib(http: &reqwest::Client, url: &str) -> Option<f64> {
    let text = metrics_text(http, url).await?;
    Some(measure::sample(&text, "fleet_memory_allocated_bytes")? / 1048576.0)
}

/// Measures `length`: wake samples back to back, reports as the nodes send them, RSS and heap.
async fn window(fleet: &Fleet<'_>, length: Duration, wake_samples: bool) -> anyhow::Result<Window> {
    let mut w = Window::default();
    let (ok0, failed0) =
        (fleet.shared.reports_ok.load(Ordering::Relaxed), fleet.shared.reports_failed.load(Ordering::Relaxed));
    let sampler = Sampler::start(fleet);
    let t = Instant::now();
    while t.elapsed() < length {
        if wake_samples {
            wake::sample(fleet.dk, fleet.shared, fleet.agents, &mut w.wake).await?;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    sampler.finish(&mut w).await;
    w.wake = std::mem::take(&mut w.wake).finish();
    w.reports_ok = fleet.shared.reports_ok.load(Ordering::Relaxed) - ok0;
    w.reports_failed = fleet.shared.reports_failed.load(Ordering::Relaxed) - failed0;
    Ok(w)
}

/// A counter of the controller's metrics (0 when it has none).
async fn counter(fleet: &Fleet<'_>, name: &str) -> f64 {
    let text = metrics_text(fleet.http, fleet.metrics_url).await.unwrap_or_default();
    measure::sample(&text, name).unwrap_or(0.0)
}

const REFUSED: &str = "fleet_connections_refused_total";
const SHED: &str = "fleet_unauth_connections_shed_total";

/// Before, during and after an attack of `mix`, each window `length` long.
pub async fn run(fleet: &Fleet<'_>, mix: Mix, length: Duration) -> anyhow::Result<Value> {
    eprintln!("fleet-sim: hostile: baseline window of {}s", length.as_secs());
    let before = window(fleet, length, true).await?;
    let (refused0, shed0) = (counter(fleet, REFUSED).await, counter(fleet, SHED).await);
    let ramp = Duration::from_secs(5);
    eprintln!(
        "fleet-sim: hostile: opening {} idle, {} trickled-head, {} trickled-body, {} big-head and {} big-join connections",
        mix.idle, mix.head, mix.body, mix.big_head, mix.big_join
    );
    let attack = Attack::start(fleet.addr, mix, ramp);
    tokio::time::sleep(ramp + Duration::from_secs(2)).await;
    let open_at_start = attack.counts.open.load(Ordering::Relaxed);
    let during = window(fleet, length, true).await?;
    let open_at_end = attack.counts.open.load(Ordering::Relaxed);
    let counts = attack.stop().await;
    let (refused1, shed1) = (counter(fleet, REFUSED).await, counter(fleet, SHED).await);
    // Let the controller drop the closed connections and jemalloc return their pages.
    let settle = Duration::from_secs(30);
    eprintln!("fleet-sim: hostile: attack over, settling {}s", settle.as_secs());
    tokio::time::sleep(settle).await;
    let after = window(fleet, Duration::from_secs(10), false).await?;
    let rss_delta_mib = during.rss_max_mib - before.rss_mean_mib;
    let per_conn_kib = rss_delta_mib * 1024.0 / mix.total().max(1) as f64;
    let c = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    Ok(json!({
        "hostile": {"idle": mix.idle, "head": mix.head, "body": mix.body, "bigHead": mix.big_head,
            "bigJoin": mix.big_join, "windowSeconds": length.as_secs()},
        "rssDeltaMiB": rss_delta_mib,
        "before": before.json(), "during": during.json(), "after": after.json(),
        "rssPerHostileConnectionKiB": per_conn_kib,
        "hostileOpenAtStart": open_at_start, "hostileOpenAtEnd": open_at_end,
        "hostileOpened": c(&counts.opened), "hostileConnectFailed": c(&counts.connect_failed),
        "closedByController": counts.closed_by_controller(),
        "closedSilently": c(&counts.closed_silently), "answered408": c(&counts.answered_408),
        "answeredOther": counts.answered_other.lock().iter().map(|(s, n)| (s.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
        "reset": c(&counts.reset),
        "refusedAtCap": refused1 - refused0,
        "shedFromBudget": shed1 - shed0,
    }))
}

/// The table of [`run`]'s results.
pub fn print_table(r: &Value) {
    let f = |v: &Value| match v {
        Value::Number(n) => format!("{:.1}", n.as_f64().unwrap_or(0.0)),
        Value::Null => "-".into(),
        v => v.to_string(),
    };
    println!("{:<40} {:>10} {:>10} {:>10}", "measure", "before", "during", "after");
    for (label, key) in [
        ("controller RSS mean (MiB)", "rssMeanMiB"),
        ("controller RSS max (MiB)", "rssMaxMiB"),
        ("jemalloc allocated max (MiB)", "heapMaxMiB"),
        ("wake p50 (ms)", "wakeP50Ms"),
        ("wake p99 (ms)", "wakeP99Ms"),
        ("report success (%)", "reportSuccessPercent"),
        ("reports ok", "reportsOk"),
    ] {
        let [b, d, a] = ["before", "during", "after"].map(|w| f(&r[w][key]));
        println!("{label:<40} {b:>10} {d:>10} {a:>10}");
    }
    for (label, key) in [
        ("RSS delta: during max - before mean (MiB)", "rssDeltaMiB"),
        ("RSS per hostile connection (KiB)", "rssPerHostileConnectionKiB"),
        ("hostile connections opened", "hostileOpened"),
        ("  closed silently (header deadline)", "closedSilently"),
        ("  answered 408 (body deadline)", "answered408"),
        ("  answered otherwise, by status", "answeredOther"),
        ("  reset", "reset"),
        ("  refused at the cap", "refusedAtCap"),
        ("  shed from the strangers' budget", "shedFromBudget"),
        ("  open at the end of the window", "hostileOpenAtEnd"),
    ] {
        println!("{label:<40} {:>10}", f(&r[key]));
    }
}
