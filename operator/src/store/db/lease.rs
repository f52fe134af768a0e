//! The leader lease in PostgreSQL (docs/behaviour.md#high-availability): one row with its holder, an `epoch` that
//! grows with every takeover, and an expiry in the database's clock (`now()`), so replicas'
//! clocks never matter. Taking it is one statement that succeeds only when the row is free or
//! expired; renewing is the fencing predicate (`holder = me AND epoch = mine`) with a new
//! expiry. The writes that need the lease check the same predicate in their own transaction
//! (`sql/queries.rs`, `fence`).

use super::rows::Fence;
use sqlx::{PgConnection, PgPool};
use std::time::Duration;

/// The lease row; the fence (`sql/queries.rs`) checks the same one.
pub const NAME: &str = "controller";

/// Takes the lease for `ttl` when it is free, expired or released; returns the new epoch.
/// `url`: where this replica's API is, for the followers to send what only the leader answers.
pub async fn acquire(pool: &PgPool, holder: &str, url: &str, ttl: Duration) -> Result<Option<Fence>, sqlx::Error> {
    let epoch: Option<i64> = sqlx::query_scalar(
        "INSERT INTO leader_lease (name, holder, epoch, expires_at, url) \
         VALUES ($1, $2, 1, now() + $3 * interval '1 millisecond', $4) \
         ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, epoch = leader_lease.epoch + 1, \
         expires_at = excluded.expires_at, url = excluded.url WHERE leader_lease.expires_at <= now() \
         RETURNING epoch",
    )
    .bind(NAME)
    .bind(holder)
    .bind(ttl.as_millis() as f64)
    .bind(url)
    .fetch_optional(pool)
    .await?;
    Ok(epoch.map(|epoch| Fence { holder: holder.to_string(), epoch }))
}

/// Extends the lease by `ttl` from now; `false` when it is no longer ours. The leader renews
/// on its lock's own session, which no pass or flush can keep busy.
pub async fn renew<'c>(db: impl sqlx::PgExecutor<'c>, fence: &Fence, ttl: Duration) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE leader_lease SET expires_at = now() + $1 * interval '1 millisecond' \
         WHERE name = $2 AND holder = $3 AND epoch = $4 AND expires_at > now()",
    )
    .bind(ttl.as_millis() as f64)
    .bind(NAME)
    .bind(&fence.holder)
    .bind(fence.epoch)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Gives the lease up at once (SIGTERM), so another replica need not wait for it to expire.
pub async fn release(pool: &PgPool, fence: &Fence) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE leader_lease SET expires_at = now() - interval '1 millisecond' \
         WHERE name = $1 AND holder = $2 AND epoch = $3",
    )
    .bind(NAME)
    .bind(&fence.holder)
    .bind(fence.epoch)
    .execute(pool)
    .await?;
    Ok(())
}

/// The session advisory lock the leader holds for its term on a connection of its own.
pub const LOCK_KEY: i64 = 0x466c_6565_7431; // "Fleet1"

/// Takes the advisory lock on `conn` if no other session holds it.
pub async fn try_lock(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_try_advisory_lock($1)").bind(LOCK_KEY).fetch_one(conn).await
}

/// Lets the advisory lock go (a replica that got it but could not take the lease).
pub async fn unlock(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_unlock($1)").bind(LOCK_KEY).execute(conn).await.map(|_| ())
}

/// Takes the lease on the connection that holds the advisory lock: when it is free, expired
/// or released — or when its current holder recorded a lock for its epoch, which it can only
/// have lost since this session holds it now (its process ended, or its session was ended).
/// Records this session's backend as the lock of the new epoch.
pub async fn acquire_locked(
    conn: &mut PgConnection,
    holder: &str,
    url: &str,
    ttl: Duration,
) -> Result<Option<Fence>, sqlx::Error> {
    let epoch: Option<i64> = sqlx::query_scalar(
        "INSERT INTO leader_lease (name, holder, epoch, expires_at, url, lock_pid, lock_epoch) \
         VALUES ($1, $2, 1, now() + $3 * interval '1 millisecond', $4, pg_backend_pid(), 1) \
         ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, epoch = leader_lease.epoch + 1, \
         expires_at = excluded.expires_at, url = excluded.url, lock_pid = excluded.lock_pid, \
         lock_epoch = leader_lease.epoch + 1 \
         WHERE leader_lease.expires_at <= now() \
         OR (leader_lease.lock_pid IS NOT NULL AND leader_lease.lock_epoch = leader_lease.epoch) \
         RETURNING epoch",
    )
    .bind(NAME)
    .bind(holder)
    .bind(ttl.as_millis() as f64)
    .bind(url)
    .fetch_optional(conn)
    .await?;
    Ok(epoch.map(|epoch| Fence { holder: holder.to_string(), epoch }))
}

