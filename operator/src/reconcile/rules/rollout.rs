//! The step rule of a rollout (docs/behaviour.md#rolling-out-a-change): from where an
//! agent's replicas stand — replica by replica, which template each runs, whether it is ready,
//! busy or in a closed maintenance window, which failed — to what happens this pass: nothing,
//! a halt, the end, or the replicas that get the new template now, idle ones first, and those
//! that wait (busy, or outside their windows). Pure: the pass gathers the slots, this
//! decides, the pass applies.

pub use fleet_api::rollout::RolloutDefaults as Defaults;
use fleet_api::rollout::{MaxUnavailable, OnFailure, RolloutPolicy};
use serde_json::Value;

/// One replica of an agent (`replicas` 1; the rule reads any count).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub replicas: u32,
    /// Handed the rollout's target template.
    pub on_target: bool,
    /// Replicas ready now (running long enough on the template they were handed).
    pub ready: u32,
    /// On the target and failed: crash-looping, refused, blocked or past its deadline.
    pub failure: Option<String>,
    /// Whether a step of it waits for its work (docs/behaviour.md#busy-replicas).
    pub busy: Busy,
    /// Whether a step may start now under the agent's and its node's maintenance windows.
    pub window_open: bool,
}

/// A replica's work, as a step of it sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Busy {
    Idle,
    /// Busy, and within the agent's hold: a step waits.
    Holds,
    /// Busy past the agent's hold (`maxBusySeconds`): a step goes ahead and says so.
    HoldOver,
}

/// The old replicas a step passed over this pass, and those taken though busy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    /// Busy within the hold: waiting for their work.
    pub busy: Vec<usize>,
    /// Outside a maintenance window: waiting for one to open.
    pub window: Vec<usize>,
    /// Taken although busy: the hold is over.
    pub expired: Vec<usize>,
}

/// An agent's rollout as the step rule sees it. `slots` are in node-name order.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    pub slots: &'a [Slot],
    pub desired: u32,
    pub budget: u32,
    pub canary: u32,
    /// Steps may be taken (not paused, halted or reverted).
    pub stepping: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Every slot runs the target and is ready.
    Complete,
    /// An updated slot failed: no further step (the first failure, by slot order).
    Halt {
        slot: usize,
        reason: String,
    },
    /// These slots get the target now.
    Step(Vec<usize>),
    Wait,
}

pub fn decide(input: &Input) -> Decision {
    decide_held(input).0
}

/// The decision, and which old replicas it passed over or took though busy.
pub fn decide_held(input: &Input) -> (Decision, Held) {
    let slots = input.slots;
    let none = Held::default();
    if let Some((i, reason)) =
        slots.iter().enumerate().find_map(|(i, s)| s.on_target.then_some(s.failure.as_ref()?).map(|r| (i, r.clone())))
    {
        return (Decision::Halt { slot: i, reason }, none);
    }
    if slots.iter().all(|s| s.on_target && s.ready >= s.replicas) {
        return (Decision::Complete, none);
    }
    if !input.stepping {
        return (Decision::Wait, none);
    }
    let (old, held) = candidates(slots);
    let ready: u32 = slots.iter().map(|s| s.ready).sum();
    // No replica ready: there is nothing to protect, and waiting would only hold the old
    // template on replicas that do not run either.
    if ready == 0 {
        return (steps_or_wait(old), held);
    }
    if let Some(d) = canary(input, &old) {
        return (d, held);
    }
    (steps_or_wait(within_budget(input, &old)), held)
}

/// The old replicas a step may take now, idle ones first (then those whose hold is over), each
/// in slot order; and those it passes over.
fn candidates(slots: &[Slot]) -> (Vec<usize>, Held) {
    let mut held = Held::default();
    let mut idle = Vec::new();
    for (i, s) in slots.iter().enumerate().filter(|(_, s)| !s.on_target) {
        match (s.window_open, s.busy) {
            (false, _) => held.window.push(i),
            (true, Busy::Holds) => held.busy.push(i),
            (true, Busy::HoldOver) => held.expired.push(i),
            (true, Busy::Idle) => idle.push(i),
        }
    }
    idle.extend(held.expired.iter().copied());
    (idle, held)
}

/// As many of `old`, in order, as the budget allows; a replica down already costs nothing. A
/// node holding more than the budget is taken alone when nothing else is down.
fn within_budget(input: &Input, old: &[usize]) -> Vec<usize> {
    let ready: u32 = input.slots.iter().map(|s| s.ready).sum();
    let mut unavailable = input.desired.saturating_sub(ready);
    let mut steps = Vec::new();
    for &i in old {
        let s = &input.slots[i];
        if unavailable + s.replicas <= input.budget {
            steps.push(i);
            unavailable += s.ready;
        } else {
            if steps.is_empty() && unavailable == 0 && s.replicas > input.budget {
                steps.push(i);
            }
            break;
        }
    }
    steps
}

fn steps_or_wait(steps: Vec<usize>) -> Decision {
    if steps.is_empty() {
        Decision::Wait
    } else {
        Decision::Step(steps)
    }
}

