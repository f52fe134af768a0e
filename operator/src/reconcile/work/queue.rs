//! A keyed work queue in the shape of kube-runtime's scheduler: a key is queued at most once,
//! a delayed key fires at its earliest requested instant, a key being worked on is not handed
//! out twice (a re-add while in flight runs it again afterwards), and failures back off per
//! key, exponentially with jitter. Workers take keys with `next()` and report with `done()`.
//!
//! Ready keys wait in two lanes: work that must go first and work that can wait (a queue made
//! [`WorkQueue::with_lanes`] names which). Work that can wait runs when nothing else is
//! ready, or as one take in [`SHARE`] while both lanes hold keys, so it is never starved:
//! the order the lanes were filled in does not matter. A new leader's 20,000 status
//! refreshes, queued first, no longer hold back the PAT of the agent added meanwhile.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// What a worker says when it is done with a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done; forget the failure count.
    Done,
    /// Done, and come back at this delay (time-driven work: rotation, revoke after grace).
    RequeueAfter(Duration),
    /// Failed; retry with this key's backoff.
    Failed,
}

pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Backoff {
    /// Delay before retry number `failures` (1-based): base·2^(n-1), capped, ±20 % jitter.
    pub fn delay(&self, failures: u32) -> Duration {
        let exp = self.base.saturating_mul(1u32 << failures.saturating_sub(1).min(20));
        let capped = exp.min(self.max);
        let jitter = 0.8 + rand::random::<f64>() * 0.4;
        capped.mul_f64(jitter)
    }
}

/// While both lanes hold keys, one take in `SHARE` goes to the work that can wait.
pub const SHARE: u32 = 8;

/// Whether a table of `len` keys holds room for many more (worth giving back).
fn roomy(len: usize, cap: usize) -> bool {
    cap > 256 && cap > 4 * len
}

struct Inner<K> {
    ready: VecDeque<K>,
    /// Ready keys of work that can wait.
    later: VecDeque<K>,
    /// Which keys can wait.
    can_wait: fn(&K) -> bool,
    /// Takes from `ready` in a row while `later` held keys.
    streak: u32,
    queued: HashSet<K>,
    /// Delayed keys in the order they fall due (one ordered index, not a timer per key;
    /// 100,000 PATs wait here for their rotation), the sequence number breaking ties.
    delayed: BTreeMap<(Instant, u64), K>,
    /// When each delayed key falls due, so an earlier request can move it.
    delayed_at: HashMap<K, (Instant, u64)>,
    in_flight: HashSet<K>,
    again: HashSet<K>,
    failures: HashMap<K, u32>,
    seq: u64,
}

pub struct WorkQueue<K> {
    inner: Mutex<Inner<K>>,
    notify: Notify,
    backoff: Backoff,
}

impl<K: Clone + Eq + Hash> WorkQueue<K> {
    pub fn new(backoff: Backoff) -> Self {
        Self::with_lanes(backoff, |_| false)
    }

    /// A queue whose keys for which `can_wait` holds run behind the others.
    pub fn with_lanes(backoff: Backoff, can_wait: fn(&K) -> bool) -> Self {
        WorkQueue {
            inner: Mutex::new(Inner {
                ready: VecDeque::new(),
                later: VecDeque::new(),
                can_wait,
                streak: 0,
                queued: HashSet::new(),
                delayed: BTreeMap::new(),
                delayed_at: HashMap::new(),
                in_flight: HashSet::new(),
                again: HashSet::new(),
                failures: HashMap::new(),
                seq: 0,
            }),
            notify: Notify::new(),
            backoff,
        }
    }

    /// Queue `key` now (a no-op when already queued).
    pub fn add(&self, key: K) {
        let mut g = self.inner.lock();
        Self::add_locked(&mut g, key);
        drop(g);
        self.notify.notify_one();
    }

    fn add_locked(g: &mut Inner<K>, key: K) {
        if g.in_flight.contains(&key) {
            g.again.insert(key);
            return;
        }
        if let Some(slot) = g.delayed_at.remove(&key) {
            g.delayed.remove(&slot);
        }
        if g.queued.insert(key.clone()) {
            match (g.can_wait)(&key) {
                true => g.later.push_back(key),
                false => g.ready.push_back(key),
            }
        }
    }

    /// Queue `key` after `delay`; an earlier request for the same key wins.
    pub fn add_after(&self, key: K, delay: Duration) {
        let at = Instant::now() + delay;
        let mut g = self.inner.lock();
        if g.queued.contains(&key) {
            return;
        }
        if let Some(&(old, seq)) = g.delayed_at.get(&key) {
            if old <= at {
                return;
            }
            g.delayed.remove(&(old, seq));
        }
        g.seq += 1;
        let seq = g.seq;
        g.delayed.insert((at, seq), key.clone());
        g.delayed_at.insert(key, (at, seq));
        drop(g);
        self.notify.notify_one();
    }

