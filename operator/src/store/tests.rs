//! The store's write-through, through its façade, on both backends.

use super::*;
use fleet_api::{Capacity, Health, ReplicaState};
use std::collections::BTreeMap;

fn report(labels: &[&str], secrets: &[&str], seq: u64) -> ObservedReport {
    ObservedReport {
        applied_generation: 1,
        health: Health::Ok,
        labels: labels.iter().map(|s| s.to_string()).collect(),
        executor_kinds: vec!["k".into()],
        executor_images: BTreeMap::new(),
        capacity: Capacity { slots: 2, cpus: None, memory_mb: None },
        secrets: secrets.iter().map(|s| s.to_string()).collect(),
        executor_secrets: Default::default(),
        replicas: vec![],
        version: "t".into(),
        boot_id: Some("b".into()),
        seq: Some(seq),
        observe_seconds: None,
        maintenance_windows: Vec::new(),
    }
}

#[tokio::test]
async fn a_report_changes_something_only_after_normalising() {
    for fresh in db::testing::each() {
        eprintln!("on {}", fresh.backend);
        a_report_on(&Store::open(&fresh.url).await.unwrap()).await;
    }
}

#[tokio::test]
async fn reports_are_flushed_in_chunks_until_none_is_dirty() {
    let fresh = db::testing::each().into_iter().next().unwrap();
    let store = Store::open(&fresh.url).await.unwrap();
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(join_node(&store, &format!("n{i}"), &[]).await);
    }
    let now = clock::now_ms();
    for id in &ids {
        store.report(id, report(&["flushed"], &[], 1), now, Duration::from_secs(60));
    }
    assert_eq!(store.parts.flush_reports_by(2).await.unwrap(), 5, "three chunks of two, two, one");
    assert_eq!(store.read().dirty_count(), 0);
    let stored = store.db().nodes(None).await.unwrap();
    assert_eq!(stored.iter().filter(|n| n.info.contains("flushed")).count(), 5);
    assert_eq!(store.parts.flush_reports_by(2).await.unwrap(), 0, "nothing left to write");
}

/// A status sent settles the want it was derived for, or a want of the body itself; a
/// want a later pass set meanwhile (another body) stays to be sent.
#[tokio::test]
async fn a_sent_status_settles_the_want_it_was_derived_for() {
    let fresh = db::testing::each().into_iter().next().unwrap();
    let store = Store::open(&fresh.url).await.unwrap();
    let agent: Id = "a".into();
    let body = |ready: u32| StatusBody {
        phase: kept::Phase::Pending,
        reason: None,
        node: None,
        observed_revision: None,
        ready_replicas: ready,
        desired_replicas: 2,
        replicas: vec![],
    };
    let want = |st: &Store| st.read().status_wanted(&agent).copied();
    let (old, later) = (kept::Sent::of(&body(0)), kept::Sent::of(&body(2)));

    // Derived while the pass wanted `old`; the body sent is newer: the want is settled.
    store.parts.registry.write().want_status(&agent, old);
    store.status_sent(&agent, body(1), old).await;
    assert_eq!(want(&store), None);
    assert!(store.read().status_sent(&agent).is_some_and(|s| s.is(&body(1))));

    // A later pass wanted another body while this one was on its way: it stays.
    store.parts.registry.write().want_status(&agent, later);
    store.status_sent(&agent, body(1), old).await;
    assert_eq!(want(&store), Some(later));

    // The body the later pass wanted is the one sent: settled.
    store.status_sent(&agent, body(2), old).await;
    assert_eq!(want(&store), None);
}

