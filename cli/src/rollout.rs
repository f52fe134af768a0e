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

/// `fleetctl rollout status <agent> [--watch]`.
pub async fn status(c: &Client, out: Output, agent: &str, watch: Option<Watch>) -> Result<()> {
    let path = format!("/api/v1/agents/{}/rollout", enc(agent));
    let v: RolloutView = c.get(&path).await?;
    let Some(watch) = watch else {
        show(out, &v);
        return failed(&v);
    };
    let answer = Answer::for_watch(&v, watch.revision);
    follow(c, out, &path, v, &answer, watch.timeout).await
}

/// `--watch` and what goes with it.
pub struct Watch {
    /// `--revision`: the target's revision the answer has at least.
    pub revision: Option<u64>,
    pub timeout: Duration,
}

/// Which view may answer a watch. The first views after a change in the CP may still show
/// the rollout before it (the controller reads the CP every few seconds), and that one's
/// `complete` would answer for a rollout not yet started.
enum Answer {
    /// A view whose target has this revision or a later one (`--revision`).
    Revision(u64),
    /// A view reflecting a CP read that began after this instant: the first answer's `asOf`.
    /// Both are on the controller's clock, never compared with this machine's.
    ReadAfter(i64),
    /// A controller that says neither: any view answers, as before.
    Any,
}

impl Answer {
    fn for_watch(first: &RolloutView, revision: Option<u64>) -> Answer {
        if let Some(n) = revision {
            return Answer::Revision(n);
        }
        match first.as_of.as_deref().and_then(instant_ms) {
            Some(t) => Answer::ReadAfter(t),
            None => {
                eprintln!(
                    "warning: this controller does not say which CP read its rollout view reflects (it is older \
                     than fleetctl): a change made a moment ago may not be in the answer; --revision N waits for it"
                );
                Answer::Any
            }
        }
    }

    fn given_by(&self, v: &RolloutView) -> bool {
        match *self {
            Answer::Revision(n) => v.target.revision >= n,
            Answer::ReadAfter(t) => v.cp_read_at.as_deref().and_then(instant_ms).is_some_and(|read| read > t),
            Answer::Any => true,
        }
    }

    /// The progress line while no view answers yet.
    fn waiting(&self, v: &RolloutView) -> String {
        let now = format!("it shows {} for revision {}", v.state.as_str(), v.target.revision);
        match self {
            Answer::Revision(n) => format!("{}: waiting for revision {n} ({now})", v.agent_key),
            _ => format!("{}: waiting for the controller to read the CP… ({now})", v.agent_key),
        }
    }
}

/// An RFC 3339 instant in ms.
fn instant_ms(s: &str) -> Option<i64> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

/// A progress line a second until a view that answers says the rollout ended (complete: exit
/// 0; halted or reverted: exit 1), or `timeout` passes.
async fn follow(
    c: &Client,
    out: Output,
    path: &str,
    mut v: RolloutView,
    answer: &Answer,
    timeout: Duration,
) -> Result<()> {
    let tty = std::io::stderr().is_terminal();
    let start = Instant::now();
    loop {
        let answers = answer.given_by(&v);
        let line = if answers { progress(&v) } else { answer.waiting(&v) };
        if tty {
            eprint!("\r\x1b[2K{line}");
        } else {
            eprintln!("{line}");
        }
        let end = answers && matches!(v.state, RolloutState::Complete | RolloutState::Halted | RolloutState::Reverted);
        if end || start.elapsed() > timeout {
            if tty {
                eprintln!();
            }
            return finish(out, &v, answers.then_some(end), timeout);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        v = c.get(path).await?;
    }
}

/// The watch's last word: the view that answered and its exit, or why none did in time
/// (`ended`: `None` when no view answered).
fn finish(out: Output, v: &RolloutView, ended: Option<bool>, timeout: Duration) -> Result<()> {
    let agent = &v.agent_key;
    match ended {
        None => Err(CallError(format!(
            "the controller did not show the change to {agent} in {timeout:?}: is its CP watcher reading (its log, /readyz)?"
        ))),
        Some(false) => {
            show(out, v);
            Err(CallError(format!("the rollout of {agent} did not finish in {timeout:?}")))
        }
        Some(true) => {
            show(out, v);
            failed(v)
        }
    }
}

fn show(out: Output, v: &RolloutView) {
    if out == Output::Json {
        print_json(v);
    } else {
        print_view(v);
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn view(revision: u64, cp_read_at: Option<&str>, as_of: Option<&str>) -> RolloutView {
        let mut v = json!({
            "agentKey": "coder", "state": "complete", "policyError": null, "previous": null,
            "policy": {"maxUnavailable": 1, "minReadySeconds": 0, "progressDeadlineSeconds": 600, "canary": 0,
                       "onFailure": "halt"},
            "target": {"specId": "s", "revision": revision, "image": null},
            "desiredReplicas": 1, "updatedReplicas": 1, "readyReplicas": 1, "unavailableReplicas": 0,
            "budget": 1, "failed": [], "startedAt": null, "changedAt": null, "message": null,
        });
        if let Some(t) = cp_read_at {
            v["cpReadAt"] = json!(t);
        }
        if let Some(t) = as_of {
            v["asOf"] = json!(t);
        }
        serde_json::from_value(v).unwrap()
    }

    /// Only a view reflecting a CP read begun after the first answer was built answers; with
    /// `--revision`, a view of that revision or a later one; a controller that says neither
    /// is answered by any view.
    #[test]
    fn a_watch_answers_from_a_view_that_has_the_change() {
        let first = view(1, Some("2026-12-07T18:00:00.100Z"), Some("2026-12-07T18:00:00.500Z"));
        let a = Answer::for_watch(&first, None);
        assert!(!a.given_by(&first));
        assert!(!a.given_by(&view(1, Some("2026-12-07T18:00:00.500Z"), None)), "not after: equal");
        assert!(a.given_by(&view(2, Some("2026-12-07T18:00:00.501Z"), None)));
        assert!(!a.given_by(&view(2, None, None)));
        assert!(a.waiting(&first).starts_with("coder: waiting for the controller to read the CP…"));

        let r = Answer::for_watch(&first, Some(3));
        assert!(!r.given_by(&view(2, Some("2026-12-07T18:01:00Z"), None)));
        assert!(r.given_by(&view(3, None, None)) && r.given_by(&view(4, None, None)));
        assert_eq!(r.waiting(&first), "coder: waiting for revision 3 (it shows complete for revision 1)");

        let older = view(1, None, None);
        assert!(Answer::for_watch(&older, None).given_by(&older));
    }
}
