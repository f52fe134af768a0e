//! Slow and idle clients over real sockets: a client that trickles its request headers is cut
//! off after the header-read timeout, so is a keep-alive connection that sends no next
//! request, a request body that stalls is cut off after the idle timeout, and none of them
//! holds up a well-behaved client meanwhile.

mod support;

use std::time::{Duration, Instant};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads until the server closes the connection; returns what arrived and how long it took.
async fn read_until_closed(s: &mut TcpStream, limit: Duration) -> (String, Duration) {
    let t = Instant::now();
    let mut buf = Vec::new();
    let r = tokio::time::timeout(limit, s.read_to_end(&mut buf)).await;
    assert!(r.is_ok(), "the server kept the connection open for {limit:?}");
    (String::from_utf8_lossy(&buf).into_owned(), t.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_read_and_idle_timeouts_close_slow_and_quiet_connections() {
    let dk = devkit().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = in_process_config(&dk, dir.path());
    cfg.http_timeouts.header_read = Duration::from_secs(1);
    cfg.http_timeouts.idle = Duration::from_secs(3);
    let running = fleet_controller::server::start(cfg).await.unwrap();
    let addr = running.addr;

    // Slowloris: half a request head, then a byte now and then, never the blank line.
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let trickle = tokio::spawn({
        let mut w = slow.try_clone_for_test();
        async move {
            for _ in 0..20 {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if w.write_all(b"X-A: b\r\n").await.is_err() {
                    break;
                }
            }
        }
    });
    // Meanwhile a normal client is served at once.
    let ok = reqwest::get(format!("http://{addr}/healthz")).await.unwrap();
    assert_eq!(ok.status(), 200);
    let (got, took) = read_until_closed(&mut slow, Duration::from_secs(6)).await;
    assert!(!got.contains("200 OK"), "a trickled head is never answered: {got}");
    assert!(took < Duration::from_secs(4), "closed after the 1 s header-read timeout, took {took:?}");
    trickle.abort();

    // Idle keep-alive: one full request, then silence.
    let mut quiet = TcpStream::connect(addr).await.unwrap();
    quiet.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut first = [0u8; 12];
    quiet.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    let (_, took) = read_until_closed(&mut quiet, Duration::from_secs(10)).await;
    assert!(took >= Duration::from_millis(900), "not closed before the keep-alive limit: {took:?}");

    // A body that stalls: the head arrives whole, 10 of 100 bytes follow, then nothing.
    let mut stalled = TcpStream::connect(addr).await.unwrap();
    stalled
        .write_all(b"POST /api/v1/nodes:join HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"joinKey\"")
        .await
        .unwrap();
    let (got, took) = read_until_closed(&mut stalled, Duration::from_secs(10)).await;
    assert!(!got.contains("201"), "{got}");
    assert!(took >= Duration::from_secs(2), "the head was complete, so the idle timeout (3 s) decides: {took:?}");
    running.shutdown().await;
}

trait TryCloneForTest {
    fn try_clone_for_test(&self) -> TcpStream;
}

impl TryCloneForTest for TcpStream {
    /// A second handle on the same socket (dup'ed fd) so one task can write while another reads.
    fn try_clone_for_test(&self) -> TcpStream {
        let std = {
            use std::os::fd::{AsFd, BorrowedFd};
            let fd: BorrowedFd<'_> = self.as_fd();
            std::net::TcpStream::from(fd.try_clone_to_owned().unwrap())
        };
        std.set_nonblocking(true).unwrap();
        TcpStream::from_std(std).unwrap()
    }
}
