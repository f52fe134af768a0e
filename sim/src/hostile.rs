//! `fleet-sim --hostile`: clients that try to hold the controller's connections and buffers
//! without credentials (docs/behaviour.md#hardening), run while the simulated nodes keep working. Five kinds:
//! idle connections that send nothing, connections that trickle a request head that never
//! ends, connections that send a join's head and then trickle its body, and the two shapes
//! of the strangers' budget: 63,000 bytes of a head that never ends, and a join's head with
//! 64 KiB of body but its last byte, each then stalling. Each reconnects as
//! soon as the controller closes it, so the pressure lasts the whole window; what closed each
//! connection is counted. Loopback only (the controller this program started), bounded in
//! count by the flags and in time by the window.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

/// How many hostile connections of each kind are held open at once.
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    pub idle: usize,
    pub head: usize,
    pub body: usize,
    pub big_head: usize,
    pub big_join: usize,
}

impl Mix {
    pub fn total(&self) -> usize {
        self.idle + self.head + self.body + self.big_head + self.big_join
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Idle,
    Head,
    Body,
    /// [`BIG_HEAD`] bytes of a head, then nothing.
    BigHead,
    /// A join's head and [`BIG_JOIN_BODY`] bytes of its body but the last, then nothing.
    BigJoin,
}

/// What a big head sends before it stalls: just under the 64 KiB head limit.
pub const BIG_HEAD: usize = 63_000;
/// The join body a big join declares: the 64 KiB join limit.
pub const BIG_JOIN_BODY: usize = 64 * 1024;

/// The first bytes of a [`Kind::BigHead`] or [`Kind::BigJoin`] connection.
fn big_start(kind: Kind) -> Vec<u8> {
    match kind {
        Kind::BigHead => {
            let mut head = HEAD_START.to_vec();
            head.resize(BIG_HEAD, b'a');
            head
        }
        _ => {
            let head = format!(
                "POST /api/v1/nodes:join HTTP/1.1\r\nHost: fleet\r\nContent-Type: application/json\r\n\
                 Content-Length: {BIG_JOIN_BODY}\r\n\r\n{{\"joinKey\": \""
            );
            let mut all = head.into_bytes();
            let body_start = all.len() - 13;
            all.resize(body_start + BIG_JOIN_BODY - 1, b'a');
            all
        }
    }
}

/// A head that never ends: the trickle keeps adding to one header's value.
const HEAD_START: &[u8] = b"GET /api/v1/nodes HTTP/1.1\r\nHost: fleet\r\nX-Trickle: ";
/// A complete join head announcing a 60,000-byte body (within the 64 KiB join limit, so only
/// the body deadline can end it), then the start of the body.
const BODY_START: &[u8] = b"POST /api/v1/nodes:join HTTP/1.1\r\nHost: fleet\r\nContent-Type: application/json\r\n\
Content-Length: 60000\r\n\r\n{\"joinKey\": \"";
/// Sent every [`TRICKLE_EVERY`] by the head and body kinds: slow enough that the head or body
/// never completes before the controller's deadline.
const TRICKLE: &[u8] = b"aaaaaaaaaaaaaaaa";
const TRICKLE_EVERY: Duration = Duration::from_secs(1);

/// Why a hostile connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The window ended; this side closed it.
    Stopped,
    /// The controller closed it without answering (the header-read deadline, the cap).
    Closed,
    /// The controller answered with this status and closed it (`408` for a trickled body).
    Answered(u16),
    /// A read or write failed (a reset).
    Reset,
}

/// What the hostile clients saw, counted as it happens.
#[derive(Debug, Default)]
pub struct Counts {
    pub opened: AtomicU64,
    /// Open right now.
    pub open: AtomicI64,
    pub connect_failed: AtomicU64,
    /// Closed by the controller without an answer (idle and head connections at the
    /// header-read deadline; at the connection cap, at once).
    pub closed_silently: AtomicU64,
    /// Answered `408 request_timeout` (trickled bodies at the body deadline).
    pub answered_408: AtomicU64,
    /// Answered with another status, by status (`429` once failed joins — the `408`s among
    /// them — pass the limit of 20 a second of docs/reference.md#http-api).
    pub answered_other: Mutex<BTreeMap<u16, u64>>,
    pub reset: AtomicU64,
}