/// Ends the sessions of a holder whose lease expired (a leader paused or cut off from the
/// database), so the lock and the lease can be taken, and nothing of its term holds a row the
/// next leader writes: every session its replica opened before the expiry (sessions name their
/// replica, `application_name`, cut to 63 bytes), the session recorded as its lock's, and any
/// transaction begun before the expiry that holds `FOR SHARE` on the lease row (a fenced write;
/// a follower never takes that lock). A leader paused inside a transaction would otherwise hold
/// the takeover until it woke: a fenced write share-locks the lease row that `acquire_locked`
/// updates, and a report flush locks node rows the new leader's own flush writes.
/// `true` when a session was ended.
pub async fn end_expired_holder(pool: &PgPool) -> Result<bool, sqlx::Error> {
    let ended: i64 = sqlx::query_scalar(
        "WITH lease AS (SELECT holder, lock_pid, lock_epoch, epoch, expires_at FROM leader_lease \
           WHERE name = $1 AND expires_at <= now()), \
         stale AS ( \
           SELECT a.pid FROM pg_stat_activity a, lease \
           WHERE a.pid <> pg_backend_pid() AND a.backend_start < lease.expires_at AND a.application_name <> '' \
           AND (a.application_name = lease.holder \
             OR (octet_length(a.application_name) = 63 AND starts_with(lease.holder, a.application_name))) \
           UNION \
           SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid, lease \
           WHERE l.locktype = 'relation' AND l.relation = 'leader_lease'::regclass AND l.granted \
           AND l.mode = 'RowShareLock' AND l.pid <> pg_backend_pid() AND a.xact_start < lease.expires_at \
           UNION \
           SELECT lock_pid FROM lease WHERE lock_epoch = epoch AND lock_pid <> pg_backend_pid() \
           AND EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = lease.lock_pid)) \
         SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM stale",
    )
    .bind(NAME)
    .fetch_one(pool)
    .await?;
    Ok(ended > 0)
}

/// Whether the lock's session still answers.
pub async fn ping(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT 1").execute(conn).await.map(|_| ())
}

/// The lease as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub holder: String,
    pub epoch: i64,
    pub url: String,
    /// Unexpired.
    pub live: bool,
}

