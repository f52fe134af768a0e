//! Group commit for the workers' small writes (credentials with their PAT counters,
//! identities, statuses, deletions).
//!
//! With sqlx every statement is a hop to SQLite's worker thread and back: as a transaction
//! of its own a PAT would cost four (begin, credential, counter, commit), and cold
//! convergence issues 100,000 of them. The writer task takes whatever writes
//! are waiting, folds them into one [`Batch`] and commits it as a handful of multi-row
//! statements. A caller is answered only after the commit, so whatever it does next (a CP
//! call, a node's desired state) follows stored state. A batch that fails is written again
//! one item at a time, so one bad item fails only its own caller.

use super::error::DbError;
use super::rows::{Batch, Fence, Op};
use super::sql::{fence_of, on, pg, sqlite, Pool};
use parking_lot::RwLock;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Writes taken into one transaction at most.
const MAX_BATCH: usize = 1024;
/// Writes waiting at most; callers wait for room beyond it.
const QUEUE: usize = 4096;

type Request = (Op, oneshot::Sender<Result<(), DbError>>);

/// The handle the store writes through; the task behind it ends when the last handle is gone.
#[derive(Clone)]
pub struct Writer {
    tx: mpsc::Sender<Request>,
}

impl Writer {
    /// Starts the writer task; its handle is for the controller's supervisor.
    pub fn spawn(pool: Pool, fence: Arc<RwLock<Option<Fence>>>) -> (Writer, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let task = tokio::spawn(run(Target { pool, fence }, rx));
        (Writer { tx }, task)
    }

    /// Writes `op` and returns once it is committed.
    pub async fn write(&self, op: Op) -> Result<(), DbError> {
        let stopped = || DbError::Other("the database writer has stopped".into());
        let (ack, done) = oneshot::channel();
        self.tx.send((op, ack)).await.map_err(|_| stopped())?;
        done.await.map_err(|_| stopped())?
    }
}

/// Where the writer commits, and the lease its commits carry (they are the leader's writes).
pub struct Target {
    pub pool: Pool,
    pub fence: Arc<RwLock<Option<Fence>>>,
}

async fn run(pool: Target, mut rx: mpsc::Receiver<Request>) {
    let mut requests = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut requests, MAX_BATCH).await > 0 {
        // Let the tasks that are ready now (workers woken by the last commit or an IAM answer)
        // queue their writes before this batch closes: fewer, larger commits.
        tokio::task::yield_now().await;
        while requests.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(r) => requests.push(r),
                Err(_) => break,
            }
        }
        let ops: Vec<&Op> = requests.iter().map(|(op, _)| op).collect();
        let result = commit(&pool, &ops).await;
        match result {
            Ok(()) => {
                tracing::debug!(writes = requests.len(), "group commit");
                for (_, ack) in requests.drain(..) {
                    let _ = ack.send(Ok(()));
                }
            }
            Err(e) if requests.len() == 1 => {
                if let Some((_, ack)) = requests.pop() {
                    let _ = ack.send(Err(e));
                }
            }
            Err(e) => {
                tracing::warn!(writes = requests.len(), error = %e, "a group commit failed; writing its items one by one");
                for (op, ack) in requests.drain(..) {
                    let _ = ack.send(commit(&pool, &[&op]).await);
                }
            }
        }
    }
}