    /// Whether `key` will run: queued, delayed or being worked on.
    pub fn scheduled(&self, key: &K) -> bool {
        let g = self.inner.lock();
        g.queued.contains(key) || g.delayed_at.contains_key(key) || g.in_flight.contains(key)
    }

    /// Keys ready to run now ahead of the work that can wait (not delayed, not in flight).
    pub fn ready_len(&self) -> usize {
        self.inner.lock().ready.len()
    }

    /// Keys waiting (ready in either lane, and delayed), for the queue-depth metric.
    pub fn depth(&self) -> usize {
        let g = self.inner.lock();
        g.ready.len() + g.later.len() + g.delayed.len()
    }

    fn try_take(&self) -> Result<K, Option<Instant>> {
        let mut g = self.inner.lock();
        let now = Instant::now();
        while let Some(entry) = g.delayed.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let k = entry.remove();
            g.delayed_at.remove(&k);
            Self::add_locked(&mut g, k);
        }
        if let Some(k) = Self::pop_ready(&mut g) {
            g.queued.remove(&k);
            g.in_flight.insert(k.clone());
            if g.ready.is_empty() && g.later.is_empty() {
                Self::trim(&mut g);
            }
            return Ok(k);
        }
        Err(g.delayed.keys().next().map(|(at, _)| *at))
    }

    /// The next ready key: from the lane that must go first, but for one take in [`SHARE`]
    /// while the other lane holds keys.
    fn pop_ready(g: &mut Inner<K>) -> Option<K> {
        if g.later.is_empty() {
            g.streak = 0;
            return g.ready.pop_front();
        }
        if g.ready.is_empty() || g.streak + 1 >= SHARE {
            g.streak = 0;
            return g.later.pop_front();
        }
        g.streak += 1;
        g.ready.pop_front()
    }

    /// Gives back the room a wave of keys left (a fleet coming up queues a PAT item per
    /// replica at once): tables and rings keep their largest size otherwise, ~100 bytes per
    /// key for as long as the process runs.
    fn trim(g: &mut Inner<K>) {
        if roomy(g.ready.len(), g.ready.capacity()) {
            g.ready.shrink_to(g.ready.len() * 2);
        }
        if roomy(g.later.len(), g.later.capacity()) {
            g.later.shrink_to(g.later.len() * 2);
        }
        if roomy(g.queued.len(), g.queued.capacity()) {
            g.queued.shrink_to(g.queued.len() * 2);
        }
        if roomy(g.delayed_at.len(), g.delayed_at.capacity()) {
            g.delayed_at.shrink_to(g.delayed_at.len() * 2);
        }
    }

    /// The next key to work on; waits until one is due.
    pub async fn next(&self) -> K {
        loop {
            let notified = self.notify.notified();
            match self.try_take() {
                Ok(k) => {
                    // more may be ready: let another worker look too
                    self.notify.notify_one();
                    return k;
                }
                Err(Some(at)) => {
                    tokio::select! {
                        _ = notified => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                Err(None) => notified.await,
            }
        }
    }

    /// Reports the end of work on `key`. Returns the retry delay when it failed.
    pub fn done(&self, key: &K, outcome: Outcome) -> Option<Duration> {
        let mut g = self.inner.lock();
        g.in_flight.remove(key);
        if roomy(g.failures.len(), g.failures.capacity()) {
            let n = g.failures.len();
            g.failures.shrink_to(n * 2);
        }
        let again = g.again.remove(key);
        let retry = match outcome {
            Outcome::Done => {
                g.failures.remove(key);
                None
            }
            Outcome::RequeueAfter(_) => {
                g.failures.remove(key);
                None
            }
            Outcome::Failed => {
                let n = g.failures.entry(key.clone()).or_insert(0);
                *n += 1;
                Some(self.backoff.delay(*n))
            }
        };
        if again && retry.is_none() {
            Self::add_locked(&mut g, key.clone());
        }
        drop(g);
        match (outcome, retry) {
            (_, Some(d)) => self.add_after(key.clone(), d),
            (Outcome::RequeueAfter(d), None) => self.add_after(key.clone(), d),
            _ => {}
        }
        self.notify.notify_one();
        retry
    }

    /// Consecutive failures of `key`.
    pub fn failures(&self, key: &K) -> u32 {
        self.inner.lock().failures.get(key).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q() -> WorkQueue<&'static str> {
        WorkQueue::new(Backoff { base: Duration::from_secs(1), max: Duration::from_secs(60) })
    }

    #[tokio::test(start_paused = true)]
    async fn dedups_and_keeps_order() {
        let q = q();
        q.add("a");
        q.add("b");
        q.add("a");
        assert_eq!(q.depth(), 2);
        assert_eq!(q.next().await, "a");
        assert_eq!(q.next().await, "b");
    }

    #[tokio::test(start_paused = true)]
    async fn in_flight_key_is_not_handed_out_twice_but_runs_again() {
        let q = q();
        q.add("a");
        let k = q.next().await;
        q.add("a");
        assert_eq!(q.depth(), 0, "held back while in flight");
        q.done(&k, Outcome::Done);
        assert_eq!(q.next().await, "a");
    }

    #[tokio::test(start_paused = true)]
    async fn scheduled_while_queued_delayed_or_in_flight() {
        let q = q();
        assert!(!q.scheduled(&"a"));
        q.add("a");
        assert!(q.scheduled(&"a"), "queued");
        let k = q.next().await;
        assert!(q.scheduled(&"a"), "in flight");
        q.done(&k, Outcome::RequeueAfter(Duration::from_secs(60)));
        assert!(q.scheduled(&"a"), "delayed");
        assert_eq!(q.next().await, "a");
        q.done(&"a", Outcome::Done);
        assert!(!q.scheduled(&"a"), "done");
    }

    #[tokio::test(start_paused = true)]
    async fn earliest_delay_wins() {
        let q = q();
        let start = Instant::now();
        q.add_after("a", Duration::from_secs(10));
        q.add_after("a", Duration::from_secs(3));
        q.add_after("a", Duration::from_secs(7));
        assert_eq!(q.next().await, "a");
        assert_eq!(Instant::now() - start, Duration::from_secs(3));
        assert_eq!(q.depth(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_exponentially_and_reset() {
        let q = q();
        q.add("a");
        let mut delays = vec![];
        for _ in 0..4 {
            let k = q.next().await;
            delays.push(q.done(&k, Outcome::Failed).unwrap());
        }
        for (d, base) in delays.iter().zip([1.0, 2.0, 4.0, 8.0]) {
            let s = d.as_secs_f64();
            assert!(s >= base * 0.8 && s <= base * 1.2, "{s} vs {base}");
        }
        let k = q.next().await;
        assert_eq!(q.failures(&k), 4);
        q.done(&k, Outcome::Done);
        assert_eq!(q.failures(&"a"), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn requeue_after_fires_later() {
        let q = q();
        q.add("rotate");
        let k = q.next().await;
        let t = Instant::now();
        q.done(&k, Outcome::RequeueAfter(Duration::from_secs(30)));
        assert_eq!(q.next().await, "rotate");
        assert_eq!(Instant::now() - t, Duration::from_secs(30));
    }

    /// The room a wave of keys took is given back once it has drained.
    #[tokio::test(start_paused = true)]
    async fn a_drained_wave_gives_its_room_back() {
        let q: WorkQueue<u32> = WorkQueue::new(Backoff { base: Duration::from_secs(1), max: Duration::from_secs(60) });
        for k in 0..10_000 {
            q.add(k);
        }
        let caps = |q: &WorkQueue<u32>| {
            let g = q.inner.lock();
            (g.ready.capacity(), g.queued.capacity(), g.failures.capacity())
        };
        assert!(caps(&q).0 >= 10_000);
        for _ in 0..10_000 {
            let k = q.next().await;
            q.done(&k, Outcome::Done);
        }
        let (ready, queued, _) = caps(&q);
        assert!(ready <= 256 && queued <= 256, "{ready} {queued}");
    }

    /// Keys that can wait, queued first, go behind the others queued after them, but for one
    /// take in `SHARE` while both lanes hold keys.
    #[tokio::test(start_paused = true)]
    async fn work_that_can_wait_goes_behind_whatever_the_order_it_was_queued_in() {
        let q: WorkQueue<u32> =
            WorkQueue::with_lanes(Backoff { base: Duration::from_secs(1), max: Duration::from_secs(60) }, |k| {
                *k >= 100
            });
        for k in 100..120 {
            q.add(k);
        }
        q.add(1);
        assert_eq!(q.ready_len(), 1, "only the work that must go first counts as ready");
        assert_eq!(q.depth(), 21);
        assert_eq!(q.next().await, 1, "queued last, taken first");
        for k in 2..20 {
            q.add(k);
        }
        let taken: Vec<u32> = futures::future::join_all((0..16).map(|_| q.next())).await;
        let waited = taken.iter().filter(|k| **k >= 100).count();
        assert_eq!(waited, 2, "one take in SHARE while both lanes hold keys: {taken:?}");
    }

    #[test]
    fn backoff_caps() {
        let b = Backoff { base: Duration::from_secs(1), max: Duration::from_secs(60) };
        assert!(b.delay(30) <= Duration::from_secs(72));
    }
}
