//! Where an agent's replicas stand, replica by replica, for the step rule: the template each
//! was handed, whether it is ready, and whether an updated one failed
//! (docs/behaviour.md#rolling-out-a-change). The rollout's steps follow the bindings here: a
//! replica the agent no longer has there is dropped, a replica new there is added on the
//! template a new replica gets.

use crate::model::{Agent, Id, SpecId};
use crate::reconcile::pass::memo::Memo;
use crate::reconcile::rules::placement::Outcome;
use crate::reconcile::rules::rollout::Slot;
use crate::store::records::rollout::{step_count, step_replica};
use crate::store::{NodeStep, Rollout, Seen, State};
use fleet_api::codes::refusal;
use fleet_api::ReplicaState;
use std::sync::Arc;

pub struct Gathered {
    /// One a replica, in node-name order, then by replica.
    pub slots: Vec<Slot>,
    /// Nodes found running the target they were not handed (a step the store lost): taken
    /// as stepped, so their bodies are built again with it.
    pub adopted: Vec<Id>,
    /// Each slot's node and replica.
    pub who: Vec<(Id, u32)>,
    /// What each slot of an older template waits for, when it waits.
    pub waits: Vec<Wait>,
    /// When the next readiness or deadline runs out (ms).
    pub due: Option<i64>,
}

/// What the slots are read from.
pub struct Sources<'a> {
    pub a: &'a Agent,
    pub memo: &'a Memo,
    pub st: &'a State,
    pub outcome: &'a Outcome,
    /// The replicas a move left on their old nodes, still running there: they keep their
    /// template, (node, replica).
    pub lingering: &'a [(&'a Id, u32)],
    pub now: i64,
}

pub fn gather(one: &Sources, r: &mut Rollout) -> Gathered {
    let key = &one.a.key;
    let desired = one.a.desired_replicas();
    let mut bound: Vec<(&str, &Id, u32)> = one
        .outcome
        .bindings
        .of_agent(key)
        .take_while(|(rep, _)| *rep < desired)
        .map(|(rep, node)| (one.memo.name(node), node, rep))
        .collect();
    sync_steps(r, &bound, one.lingering, one.now);
    bound.sort();
    let mut g = Gathered { slots: Vec::new(), adopted: Vec::new(), who: Vec::new(), waits: Vec::new(), due: None };
    // A store older than the fleet lost the steps taken since its time: a replica that runs
    // the target already is taken as stepped, never handed the old template back
    // (docs/behaviour.md#a-store-older-than-the-fleet).
    let adopt = one.st.catch_up().is_some() && r.state == fleet_api::rollout::RolloutState::Progressing;
    let timing = Timing {
        now: one.now,
        min_ready: i64::from(r.policy.min_ready_seconds) * 1000,
        deadline: i64::from(r.policy.progress_deadline_seconds) * 1000,
        max_busy: i64::from(r.policy.max_busy_seconds) * 1000,
    };
    let agent_windows = crate::reconcile::rules::rollout::windows_of(one.a.rollout().as_ref()).unwrap_or_default();
    let target = r.target.id();
    for (_, node, rep) in bound {
        let online = one.memo.node(node).is_some_and(|f| f.online);
        let report = one.st.node(node).and_then(|n| n.info.replica(key, rep));
        let i = r.find(node, rep).expect("synced above");
        // Worked on apart, and written back only when it moved: the list stays shared.
        let mut step = r.nodes[i].clone();
        if adopt && step.on != target && runs(report, target) {
            step.on = target;
            step.stepped_ms = one.now;
            g.adopted.push(node.clone());
        }
        let (slot, wait) = if step.on == target {
            (updated_slot(&mut step, report, online, target, &timing, &mut g.due), Wait::default())
        } else {
            let busy_until = one.st.busy_until_ms(node, key, rep, one.now);
            let windows = [&agent_windows[..], one.st.node_windows(node)];
            old_slot(report, online, &mut step, busy_until, windows, &timing)
        };
        g.waits.push(wait);
        if step != r.nodes[i] {
            Arc::make_mut(&mut r.nodes)[i] = step;
        }
        g.slots.push(slot);
        g.who.push((node.clone(), rep));
    }
    g
}

/// The clock a readiness, a deadline and a busy replica's hold are judged by.
struct Timing {
    now: i64,
    min_ready: i64,
    deadline: i64,
    max_busy: i64,
}

/// What a replica of an older template waits for (docs/behaviour.md#busy-replicas): its work
/// until `busy_until` (or the hold's end, `hold_ends`, if sooner), and a window until `opens`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wait {
    pub busy_until: Option<i64>,
    pub hold_ends: i64,
    pub opens: Option<i64>,
}

