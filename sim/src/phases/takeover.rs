//! Takeover at scale (docs/behaviour.md#high-availability): `--takeover-kills N` with
//! `--controllers` ≥ 2, after cold convergence. N times, at steady state: `SIGKILL` of the
//! leader and, at that moment, a new agent in the CP; timed from the kill until another
//! replica leads (`fleet_leader 1`), until it has finished a pass, and until a node holds the
//! new agent. Then the killed replica starts again on its ports and data directory, and its
//! nodes (those that joined or long-poll there) reconnect to it. Also counted: the CP writes
//! (statuses, and statuses with identities) the CP received in the 10 s after each kill —
//! the killed leader sends none, so they are the new leader's, the new agent's among them.

use crate::args::Args;
use crate::controller::{Database, Replicas};
use crate::measure::{percentile, Histogram};
use crate::node::Shared;
use fleet_devkit::Devkit;
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// What the phase needs that [`super::Sim`] lends only for reading: the replicas to kill and
/// start again.
pub struct Ctl<'a> {
    pub args: &'a Args,
    pub dk: &'a Devkit,
    pub http: &'a reqwest::Client,
    pub replicas: &'a mut Replicas,
    pub dir: &'a Path,
    pub database: &'a Database,
    pub shared: &'a Shared,
}

/// Milliseconds from each kill, sorted when done.
#[derive(Default)]
struct Times {
    leads: Vec<f64>,
    first_pass: Vec<f64>,
    agent_on_a_node: Vec<f64>,
    /// CP status writes, and all CP writes, within 10 s of each kill.
    status_writes: Vec<f64>,
    cp_writes: Vec<f64>,
}

/// The CP writes counted after a kill.
const WRITES_WITHIN: Duration = Duration::from_secs(10);

/// (status writes, all writes) the devkit CP has answered so far.
fn cp_writes(dk: &Devkit) -> (u64, u64) {
    let status = dk.calls("put_status");
    (status, status + dk.calls("put_identity"))
}

/// The kills, one after another, each after a quiet 10 s.
pub async fn measure(c: &mut Ctl<'_>) -> anyhow::Result<Value> {
    let mut t = Times::default();
    for k in 0..c.args.takeover_kills {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let before = cp_writes(c.dk);
        let t0 = Instant::now();
        let (lead, pass, reached) = one_kill(c, k).await?;
        tokio::time::sleep(WRITES_WITHIN.saturating_sub(t0.elapsed())).await;
        let after = cp_writes(c.dk);
        t.status_writes.push((after.0 - before.0) as f64);
        t.cp_writes.push((after.1 - before.1) as f64);
        eprintln!(
            "fleet-sim: kill {}/{}: a new leader after {lead:.0} ms, its first pass after {pass:.0} ms, the new agent on a node after {reached:.0} ms, {} CP status writes ({} CP writes) within 10 s",
            k + 1,
            c.args.takeover_kills,
            after.0 - before.0,
            after.1 - before.1,
        );
        t.leads.push(lead);
        t.first_pass.push(pass);
        t.agent_on_a_node.push(reached);
    }
    for v in [&mut t.leads, &mut t.first_pass, &mut t.agent_on_a_node, &mut t.status_writes, &mut t.cp_writes] {
        v.sort_by(f64::total_cmp);
    }
    let q = |v: &[f64]| json!({"p50": percentile(v, 0.5), "p99": percentile(v, 0.99), "max": v.last()});
    Ok(json!({
        "nodes": c.args.nodes, "agents": c.args.agents, "replicas": c.args.total_replicas(),
        "controllers": c.args.controllers, "kills": c.args.takeover_kills,
        "newLeaderMs": q(&t.leads), "firstPassMs": q(&t.first_pass), "agentOnANodeMs": q(&t.agent_on_a_node),
        "cpStatusWritesWithin10s": q(&t.status_writes), "cpWritesWithin10s": q(&t.cp_writes),
    }))
}

/// One kill: (new leader, its first pass, the new agent on a node), ms since the kill.
async fn one_kill(c: &mut Ctl<'_>, k: u32) -> anyhow::Result<(f64, f64, f64)> {
    let old = c.replicas.leader_index();
    let urls: Vec<String> = c.replicas.all.iter().map(|r| r.metrics_url.clone()).collect();
    let passes_before: Vec<f64> = futures::future::join_all(urls.iter().map(|u| scrape(c.http, u)))
        .await
        .into_iter()
        .map(|m| m.map_or(0.0, |m| m.1))
        .collect();
    let key = format!("agent-{:05}", c.args.agents + k as usize);
    let t0 = Instant::now();
    c.replicas.kill(old)?;
    c.dk.put_agent(fleet_devkit::state::synthetic_agent(c.args.agents + k as usize, 1));
    let ms = || t0.elapsed().as_secs_f64() * 1000.0;
    let (mut lead, mut pass) = (None, None);
    while pass.is_none() {
        anyhow::ensure!(t0.elapsed() < Duration::from_secs(120), "no replica led and passed within 120 s of kill {k}");
        for (i, url) in urls.iter().enumerate().filter(|(i, _)| *i != old) {
            let Some((leads, count)) = scrape(c.http, url).await else { continue };
            if leads {
                lead.get_or_insert_with(ms);
                c.replicas.set_leader(i);
                if count > passes_before[i] {
                    pass = Some(ms());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.replicas.restart(old, c.args, c.dk, c.dir, c.database)?;
    let reached = loop {
        if let Some(at) = c.shared.received.lock().get(&(key.clone(), 1)) {
            break at.saturating_duration_since(t0).as_secs_f64() * 1000.0;
        }
        anyhow::ensure!(t0.elapsed() < Duration::from_secs(120), "{key} reached no node within 120 s of kill {k}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    Ok((lead.unwrap_or_default(), pass.unwrap_or_default(), reached))
}

/// Whether replica `r` leads, and how many passes it has finished.
async fn scrape(http: &reqwest::Client, metrics_url: &str) -> Option<(bool, f64)> {
    let resp = http.get(metrics_url).timeout(Duration::from_millis(500)).send().await.ok()?;
    let text = resp.text().await.ok()?;
    let leads = text.lines().any(|l| l == "fleet_leader 1");
    Some((leads, Histogram::parse(&text, "fleet_pass_duration_seconds").count))
}

/// The phase's table.
pub fn print_table(r: &Value) {
    println!("{:<48}{:>10}{:>10}{:>10}", "from the leader's SIGKILL to", "p50 ms", "p99 ms", "max ms");
    for (label, key) in [
        ("another replica leads", "newLeaderMs"),
        ("it has finished a pass", "firstPassMs"),
        ("a node holds the agent added at the kill", "agentOnANodeMs"),
    ] {
        let f = |q: &str| r[key][q].as_f64().map_or("-".into(), |v| format!("{v:.0}"));
        println!("{label:<48}{:>10}{:>10}{:>10}", f("p50"), f("p99"), f("max"));
    }
    println!("{:<48}{:>10}{:>10}{:>10}", "within 10 s of the SIGKILL, CP writes", "p50", "p99", "max");
    for (label, key) in
        [("status writes", "cpStatusWritesWithin10s"), ("status and identity writes", "cpWritesWithin10s")]
    {
        let f = |q: &str| r[key][q].as_f64().map_or("-".into(), |v| format!("{v:.0}"));
        println!("{label:<48}{:>10}{:>10}{:>10}", f("p50"), f("p99"), f("max"));
    }
}
