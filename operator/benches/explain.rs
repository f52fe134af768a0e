//! The placement explanation (docs/behaviour.md#why-an-agent-is-where-it-is) at 10,000 nodes and 20,000 agents × 5 replicas:
//! computed on request from the registry and the last outcome, it must answer within a few
//! milliseconds. A waiting agent (a label no node has), a placed one, and `?nodes=true`.

use criterion::{criterion_group, criterion_main, Criterion};
use fleet_api::Capacity;
use fleet_controller::model::Agent;
use fleet_controller::reconcile::rules::derive::{demand, facts_of};
use fleet_controller::reconcile::rules::explain::explain;
use fleet_controller::reconcile::rules::placement::place;
use fleet_controller::store::{NodeInfo, NodeRec, State};
use std::sync::Arc;
use std::time::Duration;

const OFFLINE: Duration = Duration::from_secs(60);

fn node(i: usize, now: i64) -> NodeRec {
    let mut labels = vec![format!("zone=z{}", i % 8)];
    if i.is_multiple_of(2) {
        labels.push("repos".into());
    }
    NodeRec {
        id: format!("node-{i:05}").into(),
        name: format!("worker-{i:05}").into(),
        token_hash: [0; 32],
        public_key: [0; 32],
        joined_ms: 0,
        last_seen_ms: if i.is_multiple_of(97) { 0 } else { now },
        info: NodeInfo {
            labels,
            executor_kinds: vec!["claude-code".into()],
            capacity: Capacity { slots: 12, cpus: Some(32.0), memory_mb: Some(65536) },
            secrets: if i.is_multiple_of(3) { vec!["github-token".into()] } else { vec![] },
            ..Default::default()
        },
        allow: Default::default(),
        allowed: None,
        lifecycle: Default::default(),
        reported: true,
    }
}

fn agent(i: usize) -> Agent {
    let requires: Vec<String> = match i {
        0 => vec!["gpu".into()],
        _ if i % 5 == 1 => vec![format!("zone=z{}", i % 8)],
        _ => vec![],
    };
    serde_json::from_value(serde_json::json!({"key": format!("agent-{i:06}"), "revision": 1, "state": "running",
        "identity": {"kind": "agent"}, "executor": {"kind": "claude-code", "image": null},
        "placement": {"replicas": 5, "requires": requires, "secrets": []}}))
    .unwrap()
}

fn fleet(nodes: usize, agents: usize) -> State {
    let now = fleet_controller::clock::now_ms();
    let recs: Vec<NodeRec> = (0..nodes).map(|i| node(i, now)).collect();
    let agents: Vec<Agent> = (0..agents).map(agent).collect();
    let facts: Vec<_> = recs.iter().map(|n| facts_of(n, n.online(now, OFFLINE))).collect();
    let demands: Vec<_> = agents.iter().filter_map(demand).collect();
    let st = State::default().with_outcome(Arc::new(place(
        &demands,
        &facts,
        &fleet_controller::reconcile::rules::placement::Bindings::new(),
    )));
    recs.into_iter().fold(st, State::with_node).with_agents(Arc::new(agents))
}

fn bench(c: &mut Criterion) {
    let st = fleet(10_000, 20_000);
    let now = fleet_controller::clock::now_ms();
    let waiting = explain(&st, "agent-000000", now, OFFLINE, false).unwrap();
    assert_eq!(waiting.reason.map(|r| r.code), Some("no_label".into()));
    let mut g = c.benchmark_group("explain_10k_nodes");
    g.sample_size(50);
    g.bench_function("waiting_agent", |b| b.iter(|| explain(&st, "agent-000000", now, OFFLINE, false)));
    g.bench_function("placed_agent", |b| b.iter(|| explain(&st, "agent-000002", now, OFFLINE, false)));
    g.bench_function("placed_agent_with_nodes", |b| b.iter(|| explain(&st, "agent-000002", now, OFFLINE, true)));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
