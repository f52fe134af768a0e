//! The step rule held to docs/behaviour.md#rolling-out-a-change: tables for the cases the doc
//! names, properties for its invariants.

use super::*;
use proptest::prelude::*;
use serde_json::json;

fn slot(replicas: u32, on_target: bool, ready: u32) -> Slot {
    Slot { replicas, on_target, ready, failure: None, busy: Busy::Idle, window_open: true }
}

fn run(slots: &[Slot], desired: u32, budget: u32) -> Decision {
    decide(&Input { slots, desired, budget, canary: 0, stepping: true })
}

#[test]
fn steps_go_node_by_node_within_the_budget() {
    let all_ready = [slot(1, false, 1), slot(1, false, 1), slot(1, false, 1), slot(1, false, 1)];
    assert_eq!(run(&all_ready, 4, 1), Decision::Step(vec![0]));
    assert_eq!(run(&all_ready, 4, 2), Decision::Step(vec![0, 1]));
    // One updated and not ready yet: the budget of one is spent.
    let one_up = [slot(1, true, 0), slot(1, false, 1), slot(1, false, 1), slot(1, false, 1)];
    assert_eq!(run(&one_up, 4, 1), Decision::Wait);
    let one_ready = [slot(1, true, 1), slot(1, false, 1), slot(1, false, 1), slot(1, false, 1)];
    assert_eq!(run(&one_ready, 4, 1), Decision::Step(vec![1]));
    // An old replica that is down already counts against the budget.
    let one_down = [slot(1, false, 0), slot(1, false, 1), slot(1, false, 1)];
    assert_eq!(run(&one_down, 3, 1), Decision::Wait);
    // Stepping the node whose replica is down already costs nothing: the next fits too.
    assert_eq!(run(&one_down, 3, 2), Decision::Step(vec![0, 1]));
}

#[test]
fn a_node_holding_more_than_the_budget_is_taken_alone_when_nothing_else_is_down() {
    let slots = [slot(3, false, 3), slot(1, false, 1)];
    assert_eq!(run(&slots, 4, 1), Decision::Step(vec![0]));
    let busy = [slot(1, true, 0), slot(3, false, 3)];
    assert_eq!(run(&busy, 4, 1), Decision::Wait);
}

#[test]
fn with_nothing_ready_everything_is_updated_at_once() {
    let slots = [slot(1, false, 0), slot(2, false, 0), slot(1, true, 0)];
    assert_eq!(run(&slots, 4, 1), Decision::Step(vec![0, 1]));
}

#[test]
fn the_first_failure_halts_even_a_paused_rollout() {
    let mut slots = [slot(1, true, 0), slot(1, false, 1), slot(1, true, 0)];
    slots[2].failure = Some("crashloop".into());
    slots[0].failure = Some("update_blocked: No such image: a:2".into());
    let d = decide(&Input { slots: &slots, desired: 3, budget: 5, canary: 0, stepping: false });
    assert_eq!(d, Decision::Halt { slot: 0, reason: "update_blocked: No such image: a:2".into() });
    // A failure on a replica not handed the target is not the rollout's.
    let mut old = [slot(1, false, 0), slot(1, false, 1)];
    old[0].failure = Some("crashloop".into());
    assert_eq!(run(&old, 2, 1), Decision::Wait);
}

#[test]
fn paused_takes_no_step_and_complete_needs_every_slot_ready_on_the_target() {
    let slots = [slot(1, false, 1), slot(1, false, 1)];
    assert_eq!(decide(&Input { slots: &slots, desired: 2, budget: 1, canary: 0, stepping: false }), Decision::Wait);
    assert_eq!(run(&[slot(2, true, 2), slot(1, true, 1)], 3, 1), Decision::Complete);
    assert_eq!(run(&[slot(2, true, 1), slot(1, true, 1)], 3, 1), Decision::Wait);
}

#[test]
fn a_canary_takes_whole_nodes_and_holds_until_they_are_ready() {
    let input = |slots: &[Slot]| decide(&Input { slots, desired: 5, budget: 5, canary: 2, stepping: true }).clone();
    let old = [slot(1, false, 1), slot(2, false, 2), slot(2, false, 2)];
    assert_eq!(input(&old), Decision::Step(vec![0, 1]));
    let canaries = [slot(1, true, 1), slot(2, true, 1), slot(2, false, 2)];
    assert_eq!(input(&canaries), Decision::Wait);
    let ready = [slot(1, true, 1), slot(2, true, 2), slot(2, false, 2)];
    assert_eq!(input(&ready), Decision::Step(vec![2]));
}

