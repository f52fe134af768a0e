//! `fleetctl rollout …` and `fleetctl rollouts` (docs/behaviour.md#rolling-out-a-change).

use crate::client::{CallError, Client};
use crate::commands::{enc, print_json, Result};
use crate::table::{or_dash, Table};
use crate::Output;
use fleet_api::{List, RolloutState, RolloutView};
use serde_json::json;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// One line of progress: `coder: progressing 2/4 updated, 1/4 ready, 1 unavailable (budget 1)`.
pub fn progress(v: &RolloutView) -> String {
    let d = v.desired_replicas;
    let mut line = format!(
        "{}: {} {}/{d} updated, {}/{d} ready, {} unavailable (budget {}), target {} ({})",
        v.agent_key,
        v.state.as_str(),
        v.updated_replicas,
        v.ready_replicas,
        v.unavailable_replicas,
        v.budget,
        v.target.spec_id,
        v.target.image.as_deref().unwrap_or("the kind's image"),
    );
    if let Some(f) = v.failed.first() {
        line.push_str(&format!("; replica {} on {} failed: {}", f.replica, f.node, f.reason));
    }
    line
}

fn print_view(v: &RolloutView) {
    println!("{}", progress(v));
    if let Some(p) = &v.previous {
        println!("previous: {} ({})", p.spec_id, p.image.as_deref().unwrap_or("the kind's image"));
    }
    if let Some(e) = &v.policy_error {
        println!("policy: {e}");
    }
    if let Some(m) = &v.message {
        println!("{m}");
    }
}

/// `fleetctl rollout status <agent> [--watch]`: with `--watch`, a progress line until the
/// rollout completes (exit 0) or halts or reverts (exit 1), or `timeout` passes.
pub async fn status(c: &Client, out: Output, agent: &str, watch: bool, timeout: Duration) -> Result<()> {
    let path = format!("/api/v1/agents/{}/rollout", enc(agent));
    let mut v: RolloutView = c.get(&path).await?;
    if !watch {
        if out == Output::Json {
            print_json(&v);
        } else {
            print_view(&v);
        }
        return failed(&v);
    }
    let tty = std::io::stderr().is_terminal();
    let start = Instant::now();
    loop {
        if tty {
            eprint!("\r\x1b[2K{}", progress(&v));
        } else {
            eprintln!("{}", progress(&v));
        }
        let end = matches!(v.state, RolloutState::Complete | RolloutState::Halted | RolloutState::Reverted);
        if end || start.elapsed() > timeout {
            if tty {
                eprintln!();
            }
            if out == Output::Json {
                print_json(&v);
            } else {
                print_view(&v);
            }
            if !end {
                return Err(CallError(format!("the rollout of {agent} did not finish in {timeout:?}")));
            }
            return failed(&v);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        v = c.get(&path).await?;
    }
}

/// Exit 1 for a rollout that stopped on a failure.
fn failed(v: &RolloutView) -> Result<()> {
    match v.state {
        RolloutState::Halted | RolloutState::Reverted => Err(CallError(format!(
            "the rollout of {} is {}: fix the cause, then `fleetctl rollout resume {0}` or `fleetctl rollout undo {0}`",
            v.agent_key,
            v.state.as_str()
        ))),
        _ => Ok(()),
    }
}

/// `fleetctl rollout pause|resume|undo|restart <agent>`.
pub async fn action(c: &Client, out: Output, agent: &str, action: &str) -> Result<()> {
    let v: RolloutView = c.post(&format!("/api/v1/agents/{}/rollout:{action}", enc(agent)), json!({})).await?;
    if out == Output::Json {
        print_json(&v);
    } else {
        println!("rollout of {agent}: {action} applied");
        print_view(&v);
    }
    Ok(())
}

/// `fleetctl rollouts`: every rollout not complete.
pub async fn list(c: &Client, out: Output) -> Result<()> {
    let l: List<RolloutView> = c.get("/api/v1/rollouts").await?;
    if out == Output::Json {
        print_json(&l);
        return Ok(());
    }
    if l.items.is_empty() {
        println!("no rollout in progress");
        return Ok(());
    }
    let mut t = Table::new(&["AGENT", "STATE", "UPDATED", "READY", "UNAVAILABLE", "BUDGET", "TARGET", "FAILED"]);
    for v in &l.items {
        let d = v.desired_replicas;
        t.row(vec![
            v.agent_key.clone(),
            v.state.as_str().into(),
            format!("{}/{d}", v.updated_replicas),
            format!("{}/{d}", v.ready_replicas),
            v.unavailable_replicas.to_string(),
            v.budget.to_string(),
            or_dash(v.target.image.as_ref()),
            or_dash(v.failed.first().map(|f| format!("{} on {}: {}", f.replica, f.node, f.reason))),
        ]);
    }
    print!("{}", t.render());
    Ok(())
}