/// A takeover loads the store again and trusts what the CP accepted for every agent without
/// an unsettled-status mark; a marked agent's status is sent once more: a call of the last
/// leader may have landed unrecorded (docs/behaviour.md#high-availability).
#[tokio::test]
async fn a_reload_trusts_the_stored_statuses_but_the_marked_ones() {
    let fresh = db::testing::each().into_iter().next().unwrap();
    let store = Store::open(&fresh.url).await.unwrap();
    let body = StatusBody {
        phase: kept::Phase::Pending,
        reason: None,
        node: None,
        observed_revision: None,
        ready_replicas: 0,
        desired_replicas: 1,
        replicas: vec![],
    };
    let sent = kept::Sent::of(&body);
    for agent in ["settled", "marked"] {
        let agent: Id = agent.into();
        store.parts.registry.write().want_status(&agent, sent);
        store.status_sent(&agent, body.clone(), sent).await;
    }
    store.db().put_kv(&kept::unsettled_key("marked"), "1").await.unwrap();
    store.reload().await.unwrap();
    let st = store.read();
    assert!(st.status_sent("settled").is_some_and(|s| s.is(&body)), "not sent again");
    assert!(st.status_sent("marked").is_none(), "sent again by the next pass");
    assert!(st.unsettled().contains("marked") && !st.unsettled().contains("settled"));
}