/// Writes `ops` in one fenced transaction.
pub async fn commit(t: &Target, ops: &[&Op]) -> Result<(), DbError> {
    let batch = Batch::fold(ops);
    let fence = fence_of(&t.pool, &t.fence)?;
    on!(&t.pool, commit_batch(fence.as_ref(), &batch))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::db::testing::{each, open_leading};
    use crate::store::db::{CredRow, Db, Snapshot};

    fn target(db: &Db) -> Target {
        Target { pool: db.pool().clone(), fence: Arc::new(RwLock::new(db.fence().unwrap())) }
    }

    /// A snapshot in a fixed order, for comparing two stores.
    fn sorted(mut s: Snapshot) -> String {
        s.identities.sort();
        s.pairs.sort();
        s.credentials.sort_by(|a, b| a.id.cmp(&b.id));
        s.statuses.sort();
        format!("{:?} {:?} {:?} {:?}", s.identities, s.pairs, s.credentials, s.statuses)
    }

    fn cred(id: &str, n: i64) -> CredRow {
        CredRow {
            id: id.into(),
            agent_key: "coder".into(),
            node_id: "n1".into(),
            n,
            principal_id: "p1".into(),
            ciphertext: format!("sealed-{id}"),
            expires_ms: 1000 + n,
            issued_ms: 10 + n,
            revoke_ms: None,
        }
    }

    /// A history that touches the same rows several times, in an order where folding it
    /// wrongly would show: a pair's counter raised by three credentials in turn, a credential
    /// retired in the batch that inserted it, one deleted, statuses and identities overwritten.
    fn history() -> Vec<Op> {
        vec![
            Op::Identity { agent: "coder".into(), principal: "p1".into(), bound: false },
            Op::Credential { row: cred("pat-0", 0), next_n: 1, retire: None },
            Op::Status { agent: "coder".into(), body: "{\"phase\":\"pending\"}".into() },
            Op::Identity { agent: "coder".into(), principal: "p1".into(), bound: true },
            Op::Credential { row: cred("pat-1", 1), next_n: 2, retire: Some(("pat-0".into(), 5000)) },
            Op::Credential { row: cred("pat-2", 2), next_n: 3, retire: Some(("pat-1".into(), 6000)) },
            Op::DeleteCredential { id: "pat-0".into() },
            Op::Status { agent: "coder".into(), body: "{\"phase\":\"running\"}".into() },
            Op::Status { agent: "other".into(), body: "{}".into() },
        ]
    }

    #[tokio::test]
    async fn one_batch_stores_what_the_writes_store_one_by_one() {
        for (a, b) in each().into_iter().zip(each()) {
            eprintln!("on {}", a.backend);
            one_batch_on(&open_leading(&a.url).await, &open_leading(&b.url).await).await;
        }
    }

    async fn one_batch_on(one_by_one: &Db, batched: &Db) {
        let ops = history();
        for op in &ops {
            commit(&target(one_by_one), &[op]).await.unwrap();
        }
        let refs: Vec<&Op> = ops.iter().collect();
        commit(&target(batched), &refs).await.unwrap();
        let (a, b) = (one_by_one.load().await.unwrap(), batched.load().await.unwrap());
        // The history ends with pat-0 deleted, pat-1 retired, pat-2 live, no counter pending.
        assert_eq!(a.credentials.len(), 2, "{a:?}");
        assert!(a.pairs.contains(&("coder".into(), "n1".into(), 3, None)), "{:?}", a.pairs);
        assert_eq!(sorted(a), sorted(b));
    }

    #[tokio::test]
    async fn concurrent_writers_are_all_committed() {
        for fresh in each() {
            eprintln!("on {}", fresh.backend);
            concurrent_writers_on(open_leading(&fresh.url).await).await;
        }
    }

    async fn concurrent_writers_on(db: Db) {
        let tasks: Vec<_> = (0..40)
            .map(|t| {
                let db = db.clone();
                tokio::spawn(async move {
                    for i in 0..25 {
                        db.put_status(&format!("agent-{t}-{i}"), &format!("{{\"n\":{i}}}")).await.unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let s = db.load().await.unwrap();
        assert_eq!(s.statuses.len(), 1000);
        assert!(s.statuses.contains(&("agent-39-24".into(), "{\"n\":24}".into())));
    }

    #[tokio::test]
    async fn a_refused_write_fails_alone() {
        for fresh in each() {
            eprintln!("on {}", fresh.backend);
            let db = open_leading(&fresh.url).await;
            // A constraint either backend enforces, refusing one row.
            let refuse = "ALTER TABLE statuses ADD CONSTRAINT refused CHECK (agent_key <> 'bad')";
            match db.pool() {
                // SQLite cannot add a constraint to a table: a trigger refuses instead.
                Pool::Sqlite(p) => sqlx::query(
                    "CREATE TRIGGER refuse BEFORE INSERT ON statuses WHEN NEW.agent_key = 'bad' \
                     BEGIN SELECT RAISE(ABORT, 'refused'); END",
                )
                .execute(p)
                .await
                .map(drop),
                Pool::Pg(p) => sqlx::query(refuse).execute(p).await.map(drop),
            }
            .unwrap();
            a_refused_write_on(&db).await;
        }
    }

    async fn a_refused_write_on(db: &Db) {
        let ops = [
            Op::Status { agent: "good".into(), body: "{}".into() },
            Op::Status { agent: "bad".into(), body: "{}".into() },
            Op::Identity { agent: "good".into(), principal: "p".into(), bound: true },
        ];
        let refs: Vec<&Op> = ops.iter().collect();
        assert!(commit(&target(db), &refs).await.is_err(), "the batch as a whole is refused");
        // Through the writer: the batch fails, then each write is tried alone.
        let results = futures::future::join_all(ops.iter().map(|op| db.writer().write(op.clone()))).await;
        assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
        assert!(results[1].as_ref().unwrap_err().to_string().contains("refused"), "{results:?}");
        let s = db.load().await.unwrap();
        assert_eq!(s.statuses, vec![("good".to_string(), "{}".to_string())]);
        assert_eq!(s.identities, vec![("good".to_string(), "p".to_string(), true)]);
    }
}
