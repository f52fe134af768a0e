//! Following the other replicas' writes (docs/behaviour.md#high-availability). On PostgreSQL every change of a node row
//! or a desired state notifies its id (a trigger, in the writing transaction; the payload also
//! names the writing replica, which skips its own). Each replica listens, reads the rows
//! named and applies them to its registry: a node that joined elsewhere can report here, a
//! token changed by a rejoin stops working here, a drain asked elsewhere reaches the leader's
//! pass, a report taken elsewhere reaches it too, and a generation the leader committed wakes
//! the long-polls this replica holds. Notifications are not replayed: after its listening
//! connection was lost, a replica catches up by reading every node row and generation.

use super::db::{DbError, NodeRow};
use super::parts::Parts;
use super::secret::hash;
use crate::clock;
use crate::model::Id;
use sqlx::postgres::PgListener;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Ids read per query, and notifications taken per round.
const BATCH: usize = 1000;

/// What a round of notifications named.
#[derive(Debug, Default)]
pub struct Named {
    pub nodes: HashSet<String>,
    pub desired: HashSet<String>,
}

impl Named {
    /// Adds one notification; `false` when it is this replica's own or malformed.
    fn add(&mut self, channel: &str, payload: &str, me: &str) -> bool {
        let Some((id, writer)) = payload.split_once(' ') else { return false };
        if writer == me || id.is_empty() {
            return false;
        }
        match channel {
            "fleet_nodes" => self.nodes.insert(id.to_string()),
            "fleet_desired" => self.desired.insert(id.to_string()),
            _ => false,
        }
    }

    fn len(&self) -> usize {
        self.nodes.len() + self.desired.len()
    }
}

/// Listens until the process ends; reconnects (and catches up) after losing the database.
/// `leading` tells whether desired states can be skipped (the leader wrote them all);
/// `kick` wakes the pass when something it reads changed.
pub async fn run(store: Arc<Parts>, me: String, offline_after: Duration, leading: impl Fn() -> bool, kick: impl Fn()) {
    let Some(pool) = store.db.pg().cloned() else { return };
    loop {
        let mut listener = match listen(&pool).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for other replicas' changes; retrying in 1 s");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        // Whatever was missed while not listening.
        match catch_up(&store, offline_after, leading()).await {
            Ok(changed) => {
                tracing::info!(
                    nodes = store.registry.read().node_count(),
                    "following the other replicas' writes (caught up)"
                );
                if changed {
                    kick();
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot catch up with other replicas' changes; retrying in 1 s");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        }
        loop {
            let mut named = Named::default();
            match listener.try_recv().await {
                Ok(Some(n)) => {
                    named.add(n.channel(), n.payload(), &me);
                }
                // The connection was lost (and is open again): notifications may be missing.
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "lost the notification connection");
                    break;
                }
            }
            while named.len() < BATCH {
                let Some(n) = listener.next_buffered() else { break };
                named.add(n.channel(), n.payload(), &me);
            }
            tracing::debug!(nodes = named.nodes.len(), desired = named.desired.len(), "other replicas' writes");
            match apply_named(&store, &named, offline_after, leading()).await {
                Ok(true) => kick(),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read other replicas' changes; catching up");
                    break;
                }
            }
        }
    }
}

async fn listen(pool: &sqlx::PgPool) -> Result<PgListener, sqlx::Error> {
    let mut l = PgListener::connect_with(pool).await?;
    l.listen_all(["fleet_nodes", "fleet_desired"]).await?;
    Ok(l)
}

/// Reads the rows a round named and applies them; `true` when the pass has work from them.
pub async fn apply_named(
    store: &Parts,
    named: &Named,
    offline_after: Duration,
    leading: bool,
) -> Result<bool, DbError> {
    let ids: Vec<String> = named.nodes.iter().cloned().collect();
    let mut changed = false;
    for chunk in ids.chunks(BATCH) {
        let rows = store.db.nodes(Some(chunk)).await?;
        changed |= store.apply_nodes(chunk, rows, offline_after);
    }
    if !leading {
        let ids: Vec<String> = named.desired.iter().cloned().collect();
        for chunk in ids.chunks(BATCH) {
            let rows = store.db.desired(Some(chunk)).await?;
            store.apply_desired(rows);
        }
    }
    Ok(changed)
}

