//! Every rule of docs/behaviour.md#placement as a table row, and the invariants as properties.

use super::*;
use fleet_api::images::AllowList;
use proptest::prelude::*;
use std::collections::BTreeSet;

fn node(name: &str, slots: u32) -> NodeFacts {
    NodeFacts {
        id: format!("id-{name}").into(),
        name: name.into(),
        online: true,
        schedulable: true,
        draining: None,
        kinds: vec!["claude-code".into()],
        images: BTreeMap::new(),
        labels: vec![],
        secrets: vec![],
        kind_secrets: BTreeMap::new(),
        capacity: Capacity { slots, cpus: None, memory_mb: None },
    }
}

fn agent(key: &str, replicas: u32) -> Demand<'static> {
    Demand {
        key: key.into(),
        replicas,
        kind: "claude-code".into(),
        image: None,
        requires: vec![].into(),
        secrets: vec![].into(),
        cpus: None,
        memory_mb: None,
        spread: None,
        priority: 0,
    }
}

fn on(out: &Outcome, key: &str, r: u32) -> Option<String> {
    out.bindings.get(key, r).map(|n| n.to_string())
}

/// Last pass's bindings: (agent, replica, node id).
fn bound(rows: &[(&str, u32, &str)]) -> Bindings {
    rows.iter().map(|&(a, r, n)| (Id::from(a), r, Id::from(n))).collect()
}

#[test]
fn most_free_slots_then_name() {
    let nodes = [node("b", 2), node("a", 2), node("c", 3)];
    let out = place(&[agent("x", 4)], &nodes, &Bindings::new());
    // c has 3 → x0; then a,b,c tie at 2 → a; then b(2) → b; then c(2) vs a(1), b(1) → c
    assert_eq!(on(&out, "x", 0).as_deref(), Some("id-c"));
    assert_eq!(on(&out, "x", 1).as_deref(), Some("id-a"));
    assert_eq!(on(&out, "x", 2).as_deref(), Some("id-b"));
    assert_eq!(on(&out, "x", 3).as_deref(), Some("id-c"));
}

#[test]
fn new_replicas_in_key_order_after_sticky() {
    let nodes = [node("a", 1), node("b", 1)];
    let prev = bound(&[("z", 0, "id-b")]);
    let out = place(&[agent("z", 1), agent("y", 1), agent("x", 1)], &nodes, &prev);
    assert_eq!(on(&out, "z", 0).as_deref(), Some("id-b"), "sticky keeps b");
    assert_eq!(on(&out, "x", 0).as_deref(), Some("id-a"), "x before y");
    assert_eq!(out.waiting.get("y"), Some(&(1, codes::NO_CAPACITY)));
}

#[test]
fn sticky_even_when_another_node_is_emptier() {
    let nodes = [node("a", 1), node("b", 10)];
    let prev = bound(&[("x", 0, "id-a")]);
    let out = place(&[agent("x", 1)], &nodes, &prev);
    assert_eq!(on(&out, "x", 0).as_deref(), Some("id-a"));
}

#[test]
fn shrunk_node_sheds_the_last_ones() {
    let nodes = [node("a", 2), node("b", 5)];
    let prev = bound(&[("p", 0, "id-a"), ("p", 1, "id-a"), ("q", 0, "id-a")]);
    let out = place(&[agent("p", 2), agent("q", 1)], &nodes, &prev);
    assert_eq!(on(&out, "p", 0).as_deref(), Some("id-a"));
    assert_eq!(on(&out, "p", 1).as_deref(), Some("id-a"));
    assert_eq!(on(&out, "q", 0).as_deref(), Some("id-b"), "q0 was last: it moves");
}

#[test]
fn offline_moves_or_stays_unavailable() {
    let mut a = node("a", 2);
    a.online = false;
    let b = node("b", 1);
    let prev = bound(&[("x", 0, "id-a"), ("y", 0, "id-a")]);
    let out = place(&[agent("x", 1), agent("y", 1)], &[a, b], &prev);
    assert_eq!(on(&out, "x", 0).as_deref(), Some("id-b"), "moves to the fitting node");
    assert_eq!(on(&out, "y", 0).as_deref(), Some("id-a"), "nowhere to go: stays bound");
    assert!(out.stuck.contains(&(Arc::from("y"), 0)));
    assert!(!out.waiting.contains_key("y"));
}

/// docs/behaviour.md#node-lifecycle: a cordon keeps what is there and takes nothing new; a drain moves everything
/// that can go, leaves the rest blocked, and with `force` unbinds the rest instead.
#[test]
fn cordon_keeps_drain_moves_blocked_stay_and_force_unbinds() {
    let mut a = node("a", 3);
    a.schedulable = false;
    let b = node("b", 1);
    let prev = bound(&[("x", 0, "id-a"), ("y", 0, "id-a")]);
    let demands = [agent("x", 1), agent("y", 1), agent("z", 2)];
    let out = place(&demands, &[a.clone(), b.clone()], &prev);
    assert_eq!(on(&out, "x", 0).as_deref(), Some("id-a"), "cordoned: x stays");
    assert_eq!(on(&out, "y", 0).as_deref(), Some("id-a"), "cordoned: y stays");
    assert_eq!(on(&out, "z", 0).as_deref(), Some("id-b"), "new replicas avoid the cordoned node");
    assert_eq!(out.waiting.get("z"), Some(&(1, codes::NO_CAPACITY)), "a's free slots are not offered");
    assert!(out.blocked.is_empty());

    a.draining = Some(false);
    let out = place(&demands[..2], &[a.clone(), b.clone()], &prev);
    assert_eq!(on(&out, "x", 0).as_deref(), Some("id-b"), "draining: x moves to the only room");
    assert_eq!(on(&out, "y", 0).as_deref(), Some("id-a"), "y has nowhere to go: stays, blocked");
    assert_eq!(out.blocked.iter().cloned().collect::<Vec<_>>(), vec![(Arc::from("y"), 0)]);
    assert!(!out.waiting.contains_key("y"));

    a.draining = Some(true);
    let out = place(&demands[..2], &[a, b], &prev);
    assert_eq!(on(&out, "x", 0).as_deref(), Some("id-b"));
    assert_eq!(on(&out, "y", 0), None, "force: unbound");
    assert!(out.blocked.is_empty());
    assert_eq!(out.waiting.get("y"), Some(&(1, codes::NO_CAPACITY)));
}