#[test]
fn an_invalid_policy_field_falls_back_alone_and_is_named() {
    let d = Defaults::default();
    let (p, e) = policy(None, &d);
    assert_eq!((p.max_unavailable, p.min_ready_seconds, p.progress_deadline_seconds), (d.max_unavailable, 10, 600));
    assert_eq!(e, None);
    let raw = json!({"maxUnavailable": 1, "minReadySeconds": 5, "canary": 1, "onFailure": "revert"});
    let (p, e) = policy(Some(&raw), &d);
    assert_eq!((p.max_unavailable, p.min_ready_seconds, p.canary), (MaxUnavailable::Count(1), 5, 1));
    assert_eq!((p.on_failure, e), (OnFailure::Revert, None));
    let raw = json!({"maxUnavailable": -1, "minReadySeconds": 5, "onFailure": "explode"});
    let (p, e) = policy(Some(&raw), &d);
    assert_eq!((p.max_unavailable, p.min_ready_seconds, p.on_failure), (d.max_unavailable, 5, OnFailure::Halt));
    let e = e.expect("an error");
    assert!(e.starts_with("placement.rollout.maxUnavailable: -1"), "{e}");
    let (_, e) = policy(Some(&json!({"maxUnavailable": "150%"})), &d);
    assert!(e.is_some_and(|e| e.contains("maxUnavailable")));
    let (_, e) = policy(Some(&json!("fast")), &d);
    assert!(e.is_some_and(|e| e.contains("not an object")));
}

fn busy() -> impl Strategy<Value = Busy> {
    prop_oneof![Just(Busy::Idle), Just(Busy::Holds), Just(Busy::HoldOver)]
}

/// Slots whose counts are consistent: `ready` ≤ `replicas`.
fn slots() -> impl Strategy<Value = Vec<Slot>> {
    prop::collection::vec(
        (1u32..4, any::<bool>(), 0u32..4, busy(), any::<bool>()).prop_map(
            |(replicas, on_target, ready, busy, window_open)| Slot {
                replicas,
                on_target,
                ready: ready.min(replicas),
                failure: None,
                busy,
                window_open,
            },
        ),
        1..8,
    )
}

proptest! {
    /// Fleet's own steps never take the agent past its budget: what a step makes unavailable
    /// (the ready replicas it recreates) fits beside what was down already — unless nothing
    /// was ready (nothing to protect) or one node alone holds more than the budget.
    #[test]
    fn the_budget_is_never_exceeded_by_a_step(slots in slots(), budget in 1u32..5) {
        let desired: u32 = slots.iter().map(|s| s.replicas).sum();
        let ready: u32 = slots.iter().map(|s| s.ready).sum();
        let unavailable = desired - ready;
        if let Decision::Step(steps) = run(&slots, desired, budget) {
            let alone = steps.len() == 1 && slots[steps[0]].replicas > budget;
            if ready > 0 && !alone {
                let recreated: u32 = steps.iter().map(|&i| slots[i].ready).sum();
                prop_assert!(unavailable + recreated <= budget,
                    "unavailable {unavailable} + {recreated} over budget {budget}");
                prop_assert!(steps.iter().all(|&i| !slots[i].on_target));
            }
        }
    }

    /// A rollout whose replicas all become ready completes: stepped slots come up, and within
    /// as many rounds as there are slots (plus one to see it) the decision is `Complete`.
    #[test]
    fn a_rollout_whose_replicas_become_ready_completes(mut slots in slots(), budget in 1u32..5, canary in 0u32..3) {
        for s in &mut slots { s.busy = Busy::Idle; s.window_open = true; }
        let desired: u32 = slots.iter().map(|s| s.replicas).sum();
        for _ in 0..=2 * slots.len() + 2 {
            match decide(&Input { slots: &slots, desired, budget, canary, stepping: true }) {
                Decision::Complete => return Ok(()),
                Decision::Step(steps) => for i in steps { slots[i].on_target = true; slots[i].ready = 0; },
                Decision::Wait => {}
                Decision::Halt { .. } => prop_assert!(false, "no failure was given"),
            }
            // Everything handed the target becomes ready, old replicas come back too.
            for s in &mut slots { s.ready = s.replicas; }
        }
        prop_assert!(false, "did not complete: {slots:?}");
    }

    /// A step never takes a replica whose work holds it or whose windows are closed.
    #[test]
    fn a_step_never_takes_a_held_or_closed_replica(slots in slots(), budget in 1u32..5, canary in 0u32..3) {
        let desired: u32 = slots.iter().map(|s| s.replicas).sum();
        if let Decision::Step(steps) = decide(&Input { slots: &slots, desired, budget, canary, stepping: true }) {
            for i in steps {
                prop_assert!(slots[i].busy != Busy::Holds && slots[i].window_open, "{:?}", slots[i]);
            }
        }
    }

    /// The first failure halts in the same decision, whatever else stands.
    #[test]
    fn a_failure_halts_at_once(mut slots in slots(), at in 0usize..8, budget in 1u32..5) {
        let at = at % slots.len();
        slots[at].on_target = true;
        slots[at].failure = Some("crashloop".into());
        let desired: u32 = slots.iter().map(|s| s.replicas).sum();
        let d = run(&slots, desired, budget);
        let halted = matches!(d, Decision::Halt { slot, .. } if slot <= at);
        prop_assert!(halted, "{:?}", d);
    }

    /// A template superseding the target makes every slot old again: the count restarts, and
    /// the first step is judged from zero updated.
    #[test]
    fn a_superseding_template_restarts_the_count(mut slots in slots(), budget in 1u32..5) {
        for s in &mut slots { s.on_target = false; }
        let desired: u32 = slots.iter().map(|s| s.replicas).sum();
        match run(&slots, desired, budget) {
            Decision::Complete | Decision::Halt { .. } => prop_assert!(false, "nothing is on the new target"),
            _ => {}
        }
    }

    /// One replica behaves as before progressive delivery: it is updated in the first pass,
    /// ready or not.
    #[test]
    fn one_replica_is_updated_at_once(ready in 0u32..2, budget in 1u32..5) {
        let slots = [slot(1, false, ready)];
        prop_assert_eq!(run(&slots, 1, budget), Decision::Step(vec![0]));
    }
}