/// The canary phase: the first step takes replicas (of `old`, in its order) until it holds
/// `canary` of them, and nothing more moves until all of them are ready. `None` once past it
/// (or without one).
fn canary(input: &Input, old: &[usize]) -> Option<Decision> {
    if input.canary == 0 {
        return None;
    }
    let slots = input.slots;
    // How many whole nodes, in order, the canary takes.
    let mut cover = 0;
    let mut taken = 0;
    for s in slots {
        if taken >= input.canary {
            break;
        }
        cover += 1;
        taken += s.replicas;
    }
    let updated = slots.iter().filter(|s| s.on_target).count();
    if updated == 0 {
        return Some(steps_or_wait(old.iter().copied().take(cover).collect()));
    }
    let all_ready = slots.iter().filter(|s| s.on_target).all(|s| s.ready >= s.replicas);
    (updated <= cover && !all_ready).then_some(Decision::Wait)
}

/// The policy's `progressDeadlineSeconds` in ms: how long a step, a drain's move or a PAT
/// rotation is waited for.
pub fn progress_deadline_ms(raw: Option<&Value>, d: &Defaults) -> i64 {
    policy(raw, d).0.progress_deadline_seconds as i64 * 1000
}

/// How long a voluntary disruption waits for a busy replica of the agent (ms).
pub fn max_busy_ms(raw: Option<&Value>, d: &Defaults) -> i64 {
    i64::from(policy(raw, d).0.max_busy_seconds) * 1000
}

/// When the last closed of these window lists opens, while any is closed: a disruption
/// starts only when every one is open (no window named: always open).
pub fn closed_until(lists: [&[fleet_api::windows::Window]; 2], now_ms: i64) -> Option<i64> {
    use fleet_api::windows::{openness, Openness};
    let opens = lists.iter().filter_map(|w| match openness(w, now_ms) {
        Openness::Closed { opens_ms } => Some(opens_ms),
        Openness::Open { .. } => None,
    });
    opens.max()
}

/// The policy of `placement.rollout`, each field its default where absent or invalid; and the
/// first invalid field, named with what was wrong (`policyError`).
pub fn policy(raw: Option<&Value>, d: &Defaults) -> (RolloutPolicy, Option<String>) {
    let mut p = RolloutPolicy {
        max_unavailable: d.max_unavailable,
        min_ready_seconds: d.min_ready_seconds,
        progress_deadline_seconds: d.progress_deadline_seconds,
        canary: 0,
        on_failure: OnFailure::Halt,
        max_busy_seconds: d.max_busy_seconds,
    };
    let Some(raw) = raw else { return (p, None) };
    let Some(obj) = raw.as_object() else {
        return (p, Some(format!("placement.rollout: {raw} is not an object; the defaults apply")));
    };
    let mut error = None;
    let mut bad = |field: &str, v: &Value, want: &str| {
        error.get_or_insert_with(|| format!("placement.rollout.{field}: {v} is not {want}; its default applies"));
    };
    if let Some(v) = obj.get("maxUnavailable") {
        match MaxUnavailable::parse(v) {
            Some(m) => p.max_unavailable = m,
            None => bad("maxUnavailable", v, "an integer ≥ 0 or a percentage up to 100%"),
        }
    }
    let seconds = |v: &Value| v.as_u64().filter(|s| *s <= 86_400 * 7).map(|s| s as u32);
    if let Some(v) = obj.get("minReadySeconds") {
        match seconds(v) {
            Some(s) => p.min_ready_seconds = s,
            None => bad("minReadySeconds", v, "a number of seconds from 0 to 604800"),
        }
    }
    if let Some(v) = obj.get("progressDeadlineSeconds") {
        match seconds(v).filter(|s| *s > 0) {
            Some(s) => p.progress_deadline_seconds = s,
            None => bad("progressDeadlineSeconds", v, "a number of seconds from 1 to 604800"),
        }
    }
    if let Some(v) = obj.get("canary") {
        match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) => p.canary = n,
            None => bad("canary", v, "an integer ≥ 0"),
        }
    }
    if let Some(v) = obj.get("maxBusySeconds") {
        let cap = fleet_api::rollout::MAX_BUSY_SECONDS;
        match v.as_u64().filter(|s| *s <= u64::from(cap)) {
            Some(s) => p.max_busy_seconds = s as u32,
            None => bad("maxBusySeconds", v, &format!("a number of seconds from 0 to {cap}")),
        }
    }
    if let Some(v) = obj.get("onFailure") {
        match v.as_str() {
            Some("halt") => p.on_failure = OnFailure::Halt,
            Some("revert") => p.on_failure = OnFailure::Revert,
            _ => bad("onFailure", v, "\"halt\" or \"revert\""),
        }
    }
    if let Err(e) = windows_of(Some(raw)) {
        error.get_or_insert_with(|| format!("{e}; no window applies"));
    }
    (p, error)
}

#[cfg(test)]
mod tests;

/// The agent's maintenance windows (`placement.rollout.windows`; docs/behaviour.md#maintenance-windows):
/// none named, or named wrongly (the view's `policyError` says so), is none — always open.
pub fn windows_of(raw: Option<&Value>) -> Result<Vec<fleet_api::windows::Window>, String> {
    let Some(v) = raw.and_then(|r| r.get("windows")) else { return Ok(Vec::new()) };
    let field = "placement.rollout.windows";
    let list: Vec<fleet_api::windows::MaintenanceWindow> =
        serde_json::from_value(v.clone()).map_err(|e| format!("{field}: {e}"))?;
    fleet_api::windows::parse_all(&list, field)
}