/// docs/behaviour.md#busy-replicas: a busy replica on a draining node waits without spending
/// the budget, so an idle one moves first; it moves once it is no longer listed busy.
#[test]
fn a_drain_moves_idle_replicas_first_and_holds_a_busy_one() {
    let mut a = node("a", 4);
    a.schedulable = false;
    a.draining = Some(false);
    let b = node("b", 4);
    let prev = bound(&[("x", 0, "id-a"), ("x", 1, "id-a"), ("x", 2, "id-a")]);
    let demands = [agent("x", 3)];
    let budget = |busy: &[u32]| MoveBudget {
        left: [(Arc::from("x"), 1)].into_iter().collect(),
        ready: [0, 1, 2].iter().map(|&r| (Arc::from("x"), r)).collect(),
        busy: busy.iter().map(|&r| ((Arc::from("x"), r), 1_000)).collect(),
        ..MoveBudget::default()
    };
    let out = place_within(&demands, &[a.clone(), b.clone()], &prev, budget(&[0]));
    assert_eq!(on(&out, "x", 0).as_deref(), Some("id-a"), "busy: it stays");
    assert_eq!(on(&out, "x", 1).as_deref(), Some("id-b"), "the first idle replica takes the budget");
    assert_eq!(on(&out, "x", 2).as_deref(), Some("id-a"), "no budget left");
    assert_eq!(out.held_busy.iter().cloned().collect::<Vec<_>>(), vec![(Arc::from("x"), 0)]);
    assert_eq!(out.held.len(), 2, "held for being busy and held for the budget");

    let out = place_within(&demands, &[a.clone(), b.clone()], &out.bindings, budget(&[]));
    assert_eq!(on(&out, "x", 0).as_deref(), Some("id-b"), "idle now: it moves with the budget");
    assert!(out.held_busy.is_empty());
}

/// docs/behaviour.md#rolling-out-a-change: a drain moves a ready replica only while its
/// agent has budget left; the rest stay held on the draining node. A replica that is not
/// ready costs nothing to move, agents with no budget listed move freely, and a forced drain
/// or an offline node is not paced.
#[test]
fn a_drain_moves_ready_replicas_within_the_budget_and_holds_the_rest() {
    let mut a = node("a", 4);
    a.schedulable = false;
    a.draining = Some(false);
    let b = node("b", 4);
    let prev = bound(&[("x", 0, "id-a"), ("x", 1, "id-a"), ("x", 2, "id-a"), ("y", 0, "id-a")]);
    let demands = [agent("x", 3), agent("y", 1)];
    let budget = |left: u32, ready: &[u32]| MoveBudget {
        left: [(Arc::from("x"), left)].into_iter().collect(),
        ready: ready.iter().map(|&r| (Arc::from("x"), r)).collect(),
        ..MoveBudget::default()
    };
    let out = place_within(&demands, &[a.clone(), b.clone()], &prev, budget(1, &[0, 1, 2]));
    assert_eq!(on(&out, "x", 0).as_deref(), Some("id-b"), "the first ready replica takes the budget");
    assert_eq!(on(&out, "x", 1).as_deref(), Some("id-a"), "held");
    assert_eq!(on(&out, "x", 2).as_deref(), Some("id-a"), "held");
    assert_eq!(on(&out, "y", 0).as_deref(), Some("id-b"), "y has no budget listed: it moves");
    assert_eq!(out.held.iter().cloned().collect::<Vec<_>>(), vec![(Arc::from("x"), 1), (Arc::from("x"), 2)]);
    assert!(out.blocked.is_empty() && out.waiting.is_empty());

    let out = place_within(&demands, &[a.clone(), b.clone()], &prev, budget(0, &[0, 2]));
    assert_eq!(on(&out, "x", 1).as_deref(), Some("id-b"), "not ready: moving it costs nothing");
    assert_eq!(out.held.len(), 2, "no budget left: the ready ones stay");

    let held = place_within(&demands, &[a.clone(), b.clone()], &prev, budget(0, &[0, 1, 2]));
    let again = place_within(&demands, &[a.clone(), b.clone()], &held.bindings, budget(0, &[0, 1, 2]));
    assert_eq!(held, again, "held replicas are a fixed point while the budget is spent");

    let mut forced = a.clone();
    forced.draining = Some(true);
    let out = place_within(&demands, &[forced, b.clone()], &prev, budget(0, &[0, 1, 2]));
    assert!(out.held.is_empty(), "force ignores the budget");
    a.online = false;
    let out = place_within(&demands, &[a, b], &prev, budget(0, &[0, 1, 2]));
    assert!(out.held.is_empty(), "an offline node's replicas are unavailable already");
}

#[test]
fn every_online_node_cordoned_is_no_schedulable_node() {
    let mut a = node("a", 3);
    a.schedulable = false;
    let mut off = node("off", 3);
    off.online = false;
    let out = place(&[agent("x", 1)], &[a.clone(), off], &Bindings::new());
    assert_eq!(out.waiting.get("x"), Some(&(1, codes::NO_SCHEDULABLE_NODE)));
    // A kind no node runs is still no_executor_kind only once a schedulable node exists:
    // the first filter that empties the set gives the reason.
    let mut other = agent("other", 1);
    other.kind = "unknown".into();
    let out = place(&[other.clone()], &[a, node("b", 1)], &Bindings::new());
    assert_eq!(out.waiting.get("other"), Some(&(1, codes::NO_EXECUTOR_KIND)));
}

/// Each node's room left is published for the explanation's capacity filter.
#[test]
fn the_room_left_on_each_node_is_kept() {
    let mut a = node("a", 3);
    a.capacity.cpus = Some(2.0);
    let out = place(&[agent("x", 2)], &[a, node("b", 1)], &Bindings::new());
    let free = |id: &str| out.free_of(id).copied().unwrap();
    assert_eq!(free("id-a").slots + free("id-b").slots, 2);
    assert_eq!(free("id-a").cpus_milli, Some(2000), "x needs no cpus");
    assert_eq!(free("id-b").cpus_milli, None, "b declares none");
}