/// Reads every node row and desired state and applies what differs; `true` when the pass
/// has work from them.
pub async fn catch_up(store: &Parts, offline_after: Duration, leading: bool) -> Result<bool, DbError> {
    let rows = store.db.nodes(None).await?;
    let mut ids: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
    ids.extend(store.registry.read().nodes().map(|n| n.id.to_string()));
    ids.sort_unstable();
    ids.dedup();
    let changed = store.apply_nodes(&ids, rows, offline_after);
    if !leading {
        store.apply_desired(store.db.desired(None).await?);
    }
    Ok(changed)
}

impl Parts {
    /// Applies the stored rows of the nodes `asked` for: a row is a node joined or changed
    /// elsewhere; a node asked for without a row was deleted elsewhere. `true` when the pass
    /// has work from them.
    pub fn apply_nodes(&self, asked: &[String], rows: Vec<NodeRow>, offline_after: Duration) -> bool {
        let done = self.registry.write().follow_nodes(asked, rows, clock::now_ms(), offline_after);
        for id in &done.joined {
            self.hub.publish(id, 1);
        }
        for d in &done.deleted {
            self.hub.remove(&d.id);
            tracing::info!(node = %d.name, id = %d.id, "node deleted by another replica");
        }
        done.changed
    }

    /// A node token this replica does not know, looked up in the database: a node joined on
    /// another replica moments ago is learned now (its row and its desired state).
    /// A token the database refused within the last ten seconds is not asked again
    /// (`store::refused`), and look-ups take turns.
    pub async fn learn_node_by_token(&self, token: &str, offline_after: Duration) -> Result<Option<Id>, DbError> {
        let token_hash = hash(token);
        if self.refused.refused_recently(&token_hash, Instant::now()) {
            return Ok(None);
        }
        let _turn = self.refused.turn().await;
        // While this one waited, another look-up may have learnt or refused the same token.
        if let Some(id) = self.registry.read().node_id_by_token(token) {
            return Ok(Some(id));
        }
        if self.refused.refused_recently(&token_hash, Instant::now()) {
            return Ok(None);
        }
        let Some(row) = self.db.node_by_token_hash(&token_hash).await? else {
            self.refused.remember(token_hash, Instant::now());
            return Ok(None);
        };
        let id = row.id.clone();
        self.apply_nodes(std::slice::from_ref(&id), vec![row], offline_after);
        self.refresh_desired(&id.as_str().into()).await?;
        Ok(self.registry.read().node_id_by_token(token))
    }

    /// Reads one node's desired state from the database now and applies it if newer.
    pub async fn refresh_desired(&self, node: &Id) -> Result<(), DbError> {
        let rows = self.db.desired(Some(&[node.to_string()])).await?;
        self.apply_desired(rows);
        Ok(())
    }

