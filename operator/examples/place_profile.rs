//! Runs the steady placement of the benchmark's workload in a loop, for a profiler:
//! `place_profile [steady|cold] [iterations]`. Instruction counts per placement (repeatable,
//! unlike wall times on a shared machine): run under `valgrind --tool=callgrind` with 0 and N
//! iterations and divide the difference by N (docs/performance.md).
#[path = "../benches/placement.rs"]
#[allow(dead_code)]
mod workload;

fn main() {
    let nodes = workload::nodes(10_000);
    let demands = workload::demands(20_000, 5);
    let cold = fleet_controller::reconcile::rules::placement::place(
        &demands,
        &nodes,
        &fleet_controller::reconcile::rules::placement::Bindings::new(),
    );
    let mode = std::env::args().nth(1).unwrap_or_default();
    // Iterations; callgrind runs it with 0 and N to take the set-up out of the count.
    let n: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(20);
    for _ in 0..n {
        let out = if mode == "cold" {
            fleet_controller::reconcile::rules::placement::place(
                &demands,
                &nodes,
                &fleet_controller::reconcile::rules::placement::Bindings::new(),
            )
        } else {
            fleet_controller::reconcile::rules::placement::place(&demands, &nodes, &cold.bindings)
        };
        std::hint::black_box(out);
    }
}