#[test]
fn lowering_replicas_drops_highest_indexes() {
    let nodes = [node("a", 5)];
    let prev = bound(&[("x", 0, "id-a"), ("x", 1, "id-a"), ("x", 2, "id-a")]);
    let out = place(&[agent("x", 1)], &nodes, &prev);
    assert_eq!(out.bindings.len(), 1);
    assert!(out.bindings.contains("x", 0));
}

#[test]
fn waiting_reasons_in_order() {
    let mut full = node("full", 0);
    full.kinds = vec!["claude-code".into(), "observer".into()];
    full.labels = vec!["repos".into(), "gpu=a100".into()];
    full.secrets = vec!["github-token".into()];
    full.images.insert("observer".into(), AllowList::parse(&["obs/mail:1.*"]).unwrap());
    let mut img = agent("img", 1);
    img.kind = "observer".into();
    img.image = Some("obs/mail:2.0".into());
    let mut kind = agent("kind", 1);
    kind.kind = "unknown".into();
    let mut label = agent("label", 1);
    label.requires = vec!["gpu=h100".into()].into();
    let mut secret = agent("secret", 1);
    secret.requires = vec!["repos".into(), "gpu".into()].into();
    secret.secrets = vec!["github-token".into(), "other".into()].into();
    let cap = agent("cap", 1);
    let out = place(&[img, kind, label, secret, cap], &[full.clone()], &Bindings::new());
    let reason = |k: &str| out.waiting.get(k).map(|w| w.1);
    assert_eq!(reason("kind"), Some(codes::NO_EXECUTOR_KIND));
    assert_eq!(reason("img"), Some(codes::IMAGE_NOT_ALLOWED));
    assert_eq!(reason("label"), Some(codes::NO_LABEL));
    assert_eq!(reason("secret"), Some(codes::NO_SECRET));
    assert_eq!(reason("cap"), Some(codes::NO_CAPACITY));

    let out = place(&[agent("x", 1)], &[], &Bindings::new());
    assert_eq!(out.waiting.get("x"), Some(&(1, codes::NO_NODE)));
    full.online = false;
    let out = place(&[agent("x", 1)], &[full], &Bindings::new());
    assert_eq!(out.waiting.get("x"), Some(&(1, codes::NO_NODE)));
}

/// docs/behaviour.md#secrets: a kind that lists its secrets is offered only those; the other
/// kinds on the same node are offered every secret it announces.
#[test]
fn secrets_are_matched_per_kind() {
    let mut n = node("n", 4);
    n.kinds = vec!["claude-code".into(), "observer".into()];
    n.secrets = vec!["github-token".into(), "mail".into()];
    n.kind_secrets.insert("observer".into(), vec!["mail".into()]);
    let wants = |key: &str, kind: &str, secret: &str| {
        let mut a = agent(key, 1);
        a.kind = kind.to_string().into();
        a.secrets = vec![secret.into()].into();
        a
    };
    let agents = [
        wants("coder", "claude-code", "github-token"),
        wants("mailer", "observer", "mail"),
        wants("thief", "observer", "github-token"),
    ];
    let out = place(&agents, &[n], &Bindings::new());
    assert_eq!(on(&out, "coder", 0).as_deref(), Some("id-n"), "a kind without a list: every secret");
    assert_eq!(on(&out, "mailer", 0).as_deref(), Some("id-n"), "its own list");
    assert_eq!(out.waiting.get("thief").map(|w| w.1), Some(codes::NO_SECRET), "outside its kind's list");
}

#[test]
fn reason_is_deepest_filter_across_nodes() {
    // One node lacks the kind, another has the kind but lacks the label: the set empties at labels.
    let mut k = node("k", 1);
    k.kinds = vec!["other".into()];
    let l = node("l", 1);
    let mut a = agent("a", 1);
    a.requires = vec!["repos".into()].into();
    let out = place(&[a], &[k, l], &Bindings::new());
    assert_eq!(out.waiting.get("a").map(|w| w.1), Some(codes::NO_LABEL));
}

#[test]
fn label_and_image_matching_admit() {
    let mut n = node("n", 2);
    n.kinds.push("observer".into());
    n.labels = vec!["gpu=a100".into()];
    n.images.insert("observer".into(), AllowList::parse(&["obs/mail:1.*"]).unwrap());
    let mut a = agent("a", 1);
    a.requires = vec!["gpu".into()].into();
    let mut o = agent("o", 1);
    o.kind = "observer".into();
    o.image = Some("obs/mail:1.4.2".into());
    let out = place(&[a, o], &[n], &Bindings::new());
    assert_eq!(out.bindings.len(), 2);
}

#[test]
fn cpus_and_memory_count_only_where_both_sides_set_them() {
    let mut n = node("n", 10);
    n.capacity.cpus = Some(4.0);
    n.capacity.memory_mb = Some(8192);
    let mut big = agent("big", 3);
    big.cpus = Some(1.5);
    let mut mem = agent("mem", 2);
    mem.memory_mb = Some(6000);
    let free = agent("free", 3);
    let out = place(&[big, mem, free], &[n.clone()], &Bindings::new());
    assert!(on(&out, "big", 1).is_some() && on(&out, "big", 2).is_none());
    assert!(on(&out, "mem", 0).is_some() && on(&out, "mem", 1).is_none());
    assert_eq!(out.waiting.get("big"), Some(&(1, codes::NO_CAPACITY)));
    assert_eq!((0..3).filter(|&r| on(&out, "free", r).is_some()).count(), 3);
    // A node that does not state cpus admits any cpu demand.
    n.capacity.cpus = None;
    let mut huge = agent("huge", 1);
    huge.cpus = Some(64.0);
    assert!(place(&[huge], &[n], &Bindings::new()).waiting.is_empty());
}

#[test]
fn waiting_agent_holds_no_slot() {
    let nodes = [node("a", 1)];
    let mut w = agent("a-wait", 2);
    w.requires = vec!["nope".into()].into();
    let out = place(&[w, agent("b", 1)], &nodes, &Bindings::new());
    assert_eq!(on(&out, "b", 0).as_deref(), Some("id-a"));
    assert_eq!(out.waiting.get("a-wait"), Some(&(2, codes::NO_LABEL)));
}

// ---- properties ----

