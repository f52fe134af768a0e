//! Joins and reports per second through the store on this machine's disk: what SQLite's
//! durability setting costs (docs/performance.md, "Durability"). Sequential joins (each one
//! transaction that marks its key used and creates the node), joins from 16 tasks at once,
//! and report flushes (all nodes reported, then one flush, as every second in the controller):
//! `cargo run --release --example store_rate -p fleet-controller [joins] [nodes] [rounds]`.

use base64::Engine;
use fleet_api::{Capacity, Health, JoinRequest, ObservedReport};
use fleet_controller::store::{Id, Store};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn request(key: String, name: String) -> JoinRequest {
    JoinRequest {
        join_key: key,
        name,
        public_key: base64::engine::general_purpose::STANDARD.encode(fleet_api::seal::generate_keypair().1),
        labels: vec!["repos".into()],
        executor_kinds: vec!["k".into()],
        executor_images: Default::default(),
        capacity: Capacity { slots: 4, cpus: None, memory_mb: None },
        secrets: vec![],
        executor_secrets: Default::default(),
        version: "0.1.0".into(),
        maintenance_windows: Vec::new(),
    }
}

fn report(seq: u64) -> ObservedReport {
    ObservedReport {
        applied_generation: 1,
        health: Health::Ok,
        labels: vec!["repos".into()],
        executor_kinds: vec!["k".into()],
        executor_images: Default::default(),
        capacity: Capacity { slots: 4, cpus: None, memory_mb: None },
        secrets: vec![],
        executor_secrets: Default::default(),
        replicas: vec![],
        version: "0.1.0".into(),
        boot_id: Some("b".into()),
        seq: Some(seq),
        observe_seconds: Some(20),
        maintenance_windows: Vec::new(),
    }
}

async fn keys(store: &Store, n: usize) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(store.issue_join_key(Duration::from_secs(3600), "", &Default::default()).await?.0);
    }
    Ok(out)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let joins: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(500);
    let rounds: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(20);
    let dir = tempfile::tempdir_in(std::env::current_dir()?)?;
    let store = Arc::new(Store::open(&format!("sqlite://{}/fleet.sqlite", dir.path().display())).await?);

    let ks = keys(&store, joins).await?;
    let t = Instant::now();
    let mut ids: Vec<Id> = Vec::new();
    for (i, k) in ks.into_iter().enumerate() {
        ids.push(store.join(&request(k, format!("seq-{i}"))).await?.node_id.into());
    }
    println!("sequential joins: {:.0}/s", joins as f64 / t.elapsed().as_secs_f64());

    let ks = keys(&store, joins).await?;
    let t = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (w, chunk) in ks.chunks(joins.div_ceil(16)).map(<[String]>::to_vec).enumerate() {
        let store = store.clone();
        tasks.spawn(async move {
            for (i, k) in chunk.into_iter().enumerate() {
                store.join(&request(k, format!("par-{w}-{i}"))).await.map(|r| r.node_id).unwrap();
            }
        });
    }
    tasks.join_all().await;
    println!("joins from 16 tasks: {:.0}/s", joins as f64 / t.elapsed().as_secs_f64());

    let t = Instant::now();
    let offline = Duration::from_secs(60);
    for round in 1..=rounds {
        let now = fleet_controller::clock::now_ms();
        for id in &ids {
            store.report(id, report(round), now, offline);
        }
        store.flush_reports().await?;
    }
    let n = ids.len() as f64 * rounds as f64;
    println!("reports flushed: {:.0}/s ({} nodes × {rounds} flushes)", n / t.elapsed().as_secs_f64(), ids.len());
    Ok(())
}