impl Counts {
    fn ended(&self, end: End) {
        let c = match end {
            End::Stopped => return,
            End::Closed => &self.closed_silently,
            End::Answered(408) => &self.answered_408,
            End::Answered(status) => {
                *self.answered_other.lock().entry(status).or_default() += 1;
                return;
            }
            End::Reset => &self.reset,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Connections the controller ended, for any reason.
    pub fn closed_by_controller(&self) -> u64 {
        let counted: u64 =
            [&self.closed_silently, &self.answered_408, &self.reset].iter().map(|c| c.load(Ordering::Relaxed)).sum();
        counted + self.answered_other.lock().values().sum::<u64>()
    }
}

/// The hostile clients while they run.
pub struct Attack {
    stop: Arc<AtomicBool>,
    pub counts: Arc<Counts>,
    tasks: JoinSet<()>,
}

impl Attack {
    /// Starts `mix` against `addr`, spreading the first connects over `ramp`.
    pub fn start(addr: SocketAddr, mix: Mix, ramp: Duration) -> Attack {
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Counts::default());
        let mut tasks = JoinSet::new();
        let kinds = [
            (Kind::Idle, mix.idle),
            (Kind::Head, mix.head),
            (Kind::Body, mix.body),
            (Kind::BigHead, mix.big_head),
            (Kind::BigJoin, mix.big_join),
        ];
        let total = mix.total().max(1) as u32;
        let mut i = 0u32;
        for (kind, n) in kinds {
            for _ in 0..n {
                let delay = ramp * i / total;
                i += 1;
                let (stop, counts) = (stop.clone(), counts.clone());
                tasks.spawn(async move {
                    tokio::time::sleep(delay).await;
                    client(addr, kind, &stop, &counts).await;
                });
            }
        }
        Attack { stop, counts, tasks }
    }

    /// Ends the window: every client closes its connection and stops.
    pub async fn stop(mut self) -> Arc<Counts> {
        self.stop.store(true, Ordering::Relaxed);
        while self.tasks.join_next().await.is_some() {}
        self.counts
    }
}

/// One hostile client: connects, holds the connection its way until something ends it, and
/// reconnects, until the window ends.
async fn client(addr: SocketAddr, kind: Kind, stop: &AtomicBool, counts: &Counts) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(stream) = TcpStream::connect(addr).await else {
            counts.connect_failed.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        counts.opened.fetch_add(1, Ordering::Relaxed);
        counts.open.fetch_add(1, Ordering::Relaxed);
        let end = hold(stream, kind, stop).await;
        counts.open.fetch_sub(1, Ordering::Relaxed);
        counts.ended(end);
        // A connection closed at accept (the cap) would otherwise spin this loop.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn hold(mut stream: TcpStream, kind: Kind, stop: &AtomicBool) -> End {
    let start = match kind {
        Kind::Idle => b"".to_vec(),
        Kind::Head => HEAD_START.to_vec(),
        Kind::Body => BODY_START.to_vec(),
        Kind::BigHead | Kind::BigJoin => big_start(kind),
    };
    if stream.write_all(&start).await.is_err() {
        return End::Reset;
    }
    drop(start);
    let trickles = matches!(kind, Kind::Head | Kind::Body);
    let mut buf = [0u8; 512];
    let mut tick = tokio::time::interval(TRICKLE_EVERY);
    tick.tick().await; // the first tick is immediate
    loop {
        tokio::select! {
            r = stream.read(&mut buf) => return match r {
                Ok(0) => End::Closed,
                Ok(n) => End::Answered(status_of(&buf[..n]).unwrap_or(0)),
                Err(_) => End::Reset,
            },
            _ = tick.tick() => {
                if stop.load(Ordering::Relaxed) {
                    return End::Stopped;
                }
                if trickles && stream.write_all(TRICKLE).await.is_err() {
                    return End::Reset;
                }
            }
        }
    }
}

/// The status code of an HTTP/1.1 answer's first line.
fn status_of(answer: &[u8]) -> Option<u16> {
    let line = std::str::from_utf8(answer.split(|b| *b == b'\r').next()?).ok()?;
    line.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[test]
    fn the_big_shapes_are_their_sizes_and_never_end() {
        let head = big_start(Kind::BigHead);
        assert_eq!(head.len(), BIG_HEAD);
        assert!(!head.windows(4).any(|w| w == b"\r\n\r\n"), "the head never ends");
        let join = big_start(Kind::BigJoin);
        let end = join.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        assert_eq!(join.len() - end, BIG_JOIN_BODY - 1, "all of the body but its last byte");
    }

    #[test]
    fn answers_are_read_by_their_status_line() {
        assert_eq!(status_of(b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\n"), Some(408));
        assert_eq!(status_of(b"HTTP/1.1 431"), Some(431));
        assert_eq!(status_of(b"garbage"), None);
    }

    /// A server that answers trickled bodies with `408` after a few bytes and closes idle
    /// connections at once: the attack counts each way it was closed, and reconnects.
    #[tokio::test]
    async fn closes_are_counted_by_how_the_controller_ended_them_and_clients_reconnect() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 256];
                    match tokio::time::timeout(Duration::from_millis(300), s.read(&mut buf)).await {
                        Ok(Ok(n)) if buf[..n].starts_with(b"POST") => {
                            let _ = s.write_all(b"HTTP/1.1 408 Request Timeout\r\n\r\n").await;
                        }
                        _ => {} // idle or a head: closed without an answer
                    }
                });
            }
        });
        let attack = Attack::start(addr, Mix { idle: 2, head: 1, body: 3, big_head: 0, big_join: 0 }, Duration::ZERO);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let counts = attack.stop().await;
        let answered = counts.answered_408.load(Ordering::Relaxed);
        let silent = counts.closed_silently.load(Ordering::Relaxed);
        // Each client was closed at least once and came back.
        assert!(answered >= 3, "408s: {answered}");
        assert!(silent >= 3, "closed without answer: {silent}");
        assert!(counts.opened.load(Ordering::Relaxed) > 6);
        assert_eq!(counts.open.load(Ordering::Relaxed), 0);
        assert!(counts.answered_other.lock().is_empty());
    }
}