fn arb_nodes() -> impl Strategy<Value = Vec<NodeFacts>> {
    prop::collection::vec(
        (0u32..5, any::<bool>(), prop::option::of(1u32..8), prop::option::of(256u64..4096), any::<bool>(), 0u8..3),
        0..8,
    )
    .prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (slots, online, cpus, mem, label, kind))| {
                let mut n = node(&format!("n{i:02}"), slots);
                n.online = online || i % 3 == 0;
                n.capacity.cpus = cpus.map(f64::from);
                n.capacity.memory_mb = mem;
                if label {
                    n.labels = vec!["repos".into()];
                }
                if kind == 1 {
                    n.kinds = vec!["observer".into()];
                }
                n
            })
            .collect()
    })
}

fn arb_demands() -> impl Strategy<Value = Vec<Demand<'static>>> {
    prop::collection::vec((0u32..4, any::<bool>(), prop::option::of(1u32..3), prop::option::of(128u64..1024)), 0..8)
        .prop_map(|v| {
            v.into_iter()
                .enumerate()
                .map(|(i, (replicas, label, cpus, mem))| {
                    let mut d = agent(&format!("a{i}"), replicas);
                    if label {
                        d.requires = vec!["repos".into()].into();
                    }
                    d.cpus = cpus.map(f64::from);
                    d.memory_mb = mem;
                    d
                })
                .collect()
        })
}