/// The rollout's steps as the bindings stand: a replica new to a node is handed what a new
/// replica gets (the target, or while halted the last template that completed). A replica a
/// move left on its old node keeps its step there until it is let go: what it runs must not
/// change under it. A step stored for a whole node becomes one for each replica there.
fn sync_steps(r: &mut Rollout, bound: &[(&str, &Id, u32)], lingering: &[(&Id, u32)], now: i64) {
    let bound_to = |s: &NodeStep| bound.iter().any(|(_, n, rep)| **n == s.node && step_replica(*rep) == s.replica);
    let lingers = |s: &NodeStep| lingering.iter().any(|(n, rep)| **n == s.node && step_replica(*rep) == s.replica);
    let missing = |(_, n, rep): &&(&str, &Id, u32)| r.find(n, *rep).is_err();
    if r.nodes.iter().all(|s| bound_to(s) || lingers(s)) && !bound.iter().any(|b| missing(&b)) {
        return;
    }
    // The list is a shared slice: built again, which the bindings of an agent under a
    // rollout seldom call for.
    let added: Vec<NodeStep> = bound
        .iter()
        .filter(missing)
        .map(|(_, node, rep)| match r.step(node, *rep) {
            Some(whole) => NodeStep { replica: step_replica(*rep), ..whole.clone() },
            None => NodeStep::new((*node).clone(), *rep, r.for_new().id(), now),
        })
        .collect();
    let mut steps: Vec<NodeStep> = r.nodes.iter().filter(|s| bound_to(s) || lingers(s)).cloned().chain(added).collect();
    steps.sort_by(|a, b| (&a.node, a.replica).cmp(&(&b.node, b.replica)));
    r.nodes = steps.into();
}

/// Whether the replica reports running `target` (an older node, which reports no template,
/// never counts).
fn runs(report: Option<&Seen>, target: SpecId) -> bool {
    report.is_some_and(|p| p.state == ReplicaState::Running && p.spec == target.0 && p.spec != 0)
}

/// A replica on a template older than the target: ready while running on an online node;
/// busy while its lease says so (its step's hold counted from when a step first waited for
/// it: `ready_since_ms` of an old template's step); in a window while the agent's and its
/// node's both are open.
fn old_slot(
    report: Option<&Seen>,
    online: bool,
    step: &mut NodeStep,
    busy_until: Option<i64>,
    windows: [&[fleet_api::windows::Window]; 2],
    t: &Timing,
) -> (Slot, Wait) {
    use crate::reconcile::rules::rollout::Busy;
    let running = report.is_some_and(|p| p.state == ReplicaState::Running);
    if busy_until.is_none() {
        step.ready_since_ms = 0;
    }
    let since = if step.ready_since_ms > 0 { step.ready_since_ms } else { t.now };
    let hold_ends = since + t.max_busy;
    let busy = match busy_until {
        None => Busy::Idle,
        Some(_) if t.now >= hold_ends => Busy::HoldOver,
        Some(_) => Busy::Holds,
    };
    let opens = crate::reconcile::rules::rollout::closed_until(windows, t.now);
    let slot = Slot {
        replicas: 1,
        on_target: false,
        ready: u32::from(online && running),
        failure: None,
        busy,
        window_open: opens.is_none(),
    };
    (slot, Wait { busy_until, hold_ends, opens })
}

/// A replica handed the target: ready once it has run it `min_ready` without a restart;
/// failed when it crash-loops on it, is refused or blocked, or the deadline passes.
fn updated_slot(
    step: &mut NodeStep,
    report: Option<&Seen>,
    online: bool,
    target: SpecId,
    t: &Timing,
    due: &mut Option<i64>,
) -> Slot {
    let on_it = |p: &Seen| p.spec == target.0 || p.spec == 0;
    let failure = report.and_then(|p| failure_of(p, on_it(p)));
    let running = online && report.is_some_and(|p| p.state == ReplicaState::Running && on_it(p) && !is_blocked(p));
    let restarts = step_count(report.map_or(0, |p| p.restarts as usize));
    if !running {
        step.ready_since_ms = 0;
    } else if step.ready_since_ms == 0 || restarts > step.restarts {
        step.ready_since_ms = t.now;
        step.restarts = restarts;
    }
    let ready = step.ready_since_ms > 0 && t.now - step.ready_since_ms >= t.min_ready;
    let mut soonest = |at: i64| *due = Some(due.map_or(at, |d: i64| d.min(at)));
    let failure = failure.or_else(|| {
        let late = !ready && step.stepped_ms > 0 && t.now - step.stepped_ms > t.deadline;
        late.then(|| format!("not ready within progressDeadlineSeconds ({} s)", t.deadline / 1000))
    });
    if !ready && failure.is_none() {
        if step.ready_since_ms > 0 {
            soonest(step.ready_since_ms + t.min_ready);
        }
        if step.stepped_ms > 0 {
            soonest(step.stepped_ms + t.deadline + 1);
        }
    }
    let busy = crate::reconcile::rules::rollout::Busy::Idle;
    Slot { replicas: 1, on_target: true, ready: u32::from(ready), failure, busy, window_open: true }
}

fn is_blocked(p: &Seen) -> bool {
    p.message.as_deref().is_some_and(|m| refusal::code_of(m) == Some(refusal::UPDATE_BLOCKED))
}

/// Why a replica handed the target failed, if it did.
fn failure_of(p: &Seen, on_target: bool) -> Option<String> {
    let message = p.message.as_deref();
    if is_blocked(p) {
        return message.map(str::to_string);
    }
    match p.state {
        ReplicaState::Crashloop if on_target => {
            Some(format!("crashloop ({})", message.unwrap_or("exited with a failure")))
        }
        // A refusal, or a create that failed (`start failed: No such image: …`).
        ReplicaState::Stopped | ReplicaState::Starting => {
            message.filter(|m| refusal::code_of(m).is_some()).map(str::to_string)
        }
        _ => None,
    }
}
