//! Placement at the scale of the issues: 10,000 nodes × 100,000 replicas, cold (nothing
//! placed yet) and steady (the same inputs with last pass's bindings); and the same with the
//! placement fields of docs/behaviour.md#spread-and-priority (10 % of the agents spread over
//! the nodes' eight zones, priorities from five levels), whose cost is the difference.

use criterion::{criterion_group, criterion_main, Criterion};
use fleet_api::images::AllowList;
use fleet_api::Capacity;
use fleet_controller::reconcile::rules::placement::{place, Bindings, Demand, NodeFacts};
use std::collections::BTreeMap;
use std::time::Duration;

pub fn nodes(n: usize) -> Vec<NodeFacts> {
    (0..n)
        .map(|i| {
            let mut labels = vec![format!("zone=z{}", i % 8)];
            if i % 2 == 0 {
                labels.push("repos".into());
            }
            if i % 10 == 0 {
                labels.push("gpu=a100".into());
            }
            let mut kinds = vec!["claude-code".to_string()];
            let mut images = BTreeMap::new();
            if i % 4 == 0 {
                kinds.push("observer".into());
                images.insert("observer".to_string(), AllowList::parse(&["reg/obs/mail:1.*"]).unwrap());
            }
            NodeFacts {
                id: format!("node-{i:05}").into(),
                name: format!("worker-{i:05}").into(),
                online: i % 97 != 0,
                schedulable: true,
                draining: None,
                kinds,
                images,
                labels,
                secrets: if i % 3 == 0 { vec!["github-token".into()] } else { vec![] },
                kind_secrets: BTreeMap::new(),
                capacity: Capacity { slots: 12 + (i % 5) as u32, cpus: Some(32.0), memory_mb: Some(65536) },
            }
        })
        .collect()
}

pub fn demands(agents: usize, replicas: u32) -> Vec<Demand<'static>> {
    (0..agents)
        .map(|i| {
            let (kind, image) =
                if i % 10 == 0 { ("observer", Some("reg/obs/mail:1.4.2".to_string())) } else { ("claude-code", None) };
            Demand {
                key: format!("agent-{i:06}").into(),
                replicas,
                kind: kind.into(),
                image: image.map(Into::into),
                requires: match i % 5 {
                    0 => vec!["repos".into()],
                    1 => vec![format!("zone=z{}", i % 8).into()],
                    _ => vec![],
                }
                .into(),
                secrets: if i % 7 == 0 { vec!["github-token".into()] } else { vec![] }.into(),
                cpus: if i % 2 == 0 { Some(1.0) } else { None },
                memory_mb: if i % 3 == 0 { Some(2048) } else { None },
                spread: None,
                priority: 0,
            }
        })
        .collect()
}

/// [`demands`] with the fields: every tenth agent spread over `zone`, priorities drawn by a
/// hash of the index from five levels.
pub fn demands_with_fields(agents: usize, replicas: u32) -> Vec<Demand<'static>> {
    const LEVELS: [i32; 5] = [-100, -10, 0, 10, 100];
    let mut ds = demands(agents, replicas);
    for (i, d) in ds.iter_mut().enumerate() {
        if i % 10 == 3 {
            d.spread = Some("zone".into());
        }
        d.priority = LEVELS[(((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % 5) as usize];
    }
    ds
}

fn bench(c: &mut Criterion) {
    let nodes = nodes(10_000);
    let demands = demands(20_000, 5);
    let fielded = demands_with_fields(20_000, 5);
    let cold_fields = place(&fielded, &nodes, &Bindings::new());
    let cold = place(&demands, &nodes, &Bindings::new());
    eprintln!("placed {} replicas, {} agents waiting", cold.bindings.len(), cold.waiting.len());
    let mut g = c.benchmark_group("placement-10k-nodes-100k-replicas");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    g.bench_function("cold", |b| b.iter(|| place(&demands, &nodes, &Bindings::new())));
    g.bench_function("steady", |b| b.iter(|| place(&demands, &nodes, &cold.bindings)));
    g.bench_function("cold-spread-priority", |b| b.iter(|| place(&fielded, &nodes, &Bindings::new())));
    g.bench_function("steady-spread-priority", |b| b.iter(|| place(&fielded, &nodes, &cold_fields.bindings)));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