fn check_capacity(demands: &[Demand], nodes: &[NodeFacts], out: &Outcome) -> Result<(), TestCaseError> {
    for n in nodes {
        let on_n: Vec<&Demand> = out
            .bindings
            .iter()
            .filter(|(a, r, v)| **v == n.id && !out.stuck.contains(&((*a).clone(), *r)))
            .map(|(a, _, _)| demands.iter().find(|d| d.key == *a).unwrap())
            .collect();
        prop_assert!(on_n.len() as u32 <= n.capacity.slots, "slots exceeded on {}", n.name);
        if let Some(c) = n.capacity.cpus {
            let used: u64 = on_n.iter().filter_map(|d| d.cpus.map(milli)).sum();
            prop_assert!(used <= milli(c));
        }
        if let Some(m) = n.capacity.memory_mb {
            let used: u64 = on_n.iter().filter_map(|d| d.memory_mb).sum();
            prop_assert!(used <= m);
        }
        if !on_n.is_empty() {
            prop_assert!(n.online, "placed on offline node");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn never_exceeds_capacity(demands in arb_demands(), nodes in arb_nodes()) {
        let out = place(&demands, &nodes, &Bindings::new());
        check_capacity(&demands, &nodes, &out)?;
        // every replica is bound or counted as waiting
        for d in &demands {
            let bound = (0..d.replicas).filter(|r| out.bindings.contains(&d.key, *r)).count() as u32;
            let waiting = out.waiting.get(&d.key).map(|w| w.0).unwrap_or(0);
            prop_assert_eq!(bound + waiting, d.replicas);
        }
    }

    #[test]
    fn deterministic_and_order_independent(demands in arb_demands(), nodes in arb_nodes()) {
        let a = place(&demands, &nodes, &Bindings::new());
        let mut rd = demands.clone();
        rd.reverse();
        let mut rn = nodes.clone();
        rn.reverse();
        prop_assert_eq!(&a, &place(&rd, &rn, &Bindings::new()));
        // Given up one by one (owned requirements) or lent (borrowed): the same run.
        prop_assert_eq!(&a, &place(rd, &nodes, &Bindings::new()));
    }

    #[test]
    fn sticky_when_nothing_changes(demands in arb_demands(), nodes in arb_nodes()) {
        let first = place(&demands, &nodes, &Bindings::new());
        let second = place(&demands, &nodes, &first.bindings);
        prop_assert_eq!(&first.bindings, &second.bindings);
        // and a node going offline never moves replicas of other nodes
        if let Some(victim) = nodes.iter().position(|n| n.online) {
            let mut changed = nodes.clone();
            changed[victim].online = false;
            let third = place(&demands, &changed, &first.bindings);
            for (a, r, v) in first.bindings.iter() {
                if *v != nodes[victim].id {
                    prop_assert_eq!(third.bindings.get(a, r), Some(v));
                }
            }
            check_capacity(&demands, &changed, &third)?;
        }
    }

    #[test]
    fn waiting_reason_is_first_emptying_filter(demands in arb_demands(), nodes in arb_nodes()) {
        let out = place(&demands, &nodes, &Bindings::new());
        for (key, (_, reason)) in &out.waiting {
            let d = demands.iter().find(|d| d.key == *key).unwrap();
            let online: Vec<_> = nodes.iter().filter(|n| n.online).collect();
            let kind: Vec<_> = online.iter().filter(|n| n.kinds.iter().any(|k| *k == d.kind)).collect();
            let label: Vec<_> = kind.iter().filter(|n| labels::all_met(&d.requires, &n.labels)).collect();
            let expected = if online.is_empty() { codes::NO_NODE }
                else if kind.is_empty() { codes::NO_EXECUTOR_KIND }
                else if label.is_empty() { codes::NO_LABEL }
                else { codes::NO_CAPACITY };
            prop_assert_eq!(*reason, expected);
        }
    }
}

fn zoned(name: &str, slots: u32, zone: &str) -> NodeFacts {
    let mut n = node(name, slots);
    if !zone.is_empty() {
        n.labels = vec![format!("zone={zone}")];
    }
    n
}

fn spread(key: &str, replicas: u32, label: &str) -> Demand<'static> {
    Demand { spread: Some(Cow::Owned(label.to_string())), ..agent(key, replicas) }
}

/// docs/behaviour.md#spread-and-priority: a new replica goes to the value holding the fewest
/// of the agent's replicas, then by the seed's rule; a node without the label is the value
/// `""`. The same fleet without `spread` packs by free slots.
#[test]
fn spread_replicas_take_the_value_with_the_fewest() {
    let nodes = [zoned("a1", 9, "a"), zoned("a2", 9, "a"), zoned("b1", 2, "b"), zoned("c1", 2, "c"), zoned("x", 1, "")];
    let out = place(&[spread("s", 4, "zone")], &nodes, &Bindings::new());
    let zones: Vec<_> = (0..4).map(|r| on(&out, "s", r).unwrap()).collect();
    assert_eq!(zones, ["id-a1", "id-b1", "id-c1", "id-x"], "each value once, the emptier nodes first");
    let plain = place(&[agent("s", 4)], &nodes, &Bindings::new());
    assert_eq!(on(&plain, "s", 0).as_deref(), Some("id-a1"));
    assert_eq!(on(&plain, "s", 1).as_deref(), Some("id-a2"), "without spread: most free slots");
    let out = place(&[spread("s", 7, "zone")], &nodes, &Bindings::new());
    let mut per_zone: BTreeMap<&str, u32> = BTreeMap::new();
    for (_, _, n) in out.bindings.iter() {
        let f = nodes.iter().find(|x| x.id == *n).unwrap();
        *per_zone.entry(labels::value_of(&f.labels, "zone")).or_default() += 1;
    }
    assert_eq!(per_zone, BTreeMap::from([("", 1), ("a", 2), ("b", 2), ("c", 2)]), "x is full: the others take turns");
}

/// Sticky replicas never hop to even the counts; a replica that must move goes to the value
/// with the fewest.
#[test]
fn spread_never_moves_a_sticky_replica_and_a_moving_one_goes_to_the_fewest() {
    let mut nodes = vec![zoned("a1", 4, "a"), zoned("a2", 4, "a"), zoned("b1", 4, "b"), zoned("c1", 4, "c")];
    let prev = bound(&[("s", 0, "id-a1"), ("s", 1, "id-a2"), ("s", 2, "id-b1")]);
    let out = place(&[spread("s", 3, "zone")], &nodes, &prev);
    assert_eq!(out.bindings, prev, "two in zone a stay: no hop for spread alone");
    nodes[1].online = false;
    let out = place(&[spread("s", 3, "zone")], &nodes, &prev);
    assert_eq!(on(&out, "s", 1).as_deref(), Some("id-c1"), "a2 offline: its replica goes to zone c, the one with none");
    assert_eq!((on(&out, "s", 0).as_deref(), on(&out, "s", 2).as_deref()), (Some("id-a1"), Some("id-b1")));
}

/// What the plain implementations share: each node's room, a demand's static fit and need.
mod plain {
    use super::*;

    pub fn rooms(nodes: &[NodeFacts]) -> Vec<Room> {
        nodes
            .iter()
            .map(|n| Room { slots: n.capacity.slots, cpus: n.capacity.cpus.map(milli), mem: n.capacity.memory_mb })
            .collect()
    }

    pub fn fits_static(d: &Demand, n: &NodeFacts) -> bool {
        n.online
            && n.kinds.iter().any(|k| *k == d.kind)
            && labels::all_met(&d.requires, &n.labels)
            && d.secrets.iter().all(|s| n.secrets.iter().any(|o| **o == **s))
    }

    pub fn need(d: &Demand) -> Need {
        Need { cpus: d.cpus.map(milli), mem: d.memory_mb }
    }
}

/// The seed's placement written the plain way (every node looked at for every replica), for
/// agents with neither `spread` nor `priority`: sticky replicas in key order where they still
/// fit, then new ones to the most free slots (ties by name), stuck on an offline node when
/// nowhere fits.
fn seed_rules(demands: &[Demand], nodes: &[NodeFacts], previous: &Bindings) -> Bindings {
    let mut ds: Vec<&Demand> = demands.iter().collect();
    ds.sort_by(|a, b| a.key.cmp(&b.key));
    let mut room = plain::rooms(nodes);
    let (fits_static, need) = (plain::fits_static, plain::need);
    let mut out: Vec<(Id, u32, Id)> = Vec::new();
    let mut unbound = Vec::new();
    for d in &ds {
        for r in 0..d.replicas {
            let prev = previous.get(&d.key, r).and_then(|id| nodes.iter().position(|n| n.id == *id));
            match prev {
                Some(i) if fits_static(d, &nodes[i]) && room[i].fits(&need(d)) => {
                    room[i].take(&need(d));
                    out.push((d.key.clone(), r, nodes[i].id.clone()));
                }
                _ => unbound.push((*d, r, prev)),
            }
        }
    }
    for (d, r, prev) in unbound {
        let best = (0..nodes.len())
            .filter(|&i| fits_static(d, &nodes[i]) && room[i].fits(&need(d)))
            .max_by(|&a, &b| room[a].slots.cmp(&room[b].slots).then(nodes[b].name.cmp(&nodes[a].name)));
        match (best, prev) {
            (Some(i), _) => {
                room[i].take(&need(d));
                out.push((d.key.clone(), r, nodes[i].id.clone()));
            }
            (None, Some(i)) if !nodes[i].online => out.push((d.key.clone(), r, nodes[i].id.clone())),
            _ => {}
        }
    }
    out.into_iter().collect()
}

fn arb_zoned_nodes() -> impl Strategy<Value = Vec<NodeFacts>> {
    prop::collection::vec((1u32..4, 0usize..4, any::<bool>()), 1..12).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (slots, zone, online))| {
                let mut n = zoned(&format!("n{i:02}"), slots, ["", "a", "b", "c"][zone]);
                n.online = online || i % 4 == 0;
                n
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Without `spread` (and `priority`) placement is the seed's: from scratch, and again after
    /// nodes went offline.
    #[test]
    fn without_the_fields_placement_is_the_seeds(demands in arb_demands(), nodes in arb_nodes(), down in 0usize..8) {
        let first = place(&demands, &nodes, &Bindings::new());
        prop_assert_eq!(&first.bindings, &seed_rules(&demands, &nodes, &Bindings::new()));
        let mut changed = nodes.clone();
        if let Some(n) = changed.get_mut(down) {
            n.online = false;
        }
        let second = place(&demands, &changed, &first.bindings);
        prop_assert_eq!(&second.bindings, &seed_rules(&demands, &changed, &first.bindings));
    }

    /// With `spread`, placed from scratch: an agent's counts per value differ by more than one
    /// only where the value with fewer has no fitting node with room left (room only falls
    /// while placing, so it had none when the other value got its extra replica).
    #[test]
    fn spread_counts_differ_by_at_most_one_where_room_allows(
        replicas in prop::collection::vec(0u32..7, 1..5),
        nodes in arb_zoned_nodes(),
    ) {
        let demands: Vec<Demand> = replicas.iter().enumerate().map(|(i, &n)| spread(&format!("s{i}"), n, "zone")).collect();
        let out = place(&demands, &nodes, &Bindings::new());
        check_capacity(&demands, &nodes, &out)?;
        let value = |id: &Id| labels::value_of(&nodes.iter().find(|n| n.id == *id).unwrap().labels, "zone").to_string();
        let has_room = |v: &str| {
            nodes.iter().any(|n| n.online && labels::value_of(&n.labels, "zone") == v && out.free_of(&n.id).is_none_or(|f| f.slots > 0))
        };
        let values: BTreeSet<String> = nodes.iter().filter(|n| n.online).map(|n| labels::value_of(&n.labels, "zone").to_string()).collect();
        for d in &demands {
            let mut counts: BTreeMap<String, u32> = values.iter().map(|v| (v.clone(), 0)).collect();
            for (_, node) in out.bindings.of_agent(&d.key) {
                *counts.entry(value(node)).or_default() += 1;
            }
            for (u, cu) in &counts {
                for (v, cv) in &counts {
                    if *cu > cv + 1 {
                        prop_assert!(!has_room(v), "{}: {u}={cu} but {v}={cv} with room left in {v}: {counts:?}", d.key);
                    }
                }
            }
        }
    }
}

// ---- priority and preemption ----

fn prio(key: &str, replicas: u32, priority: i32) -> Demand<'static> {
    Demand { priority, ..agent(key, replicas) }
}