    /// Applies stored desired states newer than this replica's, and wakes their long-polls.
    /// A generation never goes backwards here: an older row is ignored.
    pub fn apply_desired(&self, rows: Vec<(String, i64, String)>) {
        let mut woken = Vec::new();
        {
            let mut st = self.registry.write();
            for (node, generation, agents) in rows {
                let id: Id = node.as_str().into();
                if st.follow_desired(&id, generation as u64, &agents) {
                    woken.push((id, generation as u64));
                }
            }
        }
        for (id, generation) in woken {
            self.hub.publish(&id, generation);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_of_this_replica_and_malformed_ones_are_skipped() {
        let mut n = Named::default();
        assert!(n.add("fleet_nodes", "id-1 other", "me"));
        assert!(!n.add("fleet_nodes", "id-2 me", "me"));
        assert!(!n.add("fleet_nodes", "no-writer", "me"));
        assert!(n.add("fleet_desired", "id-1 ", "me"), "a writer without a name is another replica");
        assert!(!n.add("fleet_other", "id-1 x", "me"));
        assert_eq!((n.nodes.len(), n.desired.len()), (1, 1));
    }
}

#[cfg(test)]
mod replicas {
    use super::*;
    use crate::store::db::testing::lead;
    use crate::store::Store;
    use fleet_api::{Capacity, JoinRequest};
    use std::sync::Arc;

    fn join_request(key: String, name: &str) -> JoinRequest {
        use base64::Engine;
        let (_, pk) = fleet_api::seal::generate_keypair();
        JoinRequest {
            join_key: key,
            name: name.into(),
            public_key: base64::engine::general_purpose::STANDARD.encode(pk),
            labels: vec![],
            executor_kinds: vec!["k".into()],
            executor_images: Default::default(),
            capacity: Capacity { slots: 1, cpus: None, memory_mb: None },
            secrets: vec![],
            executor_secrets: Default::default(),
            version: "t".into(),
            maintenance_windows: Vec::new(),
        }
    }

    fn report(seq: u64) -> fleet_api::ObservedReport {
        fleet_api::ObservedReport {
            applied_generation: 1,
            health: fleet_api::Health::Ok,
            labels: vec![],
            executor_kinds: vec!["k".into()],
            executor_images: Default::default(),
            capacity: Capacity { slots: 1, cpus: None, memory_mb: None },
            secrets: vec![],
            executor_secrets: Default::default(),
            replicas: vec![],
            version: "t".into(),
            boot_id: Some("boot".into()),
            seq: Some(seq),
            observe_seconds: None,
            maintenance_windows: Vec::new(),
        }
    }

    async fn until(what: &str, f: impl Fn() -> bool) {
        for _ in 0..100 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("timed out waiting for {what}");
    }

    /// Two replicas on one database: a node joined on one is known to the other, a desired
    /// state the leader commits wakes the follower's long-polls, a lifecycle change and a
    /// deletion made on the follower reach the leader.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_replica_follows_the_others_writes() {
        let Some(pg) = fleet_devkit::postgres::shared_or_skip("following other replicas") else { return };
        let url = pg.database().unwrap();
        let leader = Arc::new(Store::open_as(&url, "leader").await.unwrap());
        let follower = Arc::new(Store::open_as(&url, "follower").await.unwrap());
        lead(leader.db()).await;
        let ttl = Duration::from_secs(60);
        let kicks = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let k = kicks.clone();
        let (l, f) = (leader.clone(), follower.clone());
        tokio::spawn(async move {
            let kick = move || {
                k.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            };
            l.follow("leader".into(), ttl, || true, kick).await
        });
        tokio::spawn(async move { f.follow("follower".into(), ttl, || false, || {}).await });
        tokio::time::sleep(Duration::from_millis(300)).await;

        let (key, _) = follower.issue_join_key(ttl, "", &Default::default()).await.unwrap();
        let id: Id = follower.join(&join_request(key, "n1")).await.unwrap().node_id.into();
        until("the leader knows the node joined on the follower", || leader.read().node(&id).is_some()).await;
        assert!(leader.take_changes().facts.contains(&id), "the leader's pass hears of it");
        until("the leader's pass is woken", || kicks.load(std::sync::atomic::Ordering::Relaxed) > 0).await;

        let w = crate::store::db::PassWrite { desired: vec![(id.to_string(), 5, "[]".into())], ..Default::default() };
        leader.db().apply_pass(&w).await.unwrap();
        until("the follower serves generation 5", || follower.desired_body(&id).is_some_and(|(g, _)| g == 5)).await;
        assert!(follower.desired_body(&id).is_some_and(|(_, body)| body.is_some()), "held: the node may ask here");

        // The node applied generation 5, served by another replica: the follower hears it
        // from the report and lets go of the body (the database keeps it).
        let applied = fleet_api::ObservedReport { applied_generation: 5, ..report(3) };
        leader.report(&id, applied, clock::now_ms(), ttl);
        leader.flush_reports().await.unwrap();
        until("the follower lets the delivered body go", || {
            follower.desired_body(&id).is_some_and(|(g, body)| g == 5 && body.is_none())
        })
        .await;

        // A node joined on the leader reports to the follower: the leader hears the report.
        let (key, _) = leader.issue_join_key(ttl, "", &Default::default()).await.unwrap();
        let joined = leader.join(&join_request(key, "n2")).await.unwrap();
        let id2: Id = joined.node_id.as_str().into();
        until("the follower knows n2", || follower.read().node_id_by_token(&joined.node_token).is_some()).await;
        let now = clock::now_ms();
        let got = follower.report(&id2, report(7), now, ttl);
        assert!(matches!(got, crate::store::ReportOutcome::Accepted { .. }), "{got:?}");
        follower.flush_reports().await.unwrap();
        until("the leader has n2's report", || leader.read().node(&id2).is_some_and(|n| n.info.seq == Some(7))).await;

        // A replica that has not heard of a join yet (no notification taken) learns the node
        // when the node's token reaches it: a node's first request never meets a 401.
        let late = Store::open_as(&url, "late").await.unwrap();
        let (key, _) = leader.issue_join_key(ttl, "", &Default::default()).await.unwrap();
        let joined = leader.join(&join_request(key, "n3")).await.unwrap();
        assert_eq!(late.read().node_id_by_token(&joined.node_token), None);
        let learned = late.learn_node_by_token(&joined.node_token, ttl).await.unwrap();
        assert_eq!(learned.as_deref(), Some(joined.node_id.as_str()));
        assert_eq!(late.desired_body(&joined.node_id.as_str().into()).map(|(g, _)| g), Some(1));
        assert_eq!(late.learn_node_by_token("fnt_unknown", ttl).await.unwrap(), None);

        // An allowance changed on the follower reaches the leader, split again there: n2's
        // kind is refused on both (docs/behaviour.md#what-a-node-may-claim).
        let no_kinds = fleet_api::claims::Allowance { allowed_labels: None, allowed_kinds: Some(vec![]) };
        follower.set_allowance("n2", no_kinds, "test").await.unwrap();
        until("the leader refuses n2's kind", || {
            leader.read().node(&id2).is_some_and(|n| n.info.executor_kinds.is_empty() && n.allowed.is_some())
        })
        .await;
        assert_eq!(leader.read().node(&id2).map(|n| n.info.refused_facts().kinds), Some(vec!["k".to_string()]));
        follower.set_lifecycle("n1", crate::store::Action::Cordon, "test").await.unwrap();
        until("the leader sees the cordon", || {
            leader.read().node(&id).is_some_and(|n| n.lifecycle == crate::store::Lifecycle::Cordoned)
        })
        .await;
        follower.delete_node("n1", "test").await.unwrap();
        until("the leader forgets the deleted node", || leader.read().node(&id).is_none()).await;
    }

    /// Two replicas writing reports of the same nodes at the same moment never deadlock:
    /// each writes its rows in id order (in any other order PostgreSQL breaks the cycle after
    /// a second and the flush fails).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn two_replicas_flushing_reports_of_the_same_nodes_do_not_deadlock() {
        let Some(pg) = fleet_devkit::postgres::shared_or_skip("flushes on two replicas") else { return };
        let url = pg.database().unwrap();
        let a = Store::open_as(&url, "a").await.unwrap();
        let b = Store::open_as(&url, "b").await.unwrap();
        let ttl = Duration::from_secs(60);
        let mut ids = Vec::new();
        for i in 0..200 {
            let (key, _) = a.issue_join_key(ttl, "", &Default::default()).await.unwrap();
            ids.push(Id::from(a.join(&join_request(key, &format!("n{i}"))).await.unwrap().node_id.as_str()));
        }
        catch_up(&b.parts, ttl, false).await.unwrap();
        for round in 1..=5u64 {
            let now = clock::now_ms();
            for id in &ids {
                a.report(id, report(round * 2), now, ttl);
                b.report(id, report(round * 2 + 1), now, ttl);
            }
            let (x, y) = tokio::join!(a.parts.flush_reports_by(20), b.parts.flush_reports_by(20));
            assert_eq!((x.unwrap(), y.unwrap()), (200, 200), "round {round}: every row written by both");
        }
    }
}
