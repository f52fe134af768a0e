//! The fault suite (docs/behaviour.md#high-availability, "Proven under faults"): three real
//! controller processes on a PostgreSQL this test starts, a few hundred simulated nodes behind
//! a Service, admin writes (join keys, cordon, uncordon, drain) and CP changes (replicas,
//! images) streaming in, while faults drawn from a seed hit: `kill -9` of the leader or of a
//! follower (started again after a while), `SIGSTOP` of the leader for 5–30 s, a PostgreSQL
//! restart, a replica cut from PostgreSQL by a proxy. After every fault the fleet must converge
//! within 60 s; at the end a checker prints what no fault may cause, each of which must be 0.
//!
//! `FLEET_CHAOS_SECONDS` (120), `FLEET_CHAOS_SEED` (41), `FLEET_CHAOS_NODES` (200) set the run;
//! docs/performance.md records a long one.

#[path = "../support/mod.rs"]
mod support;

mod check;
mod load;
mod world;

use load::{admin_writes, cp_changes, Flow};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use world::{Run, World, GRACE_SECONDS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_drawn_from_a_seed_lose_nothing_and_the_fleet_converges_after_each() {
    if !fleet_devkit::postgres::usable("the fault suite") {
        return;
    }
    let run = Run::from_env();
    eprintln!("fault suite: seed {}, {} s of faults, {} nodes, 3 replicas", run.seed, run.seconds, run.nodes);
    let mut world = World::start(&run).await;
    // Writes and changes stream while a fault is dealt and undone, and pause while the suite
    // waits for the fleet to settle: convergence is to a standing target.
    let flow = Flow::default();
    let writes =
        tokio::spawn(admin_writes(world.service.url(), world.token.clone(), world.ops_nodes(), run.seed, flow.clone()));
    let changes = tokio::spawn(cp_changes(world.dk.clone(), world.wanted.clone(), run.seed, flow.clone()));

    let mut rng = StdRng::seed_from_u64(run.seed);
    let mut faults = Vec::new();
    let started = Instant::now();
    world.converge(Duration::from_secs(120)).await.expect("the fleet converges before any fault");
    while started.elapsed() < Duration::from_secs(run.seconds) {
        flow.quiet.store(false, Ordering::SeqCst);
        let fault = world.inject(&mut rng).await;
        flow.quiet.store(true, Ordering::SeqCst);
        let converged = world.converge(Duration::from_secs(60)).await;
        let leader = fault.leader.as_deref().unwrap_or("none");
        let at = time::OffsetDateTime::from(fault.at).format(&time::format_description::well_known::Rfc3339).unwrap();
        let elapsed = started.elapsed().as_secs_f64();
        eprintln!("{elapsed:>6.1} s  {} at {at} (leader {leader}) → converged {converged:?}", fault.kind);
        faults.push((fault, converged));
        tokio::time::sleep(Duration::from_millis(rng.gen_range(2_000..8_000))).await;
    }
    flow.stop.store(true, Ordering::SeqCst);
    let written = writes.await.unwrap();
    changes.await.unwrap();
    world.converge(Duration::from_secs(60)).await.expect("the fleet converges after the last fault");
    // Revocations of the PATs of moved replicas wait for their grace.
    tokio::time::sleep(Duration::from_secs(GRACE_SECONDS + 5)).await;

    let report = world.check(&faults, &written).await;
    eprintln!("{report}");
    if !report.clean() {
        eprintln!("the replicas' logs are kept in {}", world.keep_logs().display());
    }
    assert!(report.clean(), "an invariant was broken: {report}");
}