#[test]
fn higher_priorities_are_placed_first_and_sticky_first() {
    let nodes = [node("a", 1), node("b", 1)];
    // From scratch: z (priority 5) before x and y (0), whatever the keys say.
    let out = place(&[prio("x", 1, 0), prio("y", 1, 0), prio("z", 1, 5)], &nodes, &Bindings::new());
    assert_eq!(on(&out, "z", 0).as_deref(), Some("id-a"));
    assert_eq!(on(&out, "x", 0).as_deref(), Some("id-b"));
    assert_eq!(out.waiting.get("y"), Some(&(1, codes::NO_CAPACITY)), "equal priorities never preempt");
    assert!(out.preemptions.is_empty());
    // A node shrinks: the sticky replica of higher priority keeps its place.
    let shrunk = [node("a", 1)];
    let prev = bound(&[("p", 0, "id-a"), ("q", 0, "id-a")]);
    let out = place(&[prio("p", 1, 0), prio("q", 1, 1)], &shrunk, &prev);
    assert_eq!(on(&out, "q", 0).as_deref(), Some("id-a"));
    assert_eq!(out.waiting.get("p"), Some(&(1, codes::NO_CAPACITY)), "sticky, but after the higher one");
}

#[test]
fn a_full_fleet_gives_the_lowest_priorities_room_for_a_higher_one() {
    let nodes = [node("a", 2), node("b", 2), node("c", 2)];
    let prev = bound(&[
        ("low", 0, "id-a"),
        ("mid", 0, "id-a"),
        ("mid", 1, "id-b"),
        ("mid", 2, "id-b"),
        ("peer", 0, "id-c"),
        ("peer", 1, "id-c"),
    ]);
    let demands = [prio("low", 1, -5), prio("mid", 3, 0), prio("peer", 2, 10), prio("high", 2, 10)];
    let out = place(&demands, &nodes, &prev);
    // high 0: a needs one victim (low, -5), b one (mid, 0), c only equals: a, whose victim is lowest.
    assert_eq!(on(&out, "high", 0).as_deref(), Some("id-a"));
    // high 1: a has mid (0) left, b mid (0): one victim each, equal priorities: by name, a.
    assert_eq!(on(&out, "high", 1).as_deref(), Some("id-a"));
    assert_eq!(out.bindings.of_agent("peer").count(), 2, "an equal priority is never touched");
    assert_eq!(on(&out, "low", 0), None);
    assert_eq!(on(&out, "mid", 0), None);
    assert_eq!((on(&out, "mid", 1).as_deref(), on(&out, "mid", 2).as_deref()), (Some("id-b"), Some("id-b")));
    assert_eq!(out.waiting.get("low"), Some(&(1, codes::PREEMPTED)));
    assert_eq!(out.waiting.get("mid"), Some(&(1, codes::PREEMPTED)));
    let who: Vec<_> = out.preemptions.iter().map(|p| (&*p.victim.0, p.victim.1, &*p.node, &*p.by.0, p.by.1)).collect();
    assert_eq!(who, vec![("low", 0, "id-a", "high", 0), ("mid", 0, "id-a", "high", 1)]);
    check_capacity(&demands, &nodes, &out).unwrap();

    // The next run keeps them waiting as preempted: nothing moves, nothing more is taken.
    let again = place(&demands, &nodes, &out);
    assert_eq!(again.bindings, out.bindings);
    assert!(again.preemptions.is_empty());
    assert_eq!(again.waiting.get("low"), Some(&(1, codes::PREEMPTED)));
    assert_eq!(again.preempted, out.preempted);

    // Fewer high replicas: the room comes back to the preempted ones, by priority.
    let fewer = [prio("low", 1, -5), prio("mid", 3, 0), prio("peer", 2, 10), prio("high", 1, 10)];
    let back = place(&fewer, &nodes, &again);
    assert_eq!(on(&back, "mid", 0).as_deref(), Some("id-a"), "mid (0) before low (-5)");
    assert_eq!(back.waiting.get("low"), Some(&(1, codes::PREEMPTED)));
    let all = place(&[prio("low", 1, -5), prio("mid", 3, 0), prio("peer", 2, 10)], &nodes, &back);
    assert_eq!(on(&all, "low", 0).as_deref(), Some("id-a"));
    assert!(all.preempted.is_empty() && all.waiting.is_empty());
}