/// A pass's new desired state is in the registry before the hub announces it: a poll that
/// sees the announcement and then reads the registry finds the new generation (else it waits
/// for a wake that already went, a node's whole report period). The registry is held by a
/// reader while the pass commits, so an announcement made before the registry changes is seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::await_holding_lock)] // the reader is held on purpose while the pass commits
async fn a_generation_is_served_before_it_is_announced() {
    let fresh = db::testing::each().into_iter().next().unwrap();
    let store = std::sync::Arc::new(Store::open(&fresh.url).await.unwrap());
    let node = join_node(&store, "n", &[]).await;
    let served = |st: &registry::Reader<'_>| st.desired(&node).map(|d| d.generation);
    let before = served(&store.read()).expect("a joined node has a desired state");
    let rx = store.hub().subscribe(&node);
    let reader = store.read();
    let desired = vec![(node.clone(), records::DesiredRec::new(before + 1, "[]"))];
    let commit = {
        let store = store.clone();
        tokio::spawn(async move { store.commit_pass(&db::PassWrite::default(), desired, vec![], vec![], vec![]).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let announced = rx.has_changed().unwrap();
    assert!(!announced || served(&reader) == Some(before + 1), "announced while the registry serves {before}");
    drop(reader);
    commit.await.unwrap().unwrap();
    assert_eq!(served(&store.read()), Some(before + 1));
    assert!(rx.has_changed().unwrap(), "announced once served");
}

/// Joins a node named `name` with a fresh key and these labels; its id.
async fn join_node(store: &Store, name: &str, labels: &[&str]) -> Id {
    let (key, _) = store.issue_join_key(Duration::from_secs(60), "", &Default::default()).await.unwrap();
    let (_, pk) = fleet_api::seal::generate_keypair();
    use base64::Engine;
    let req = JoinRequest {
        join_key: key,
        name: name.into(),
        public_key: base64::engine::general_purpose::STANDARD.encode(pk),
        labels: labels.iter().map(|l| l.to_string()).collect(),
        executor_kinds: vec!["k".into()],
        executor_images: BTreeMap::new(),
        capacity: Capacity { slots: 2, cpus: None, memory_mb: None },
        secrets: vec![],
        executor_secrets: Default::default(),
        version: "t".into(),
        maintenance_windows: Vec::new(),
    };
    store.join(&req).await.unwrap().node_id.into()
}

async fn a_report_on(store: &Store) {
    let id = join_node(store, "n", &["b", "a"]).await;
    let now = clock::now_ms();
    let ttl = Duration::from_secs(60);
    let got = store.report(&id, report(&["b", "a", "a"], &[], 1), now, ttl);
    assert_eq!(got, ReportOutcome::Accepted { changed: false, was_online: true }, "order and duplicates are no change");
    let got = store.report(&id, report(&["a"], &[], 2), now, ttl);
    assert_eq!(got, ReportOutcome::Accepted { changed: true, was_online: true });
    let mut r = report(&["a"], &[], 3);
    let replica = |i: u32| fleet_api::ReplicaReport {
        agent_key: "x".into(),
        revision: 1,
        replica: i,
        state: ReplicaState::Running,
        restarts: 0,
        last_exit_code: None,
        message: None,
        spec_id: None,
        busy_until: None,
    };
    // Ten replicas in room for sixteen, as parsing leaves them: kept at their length.
    r.replicas = Vec::with_capacity(16);
    r.replicas.extend((0..10).map(replica));
    assert_eq!(store.report(&id, r, now, ttl), ReportOutcome::Accepted { changed: true, was_online: true });
    let kept = store.read().node(&id).map(|n| n.info.replicas.capacity());
    assert_eq!(kept, Some(10), "the report's replicas are kept at their length");
    assert_eq!(store.report(&id, report(&["a"], &[], 3), now, ttl), ReportOutcome::Stale);
    let later = now + 61_000;
    let got = store.report(&id, report(&["a"], &[], 4), later, ttl);
    assert_eq!(got, ReportOutcome::Accepted { changed: true, was_online: false });
}

/// docs/behaviour.md#what-a-node-may-claim, on both backends: a key's allowance passes to the
/// node it makes; a report is split under it (the refused label out of the effective facts, one
/// `node_facts_refused` event while the refused set stays the same); a changed allowance applies
/// at once to what the node last claimed; and both the allowance and the split survive a reload
/// from the database.
#[tokio::test]
async fn an_allowance_splits_claims_and_survives_a_reload() {
    for fresh in db::testing::each() {
        eprintln!("on {}", fresh.backend);
        let store = Store::open(&fresh.url).await.unwrap();
        db::testing::lead(store.db()).await;
        allowance_on(&store).await;
    }
}

/// The `node_facts_refused` events of node `id`, written first.
async fn refused_events(store: &Store, id: &Id) -> usize {
    store.flush_events().await.unwrap();
    let f = events::Filter {
        agent: None,
        node: Some(id.to_string()),
        since: 0,
        before: None,
        limit: 500,
        newest_first: false,
    };
    let all = store.read_events(&f).await.unwrap();
    all.iter().filter(|e| e.kind == "node_facts_refused" && e.message.contains("labels gpu")).count()
}

async fn allowance_on(store: &Store) {
    use fleet_api::claims::Allowance;
    let zones = Allowance { allowed_labels: Some(vec!["zone=*".into()]), allowed_kinds: None };
    let (key, _) = store.issue_join_key(Duration::from_secs(60), "", &zones).await.unwrap();
    let (_, pk) = fleet_api::seal::generate_keypair();
    use base64::Engine;
    let req = JoinRequest {
        join_key: key,
        name: "claims".into(),
        public_key: base64::engine::general_purpose::STANDARD.encode(pk),
        labels: vec!["zone=eu".into()],
        executor_kinds: vec!["k".into()],
        executor_images: BTreeMap::new(),
        capacity: Capacity { slots: 2, cpus: None, memory_mb: None },
        secrets: vec![],
        executor_secrets: Default::default(),
        version: "t".into(),
        maintenance_windows: Vec::new(),
    };
    let id: Id = store.join(&req).await.unwrap().node_id.into();
    let (now, ttl) = (clock::now_ms(), Duration::from_secs(60));
    assert_eq!(refused_events(store, &id).await, 0, "nothing refused at the join");
    for seq in 1..=3 {
        store.report(&id, report(&["gpu", "zone=eu"], &[], seq), now, ttl);
    }
    let labels = |store: &Store| store.read().node(&id).map(|n| (n.info.labels.clone(), n.info.refused_facts().labels));
    assert_eq!(labels(store), Some((vec!["zone=eu".into()], vec!["gpu".into()])));
    assert_eq!(refused_events(store, &id).await, 1, "one event while the refused set stays the same");
    store.flush_reports().await.unwrap();

    store.reload().await.unwrap();
    assert_eq!(labels(store), Some((vec!["zone=eu".into()], vec!["gpu".into()])), "after a reload");
    assert_eq!(store.read().node(&id).and_then(|n| n.allowed.as_deref().cloned()), Some(zones));

    let with_gpu = Allowance { allowed_labels: Some(vec!["zone=*".into(), "gpu".into()]), allowed_kinds: None };
    assert!(store.set_allowance("claims", with_gpu.clone(), "test").await.unwrap().is_some());
    assert_eq!(labels(store), Some((vec!["gpu".into(), "zone=eu".into()], vec![])), "at once, without a report");
    assert!(store.take_changes().facts.contains(&id), "placement is told");
    store.reload().await.unwrap();
    assert_eq!(labels(store), Some((vec!["gpu".into(), "zone=eu".into()], vec![])), "the new allowance is stored");
    assert_eq!(store.read().node(&id).and_then(|n| n.allowed.as_deref().cloned()), Some(with_gpu.normalised()));
    assert!(store.set_allowance("no-such-node", Allowance::default(), "test").await.unwrap().is_none());
}

/// A database of a version before allowances gains the columns, and its keys and nodes allow
/// anything, as before (both backends).
#[tokio::test]
async fn keys_and_nodes_of_an_earlier_version_allow_anything() {
    for fresh in db::testing::each() {
        eprintln!("on {}", fresh.backend);
        let key = "INSERT INTO join_keys (hash, expires_ms, note, created_ms) VALUES ($1, 9999999999999, '', 0)";
        let node = "INSERT INTO nodes (id, name, token_hash, public_key, joined_ms, last_seen_ms, info) \
                    VALUES ('n1', 'old', $1, $2, 0, 0, '{\"labels\":[\"gpu\"],\"executorKinds\":[\"k\"],\"executorImages\":{},\"capacity\":{\"slots\":1},\"secrets\":[],\"version\":\"\",\"health\":null,\"observeSeconds\":null,\"replicas\":[],\"appliedGeneration\":0,\"bootId\":null,\"seq\":null}')";
        if fresh.backend == "sqlite" {
            let opts = fresh.url.parse::<sqlx::sqlite::SqliteConnectOptions>().unwrap().create_if_missing(true);
            let pool = sqlx::sqlite::SqlitePoolOptions::new().connect_with(opts).await.unwrap();
            let mut m = sqlx::migrate!("./migrations/sqlite");
            m.migrations = m.migrations.iter().filter(|m| m.version < 4).cloned().collect::<Vec<_>>().into();
            m.run(&pool).await.unwrap();
            sqlx::query(key).bind(secret::hash("fjk_old").to_vec()).execute(&pool).await.unwrap();
            sqlx::query(node).bind(vec![1u8; 32]).bind(vec![2u8; 32]).execute(&pool).await.unwrap();
            pool.close().await;
        } else {
            let pool = sqlx::PgPool::connect(&fresh.url).await.unwrap();
            let mut m = sqlx::migrate!("./migrations/postgres");
            m.migrations = m.migrations.iter().filter(|m| m.version < 5).cloned().collect::<Vec<_>>().into();
            m.run(&pool).await.unwrap();
            sqlx::query(key).bind(secret::hash("fjk_old").to_vec()).execute(&pool).await.unwrap();
            sqlx::query(node).bind(vec![1u8; 32]).bind(vec![2u8; 32]).execute(&pool).await.unwrap();
            pool.close().await;
        }
        let store = Store::open(&fresh.url).await.unwrap();
        {
            let st = store.read();
            let old = st.node(&Id::from("n1")).expect("the old node is loaded");
            assert!(old.allowed.is_none() && old.info.refused.is_none(), "an old node allows anything");
            assert_eq!(old.info.labels, vec!["gpu".to_string()]);
        }
        assert_eq!(store.db().join_key_allowance(&secret::hash("fjk_old")).await.unwrap(), None, "an old key too");
    }
}

/// docs/behaviour.md#kubernetes-mirror, on both backends: the fleet id is made once and kept —
/// a second replica on the same database, and the same one after a restart, get the same id.
#[tokio::test]
async fn the_fleet_id_is_made_once_and_shared_by_every_replica_of_the_store() {
    for fresh in db::testing::each() {
        eprintln!("on {}", fresh.backend);
        let one = Store::open(&fresh.url).await.unwrap();
        let two = Store::open(&fresh.url).await.unwrap();
        let (a, b) = tokio::join!(one.fleet_id(), two.fleet_id());
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a, b, "two replicas asking at once agree");
        assert!(fleet_api::names::is_kubernetes_label_value(&a) && a.len() == 16, "{a}");
        drop((one, two));
        let again = Store::open(&fresh.url).await.unwrap();
        assert_eq!(again.fleet_id().await.unwrap(), a, "kept across a restart");
    }
}
