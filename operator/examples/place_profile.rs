//! Runs the steady placement of the benchmark's workload in a loop, for a profiler.
#[path = "../benches/placement.rs"]
#[allow(dead_code)]
mod workload;

fn main() {
    let nodes = workload::nodes(10_000);
    let demands = workload::demands(20_000, 5);
    let cold = fleet_controller::reconcile::placement::place(&demands, &nodes, &Default::default());
    let mode = std::env::args().nth(1).unwrap_or_default();
    for _ in 0..20 {
        let out = if mode == "cold" {
            fleet_controller::reconcile::placement::place(&demands, &nodes, &Default::default())
        } else {
            fleet_controller::reconcile::placement::place(&demands, &nodes, &cold.bindings)
        };
        std::hint::black_box(out);
    }
}