#[test]
fn preemption_takes_the_node_needing_the_fewest_and_only_when_room_is_all_that_is_missing() {
    let mut a = node("a", 3);
    a.capacity.cpus = Some(2.0);
    let mut b = node("b", 3);
    b.capacity.cpus = Some(2.0);
    let small = |k: &str| Demand { cpus: Some(1.0), ..prio(k, 1, 0) };
    let big = Demand { cpus: Some(2.0), ..prio("big", 1, 0) };
    let prev = bound(&[("s1", 0, "id-a"), ("s2", 0, "id-a"), ("big", 0, "id-b")]);
    let high = Demand { cpus: Some(2.0), ..prio("high", 1, 1) };
    let demands = [small("s1"), small("s2"), big, high];
    let out = place(&demands, &[a, b], &prev);
    assert_eq!(on(&out, "high", 0).as_deref(), Some("id-b"), "one victim on b beats two on a");
    assert_eq!(out.preemptions.len(), 1);
    assert_eq!(out.bindings.of_agent("s1").count() + out.bindings.of_agent("s2").count(), 2);

    // A high replica no node fits statically (a label) takes nothing.
    let nodes = [node("a", 1)];
    let prev = bound(&[("low", 0, "id-a")]);
    let picky = Demand { requires: vec!["gpu".into()].into(), ..prio("picky", 1, 100) };
    let out = place(&[prio("low", 1, 0), picky], &nodes, &prev);
    assert_eq!(on(&out, "low", 0).as_deref(), Some("id-a"));
    assert_eq!(out.waiting.get("picky"), Some(&(1, codes::NO_LABEL)));
    assert!(out.preemptions.is_empty());
}

#[test]
fn at_most_a_hundred_replicas_are_preempted_per_run() {
    let nodes: Vec<NodeFacts> = (0..150).map(|i| node(&format!("n{i:03}"), 1)).collect();
    let rows: Vec<(String, u32, String)> = (0..150).map(|i| ("low".to_string(), i, format!("id-n{i:03}"))).collect();
    let prev: Bindings = rows.iter().map(|(a, r, n)| (Id::from(a.as_str()), *r, Id::from(n.as_str()))).collect();
    let demands = [prio("low", 150, 0), prio("high", 150, 1)];
    let first = place(&demands, &nodes, &prev);
    assert_eq!(first.preemptions.len(), MAX_PREEMPTIONS);
    assert_eq!(first.bindings.of_agent("high").count(), 100);
    assert_eq!(first.waiting.get("high"), Some(&(50, codes::NO_CAPACITY)));
    assert_eq!(first.waiting.get("low"), Some(&(100, codes::PREEMPTED)));
    let second = place(&demands, &nodes, &first);
    assert_eq!(second.preemptions.len(), 50);
    assert_eq!(second.bindings.of_agent("high").count(), 150);
    assert_eq!(second.waiting.get("low"), Some(&(150, codes::PREEMPTED)));
    check_capacity(&demands, &nodes, &second).unwrap();
}

/// Placement (docs/behaviour.md#placement) with priority (docs/behaviour.md#spread-and-priority) written the plain way: sticky replicas in placement order
/// (priority, highest first, then key), then new ones in that order to the most free slots;
/// one short only of room unbinds, on the fitting node needing the fewest, the strictly lower
/// replicas there (lowest priority, then largest, then last key and index first; ties between
/// nodes: the victims' priorities, highest compared first, then name); else stuck on an
/// offline node. Returns the bindings and the preemptions as (victim, by).
fn plain_rules(demands: &[Demand], nodes: &[NodeFacts], previous: &Bindings) -> (Bindings, usize) {
    let mut ds: Vec<&Demand> = demands.iter().collect();
    ds.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.key.cmp(&b.key)));
    let mut room = plain::rooms(nodes);
    let (fits_static, need) = (plain::fits_static, plain::need);
    // (demand, replica, node index)
    let mut out: Vec<(&Demand, u32, usize)> = Vec::new();
    let mut unbound = Vec::new();
    for d in &ds {
        for r in 0..d.replicas {
            let prev = previous.get(&d.key, r).and_then(|id| nodes.iter().position(|n| n.id == *id));
            match prev {
                Some(i) if fits_static(d, &nodes[i]) && room[i].fits(&need(d)) => {
                    room[i].take(&need(d));
                    out.push((d, r, i));
                }
                _ => unbound.push((*d, r, prev)),
            }
        }
    }
    let mut preempted = 0;
    for (d, r, prev) in unbound {
        let best = (0..nodes.len())
            .filter(|&i| fits_static(d, &nodes[i]) && room[i].fits(&need(d)))
            .max_by(|&a, &b| room[a].slots.cmp(&room[b].slots).then(nodes[b].name.cmp(&nodes[a].name)));
        if let Some(i) = best {
            room[i].take(&need(d));
            out.push((d, r, i));
            continue;
        }
        type Choice<'n> = ((usize, Vec<i32>, &'n str), usize, Vec<(Arc<str>, u32)>);
        let mut choice: Option<Choice> = None;
        for i in (0..nodes.len()).filter(|&i| fits_static(d, &nodes[i])) {
            let Some(victims) = plain_victims(d, i, &out, &room[i]) else { continue };
            let mut ps: Vec<i32> = victims.iter().map(|v| v.2).collect();
            ps.sort_by(|a, b| b.cmp(a));
            let rank = (victims.len(), ps, &*nodes[i].name);
            if choice.as_ref().is_none_or(|c| rank < c.0) {
                choice = Some((rank, i, victims.into_iter().map(|v| (v.0, v.1)).collect()));
            }
        }
        match (choice, prev) {
            (Some((_, i, victims)), _)
                if preempted + victims.len() <= MAX_PREEMPTIONS && preempted < MAX_PREEMPTIONS =>
            {
                for (k, vr) in &victims {
                    let at = out.iter().position(|(v, x, _)| v.key == *k && x == vr).unwrap();
                    let (v, _, _) = out.remove(at);
                    room[i].give(&need(v));
                }
                preempted += victims.len();
                room[i].take(&need(d));
                out.push((d, r, i));
            }
            (_, Some(i)) if !nodes[i].online => out.push((d, r, i)),
            _ => {}
        }
    }
    (out.into_iter().map(|(d, r, i)| (d.key.clone(), r, nodes[i].id.clone())).collect(), preempted)
}