/// docs/behaviour.md#busy-replicas: a step prefers idle replicas and passes over busy ones
/// within their hold; one whose hold is over goes ahead and is named.
#[test]
fn idle_replicas_go_first_and_busy_ones_wait_until_their_hold_is_over() {
    let busy = |mut s: Slot, b: Busy| {
        s.busy = b;
        s
    };
    let slots = [slot(1, false, 1), busy(slot(1, false, 1), Busy::Holds), slot(1, false, 1)];
    let run_held =
        |slots: &[Slot], budget| decide_held(&Input { slots, desired: 3, budget, canary: 0, stepping: true });
    assert_eq!(run_held(&slots, 1), (Decision::Step(vec![0]), Held { busy: vec![1], ..Held::default() }));
    let later = [slot(1, true, 1), busy(slot(1, false, 1), Busy::Holds), slot(1, false, 1)];
    assert_eq!(run_held(&later, 1).0, Decision::Step(vec![2]), "the idle one after it, not the busy one");
    let left = [slot(1, true, 1), busy(slot(1, false, 1), Busy::Holds), slot(1, true, 1)];
    assert_eq!(run_held(&left, 1), (Decision::Wait, Held { busy: vec![1], ..Held::default() }));
    let over = [slot(1, true, 1), busy(slot(1, false, 1), Busy::HoldOver), slot(1, true, 1)];
    assert_eq!(run_held(&over, 1), (Decision::Step(vec![1]), Held { expired: vec![1], ..Held::default() }));
}

/// docs/behaviour.md#maintenance-windows: a replica outside its windows takes no step, and the
/// rollout waits for one to open; a step already taken goes on.
#[test]
fn a_replica_outside_its_windows_takes_no_step() {
    let mut closed = [slot(1, false, 1), slot(1, false, 1)];
    closed.iter_mut().for_each(|s| s.window_open = false);
    let (d, held) = decide_held(&Input { slots: &closed, desired: 2, budget: 1, canary: 0, stepping: true });
    assert_eq!((d, held.window), (Decision::Wait, vec![0, 1]));
    let mut begun = [slot(1, true, 0), slot(1, false, 1)];
    begun[1].window_open = false;
    begun[0].failure = Some("crashloop".into());
    assert!(matches!(
        decide(&Input { slots: &begun, desired: 2, budget: 1, canary: 0, stepping: true }),
        Decision::Halt { .. }
    ));
}
