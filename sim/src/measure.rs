//! What the simulator reads off the controller: its process's CPU time and peak RSS from
//! `/proc`, and the pass-duration histogram from its Prometheus metrics.

use anyhow::bail;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Peak resident set (VmHWM) in MiB.
pub fn peak_rss_mib(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Current resident set (VmRSS) in MiB.
pub fn rss_mib(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// This process's soft limit on open files (`Max open files` in `/proc/self/limits`);
/// `None` when unreadable or unlimited.
pub fn open_file_limit() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = s.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..].split_whitespace().next()?.parse().ok()
}

/// User + system CPU seconds used so far.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0) // USER_HZ is 100 on Linux
}

/// The value of an unlabelled sample `name` in Prometheus text.
pub fn sample(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// A cumulative Prometheus histogram: upper bound (seconds) → count.
#[derive(Debug, Clone, Default)]
pub struct Histogram {
    pub buckets: BTreeMap<u64, f64>, // bound in µs → cumulative count
    pub count: f64,
}

impl Histogram {
    pub fn parse(metrics: &str, name: &str) -> Histogram {
        let mut h = Histogram::default();
        for line in metrics.lines() {
            if let Some(rest) = line.strip_prefix(&format!("{name}_bucket{{le=\"")) {
                let (le, v) = rest.split_once("\"}").unwrap_or(("", ""));
                let bound = if le == "+Inf" { u64::MAX } else { (le.parse::<f64>().unwrap_or(0.0) * 1e6) as u64 };
                h.buckets.insert(bound, v.trim().parse().unwrap_or(0.0));
            } else if let Some(v) = line.strip_prefix(&format!("{name}_count ")) {
                h.count = v.trim().parse().unwrap_or(0.0);
            }
        }
        h
    }

    /// Observations between `earlier` and `self`.
    pub fn since(&self, earlier: &Histogram) -> Histogram {
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|(b, c)| (*b, c - earlier.buckets.get(b).copied().unwrap_or(0.0)))
                .collect(),
            count: self.count - earlier.count,
        }
    }

    /// The upper bound (ms) of the bucket holding quantile `q`: a bound, not an interpolation.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        if self.count <= 0.0 {
            return None;
        }
        let want = q * self.count;
        self.buckets.iter().find(|(_, c)| **c >= want).map(|(b, _)| {
            if *b == u64::MAX {
                f64::INFINITY
            } else {
                *b as f64 / 1000.0
            }
        })
    }
}

pub fn percentile(sorted_ms: &[f64], q: f64) -> Option<f64> {
    if sorted_ms.is_empty() {
        return None;
    }
    let i = ((q * sorted_ms.len() as f64).ceil() as usize).clamp(1, sorted_ms.len()) - 1;
    Some(sorted_ms[i])
}

/// Polls `f` every 100 ms until it holds; fails naming `what` after `limit`.
pub async fn wait_until<F: FnMut() -> bool>(limit: Duration, what: &str, mut f: F) -> anyhow::Result<Duration> {
    let t = Instant::now();
    loop {
        if f() {
            return Ok(t.elapsed());
        }
        if t.elapsed() > limit {
            bail!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = "# TYPE fleet_pass_duration_seconds histogram
fleet_pass_duration_seconds_sum 3.5
fleet_pass_duration_seconds_count 10
fleet_pass_duration_seconds_bucket{le=\"0.01\"} 2
fleet_pass_duration_seconds_bucket{le=\"0.05\"} 9
fleet_pass_duration_seconds_bucket{le=\"1.0\"} 10
fleet_pass_duration_seconds_bucket{le=\"+Inf\"} 10
";

    #[test]
    fn histogram_quantiles_are_bucket_bounds_over_a_window() {
        let h = Histogram::parse(METRICS, "fleet_pass_duration_seconds");
        assert_eq!(h.count, 10.0);
        assert_eq!(h.quantile_ms(0.2), Some(10.0));
        assert_eq!(h.quantile_ms(0.5), Some(50.0));
        assert_eq!(h.quantile_ms(0.99), Some(1000.0));
        let earlier = Histogram::parse(
            &METRICS
                .replace("} 2\n", "} 1\n")
                .replace("count 10", "count 5")
                .replace("} 9\n", "} 5\n")
                .replace("} 10\n", "} 5\n"),
            "fleet_pass_duration_seconds",
        );
        let w = h.since(&earlier);
        assert_eq!(w.count, 5.0);
        // In the window: 1 pass ≤ 10 ms, 3 more ≤ 50 ms, 1 more ≤ 1 s.
        assert_eq!(w.quantile_ms(0.5), Some(50.0));
        assert_eq!(w.quantile_ms(0.99), Some(1000.0));
        assert_eq!(Histogram::default().quantile_ms(0.5), None);
    }

    #[test]
    fn unlabelled_samples_are_read_by_exact_name() {
        let text = "fleet_joins_total{outcome=\"ok\"} 3\nfleet_connections_refused_total 7\nfleet_connections_refused_total_x 1\n";
        assert_eq!(sample(text, "fleet_connections_refused_total"), Some(7.0));
        assert_eq!(sample(text, "fleet_joins_total"), None);
    }

    #[test]
    fn percentiles_of_samples() {
        let s = [1.0, 2.0, 3.0, 4.0, 100.0];
        assert_eq!(percentile(&s, 0.5), Some(3.0));
        assert_eq!(percentile(&s, 0.99), Some(100.0));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn own_process_figures_are_read_from_proc() {
        let me = std::process::id();
        assert!(rss_mib(me).unwrap() > 0.0);
        assert!(peak_rss_mib(me).unwrap() >= rss_mib(me).unwrap() - 1.0);
        assert!(cpu_seconds(me).unwrap() >= 0.0);
        // The test process has at least its standard streams open.
        assert!(open_file_limit().unwrap() >= 3);
    }
}