/// The strictly lower replicas on node `i` that, taken lowest first, make room there for
/// `d`; `None` when there are none or they are not enough.
fn plain_victims(
    d: &Demand,
    i: usize,
    out: &[(&Demand, u32, usize)],
    room: &Room,
) -> Option<Vec<(Arc<str>, u32, i32)>> {
    let need = plain::need;
    let mut below: Vec<&(&Demand, u32, usize)> =
        out.iter().filter(|(v, _, at)| *at == i && v.priority < d.priority).collect();
    below.sort_by(|(x, xr, _), (y, yr, _)| {
        (x.priority, Reverse(need(x).cpus.unwrap_or(0)), Reverse(need(x).mem.unwrap_or(0)), Reverse((&x.key, xr))).cmp(
            &(y.priority, Reverse(need(y).cpus.unwrap_or(0)), Reverse(need(y).mem.unwrap_or(0)), Reverse((&y.key, yr))),
        )
    });
    let mut left = Room { slots: room.slots, cpus: room.cpus, mem: room.mem };
    let mut victims = Vec::new();
    for (v, vr, _) in below {
        if left.fits(&need(d)) {
            break;
        }
        left.give(&need(v));
        victims.push((v.key.clone(), *vr, v.priority));
    }
    (!victims.is_empty() && left.fits(&need(d))).then_some(victims)
}

fn arb_prioritised() -> impl Strategy<Value = Vec<Demand<'static>>> {
    (arb_demands(), prop::collection::vec(-2i32..3, 8)).prop_map(|(mut ds, ps)| {
        for (d, p) in ds.iter_mut().zip(ps) {
            d.priority = p;
        }
        ds
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// With priorities, placement is the plain rules': from scratch, again (a fixed point
    /// unless the first run preempted), and after nodes went offline. No run exceeds
    /// capacity, and every preemption takes from a strictly lower priority.
    #[test]
    fn with_priorities_placement_is_the_plain_rules(demands in arb_prioritised(), nodes in arb_nodes(), down in 0usize..8) {
        let first = place(&demands, &nodes, &Bindings::new());
        let (expected, taken) = plain_rules(&demands, &nodes, &Bindings::new());
        prop_assert_eq!(&first.bindings, &expected);
        prop_assert_eq!(first.preemptions.len(), taken);
        check_capacity(&demands, &nodes, &first)?;
        let mut changed = nodes.clone();
        if let Some(n) = changed.get_mut(down) {
            n.online = false;
        }
        let second = place(&demands, &changed, &first);
        let (expected, taken) = plain_rules(&demands, &changed, &first.bindings);
        prop_assert_eq!(&second.bindings, &expected);
        prop_assert_eq!(second.preemptions.len(), taken);
        check_capacity(&demands, &changed, &second)?;
        let priority = |k: &str| demands.iter().find(|d| *d.key == *k).unwrap().priority;
        for p in first.preemptions.iter().chain(&second.preemptions) {
            prop_assert!(priority(&p.by.0) > priority(&p.victim.0), "{p:?}");
        }
        // Without faults, once a run preempts nothing the next changes nothing.
        let mut settled = place(&demands, &nodes, &first);
        for _ in 0..4 {
            if settled.preemptions.is_empty() { break; }
            settled = place(&demands, &nodes, &settled);
        }
        prop_assert!(settled.preemptions.is_empty());
        prop_assert_eq!(&place(&demands, &nodes, &settled), &settled);
    }
}

#[test]
fn room_a_preemption_leaves_over_is_taken_before_anything_else_goes() {
    let mut a = node("a", 3);
    a.capacity.cpus = Some(4.0);
    let b = node("b", 1);
    let l = Demand { cpus: Some(2.0), ..prio("l", 2, 0) };
    let h = Demand { cpus: Some(1.0), ..prio("h", 2, 5) };
    let prev = bound(&[("l", 0, "id-a"), ("l", 1, "id-a"), ("m", 0, "id-b")]);
    let demands = [l, prio("m", 1, 0), h];
    let out = place(&demands, &[a.clone(), b.clone()], &prev);
    assert_eq!((on(&out, "h", 0).as_deref(), on(&out, "h", 1).as_deref()), (Some("id-a"), Some("id-a")));
    assert_eq!(out.preemptions.len(), 1, "one of l's replicas made room for both: {:?}", out.preemptions);
    assert_eq!(on(&out, "m", 0).as_deref(), Some("id-b"), "m was not needed");
    assert_eq!(plain_rules(&demands, &[a, b], &prev).1, 1);
}

#[test]
fn a_spread_agent_preempts_in_the_value_with_the_fewest() {
    let nodes = [zoned("a1", 1, "a"), zoned("a2", 1, "a"), zoned("b1", 1, "b"), zoned("b2", 1, "b")];
    let prev = bound(&[("f", 0, "id-a1"), ("f", 1, "id-a2"), ("f", 2, "id-b1"), ("f", 3, "id-b2")]);
    let s = Demand { priority: 5, ..spread("s", 2, "zone") };
    let out = place(&[prio("f", 4, 0), s], &nodes, &prev);
    let zones: BTreeSet<Option<String>> = [on(&out, "s", 0), on(&out, "s", 1)].into_iter().collect();
    assert_eq!(zones, BTreeSet::from([Some("id-a1".to_string()), Some("id-b1".to_string())]), "one per zone");
    assert_eq!(out.preemptions.len(), 2);
}

/// docs/behaviour.md#busy-replicas: of equal victims, a preemption takes an idle replica, on
/// the same node or another, before a busy one.
#[test]
fn a_preemption_takes_an_idle_victim_before_a_busy_one() {
    let nodes = [node("a", 1), node("b", 1)];
    let prev = bound(&[("low1", 0, "id-a"), ("low2", 0, "id-b")]);
    let demands = [prio("low1", 1, 0), prio("low2", 1, 0), prio("high", 1, 10)];
    let busy = |k: &str| MoveBudget { busy_anywhere: vec![(Arc::from(k), 0)], ..MoveBudget::default() };
    let out = place_within(&demands, &nodes, &prev, busy("low1"));
    assert_eq!(on(&out, "high", 0).as_deref(), Some("id-b"), "low1 on a is busy: low2 on b goes");
    assert_eq!(on(&out, "low1", 0).as_deref(), Some("id-a"));
    let out = place_within(&demands, &nodes, &prev, busy("low2"));
    assert_eq!(on(&out, "high", 0).as_deref(), Some("id-a"), "low2 on b is busy: low1 on a goes");
}