/// Who holds the lease now.
pub async fn holder(pool: &PgPool) -> Result<Option<Holder>, sqlx::Error> {
    let row: Option<(String, i64, String, bool)> =
        sqlx::query_as("SELECT holder, epoch, url, expires_at > now() FROM leader_lease WHERE name = $1")
            .bind(NAME)
            .fetch_optional(pool)
            .await?;
    Ok(row.map(|(holder, epoch, url, live)| Holder { holder, epoch, url, live }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::db::{Db, DbError, PassWrite};

    async fn db() -> Option<Db> {
        let pg = fleet_devkit::postgres::shared_or_skip("the lease's tests")?;
        Some(Db::open(&pg.database().unwrap()).await.unwrap())
    }

    fn a_write() -> PassWrite {
        PassWrite { bind: vec![("coder".into(), 0, "n1".into())], ..Default::default() }
    }

    /// One holder at a time; a takeover raises the epoch; a deposed leader can neither renew
    /// nor write, and a replica that never led cannot write at all.
    #[tokio::test]
    async fn the_lease_passes_with_a_new_epoch_and_fences_the_old_leader() {
        let Some(a) = db().await else { return };
        let pool = a.pg().unwrap().clone();
        let ttl = Duration::from_secs(60);
        assert!(matches!(a.apply_pass(&a_write()).await, Err(DbError::NotLeader)));

        let first = acquire(&pool, "one", "http://one", ttl).await.unwrap().expect("free");
        assert_eq!(first.epoch, 1);
        assert_eq!(acquire(&pool, "two", "http://two", ttl).await.unwrap(), None, "held and unexpired");
        assert!(renew(&pool, &first, ttl).await.unwrap());
        a.set_fence(Some(first.clone()));
        a.apply_pass(&a_write()).await.unwrap();

        release(&pool, &first).await.unwrap();
        let second = acquire(&pool, "two", "http://two", ttl).await.unwrap().expect("released");
        assert_eq!(second.epoch, 2);
        assert!(!renew(&pool, &first, ttl).await.unwrap(), "the old holder cannot renew");
        let refused = a.apply_pass(&a_write()).await;
        assert!(matches!(refused, Err(DbError::Fenced { epoch: 1 })), "{refused:?}");
        let refused = a.put_status("coder", "{}").await;
        assert!(matches!(refused, Err(DbError::Fenced { epoch: 1 })), "the writer is fenced too: {refused:?}");
        let now = holder(&pool).await.unwrap().unwrap();
        assert_eq!((now.holder.as_str(), now.epoch, now.url.as_str(), now.live), ("two", 2, "http://two", true));
    }

    /// The lock passes the moment its holder's session ends, and the lease with it, unexpired;
    /// a paused holder's session is ended once its lease expired; a holder that recorded no
    /// lock (an older version) is waited out.
    #[tokio::test]
    async fn the_lock_makes_takeover_fast_and_waits_out_a_holder_without_one() {
        let Some(db) = db().await else { return };
        let pool = db.pg().unwrap();
        let ttl = Duration::from_secs(60);
        let mut one = pool.acquire().await.unwrap().detach();
        let mut two = pool.acquire().await.unwrap().detach();
        assert!(try_lock(&mut one).await.unwrap());
        let first = acquire_locked(&mut one, "one", "", ttl).await.unwrap().expect("free");
        assert!(!try_lock(&mut two).await.unwrap(), "held by one's session");
        drop(one); // the process ends: PostgreSQL closes its session and the lock with it
        let took = async {
            loop {
                if try_lock(&mut two).await.unwrap() {
                    return acquire_locked(&mut two, "two", "", ttl).await.unwrap();
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let second = tokio::time::timeout(Duration::from_secs(5), took).await.expect("at once").expect("taken");
        assert_eq!(second.epoch, first.epoch + 1, "the unexpired lease passed with the lock");
        assert!(!renew(pool, &first, ttl).await.unwrap());

        // Paused: the lease expires while the lock is held; its session is ended, then taken.
        assert!(renew(pool, &second, Duration::from_millis(200)).await.unwrap());
        let mut three = pool.acquire().await.unwrap().detach();
        assert!(!try_lock(&mut three).await.unwrap());
        assert!(!end_expired_holder(pool).await.unwrap(), "not before the lease expired");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(end_expired_holder(pool).await.unwrap(), "the expired holder's session is ended");
        assert!(ping(&mut two).await.is_err(), "the paused leader finds its lock gone when it wakes");
        assert!(lock_within(&mut three, 2500).await, "the lock is free once the session ended");
        let third = acquire_locked(&mut three, "three", "", ttl).await.unwrap().expect("expired");
        drop(three);

        // A holder from before the lock (lock_pid NULL) is waited out even with the lock free.
        release(pool, &third).await.unwrap();
        let old = acquire(pool, "old", "", ttl).await.unwrap().expect("released");
        let mut four = pool.acquire().await.unwrap().detach();
        assert!(try_lock(&mut four).await.unwrap());
        assert_eq!(acquire_locked(&mut four, "four", "", ttl).await.unwrap(), None, "unexpired, no lock recorded");
        assert!(renew(pool, &old, ttl).await.unwrap(), "the old holder still leads");
    }

    /// A leader paused inside a fenced write (the lease row share-locked) does not hold the
    /// takeover until it wakes: once its lease expired, that transaction's session is ended
    /// with its lock's, and the next replica takes the lease at once.
    #[tokio::test]
    async fn a_leader_paused_inside_a_fenced_write_is_ended_with_its_lock() {
        let Some(db) = db().await else { return };
        let pool = db.pg().unwrap();
        let mut lock = pool.acquire().await.unwrap().detach();
        let mut writing = pool.acquire().await.unwrap().detach();
        let mut taker = pool.acquire().await.unwrap().detach();
        assert!(try_lock(&mut lock).await.unwrap(), "a fresh database's lock is free");
        let paused = acquire_locked(&mut lock, "paused", "", Duration::from_millis(300)).await.unwrap().expect("free");
        sqlx::query("BEGIN").execute(&mut writing).await.unwrap();
        let share = "SELECT 1 FROM leader_lease WHERE name = $1 AND holder = $2 AND epoch = $3 FOR SHARE";
        let held = sqlx::query(share).bind(NAME).bind(&paused.holder).bind(paused.epoch);
        assert!(held.fetch_optional(&mut writing).await.unwrap().is_some(), "the fence passes in its term");

        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(end_expired_holder(pool).await.unwrap());
        assert!(lock_within(&mut taker, 5000).await, "the lock is free once the sessions ended");
        let took = acquire_locked(&mut taker, "taker", "", Duration::from_secs(60));
        let next = tokio::time::timeout(Duration::from_secs(5), took).await;
        let next = next.expect("the open write does not hold the takeover").unwrap().expect("expired");
        assert_eq!(next.epoch, paused.epoch + 1);
        assert!(ping(&mut writing).await.is_err(), "the paused write's session was ended");
        assert!(ping(&mut lock).await.is_err(), "and its lock's");
    }

    /// Tries for the lock every 50 ms for up to `for_ms`; whether it was got.
    async fn lock_within(conn: &mut PgConnection, for_ms: u64) -> bool {
        for _ in 0..for_ms / 50 {
            if try_lock(conn).await.unwrap() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// Whether the session was ended (the server's end of a termination takes a moment).
    async fn ended(conn: &mut PgConnection) -> bool {
        for _ in 0..40 {
            if ping(conn).await.is_err() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// Every session a paused leader's replica opened before its lease expired is ended — a
    /// report flush's open transaction holds node rows the next leader's own flush writes —;
    /// a session opened after the expiry (the replica started again) and another replica's
    /// are not.
    #[tokio::test]
    async fn every_session_of_an_expired_holder_is_ended() {
        let Some(pg) = fleet_devkit::postgres::shared_or_skip("the lease's tests") else { return };
        let url = pg.database().unwrap();
        let paused = Db::open_as(&url, "paused").await.unwrap();
        let other = Db::open_as(&url, "other").await.unwrap();
        let mut lock = paused.pg().unwrap().acquire().await.unwrap().detach();
        let mut flushing = paused.pg().unwrap().acquire().await.unwrap().detach();
        let mut bystander = other.pg().unwrap().acquire().await.unwrap().detach();
        assert!(try_lock(&mut lock).await.unwrap());
        acquire_locked(&mut lock, "paused", "", Duration::from_millis(300)).await.unwrap().expect("free");
        sqlx::query("BEGIN").execute(&mut flushing).await.unwrap();
        sqlx::query("SELECT pg_advisory_xact_lock(7)").execute(&mut flushing).await.unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        let named = <sqlx::postgres::PgConnectOptions as std::str::FromStr>::from_str(&url).unwrap();
        let mut restarted =
            <PgConnection as sqlx::Connection>::connect_with(&named.application_name("paused")).await.unwrap();

        assert!(end_expired_holder(other.pg().unwrap()).await.unwrap());
        assert!(ended(&mut flushing).await, "the open transaction's session was ended");
        assert!(ended(&mut lock).await, "and the lock's");
        assert!(ping(&mut restarted).await.is_ok(), "a session opened after the expiry stays");
        assert!(ping(&mut bystander).await.is_ok(), "another replica's stays");
    }

    /// An unrenewed lease expires in the database's clock and can be taken.
    #[tokio::test]
    async fn an_unrenewed_lease_expires() {
        let Some(db) = db().await else { return };
        let pool = db.pg().unwrap();
        let first = acquire(pool, "one", "", Duration::from_millis(300)).await.unwrap().unwrap();
        assert_eq!(acquire(pool, "two", "", Duration::from_secs(60)).await.unwrap(), None);
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(!renew(pool, &first, Duration::from_secs(60)).await.unwrap(), "too late to renew");
        let second = acquire(pool, "two", "", Duration::from_secs(60)).await.unwrap().expect("expired");
        assert_eq!(second.epoch, first.epoch + 1);
    }
}
