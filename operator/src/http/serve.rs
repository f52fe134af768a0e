//! The listener loop for both ports: HTTP/1.1 connections served by hyper with a header-read
//! timeout (a client that trickles its request headers — slowloris — is cut off; hyper also
//! runs it while a keep-alive connection waits for its next request, so it bounds idle
//! keep-alives too) and an idle timeout for everything else (a request body that stalls, a
//! response nobody reads, a peer gone in a partition: no byte either way for that long closes
//! the connection). The idle timeout is well above the longest long-poll (60 s), which sends
//! nothing while it waits.
//!
//! At accept the listener also holds `FLEET_MAX_CONNECTIONS_PER_IP` and gives each
//! connection its share of the strangers' budget, with the handle that closes the connection
//! when it is shed (docs/behaviour.md#hardening).

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

use super::app::App;
use super::conn::{self, ConnInfo};
use super::limits::{Timeouts, MAX_HEAD};
use super::peers::{AddressSlot, PerAddress, TrustedProxies};
use super::strangers::Guest;
use std::net::SocketAddr;

/// A TCP stream that fails with `TimedOut` once it has been idle for `idle`, and first
/// yields `read`: bytes the node path already read from it before handing it to hyper.
/// What it reads between requests is held as a stranger's head by `info`.
struct IdleStream {
    inner: TcpStream,
    read: Vec<u8>,
    at: usize,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
    info: Arc<ConnInfo>,
}

impl IdleStream {
    fn new(inner: TcpStream, read: Vec<u8>, idle: Duration, info: Arc<ConnInfo>) -> Self {
        IdleStream { inner, read, at: 0, idle, deadline: Box::pin(tokio::time::sleep(idle)), info }
    }

    fn touched(&mut self) {
        self.deadline.as_mut().reset(Instant::now() + self.idle);
    }

    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        self.deadline.as_mut().poll(cx).is_ready()
    }

    /// After a write: progress resets the idle clock; a write stuck past it fails.
    fn wrote(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        match r {
            Poll::Ready(r) => {
                if matches!(r, Ok(n) if n > 0) {
                    self.touched();
                }
                Poll::Ready(r)
            }
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(timed_out())),
            Poll::Pending => Poll::Pending,
        }
    }
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "connection idle")
}

impl AsyncRead for IdleStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.at < self.read.len() {
            let (at, n) = (self.at, (self.read.len() - self.at).min(buf.remaining()));
            buf.put_slice(&self.read[at..at + n]);
            self.at += n;
            if self.at == self.read.len() {
                (self.read, self.at) = (Vec::new(), 0);
            }
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                let n = buf.filled().len() - before;
                if n > 0 {
                    self.touched();
                }
                if !self.info.read(n) {
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::OutOfMemory, "shed")));
                }
                Poll::Ready(r)
            }
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(timed_out())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncWrite for IdleStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        self.wrote(cx, r)
    }

    /// Forwarded so hyper sees a vectored writer: it then queues a response body behind the
    /// head instead of copying it into a per-connection buffer that keeps the size of the
    /// largest response ever sent (at 10,000 connections that buffer would be most of the memory).
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.wrote(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// At most `max` connections at once; past it new ones are closed at accept and counted.
#[derive(Clone)]
pub struct ConnLimit {
    pub max: usize,
    open: Arc<AtomicUsize>,
    pub refused: prometheus_client::metrics::counter::Counter,
    per_address: Option<PerAddressLimit>,
}

/// `FLEET_MAX_CONNECTIONS_PER_IP`: not applied to a trusted proxy, behind which many clients
/// share one address (theirs is known per request, from `X-Forwarded-For`).
#[derive(Clone)]
struct PerAddressLimit {
    open: Arc<PerAddress>,
    proxies: TrustedProxies,
    refused: prometheus_client::metrics::counter::Counter,
}

impl ConnLimit {
    pub fn new(max: usize, refused: prometheus_client::metrics::counter::Counter) -> ConnLimit {
        ConnLimit { max, open: Arc::new(AtomicUsize::new(0)), refused, per_address: None }
    }

    /// At most `max` connections from one address (none when 0), but from `proxies`.
    pub fn per_address(
        self,
        max: u32,
        proxies: TrustedProxies,
        refused: prometheus_client::metrics::counter::Counter,
    ) -> ConnLimit {
        let per_address = (max > 0).then(|| PerAddressLimit { open: PerAddress::new(max), proxies, refused });
        ConnLimit { per_address, ..self }
    }

    /// A slot for one more connection, released when dropped, and its address's when
    /// counted (the connection's guest keeps it); `None` at a cap.
    fn admit(&self, peer: SocketAddr) -> Option<(ConnSlot, Option<AddressSlot>)> {
        let address = match &self.per_address {
            Some(p) if !p.proxies.trusts(peer.ip()) => match p.open.admit(peer.ip()) {
                Some(slot) => Some(slot),
                None => {
                    p.refused.inc();
                    return None;
                }
            },
            _ => None,
        };
        let n = self.open.fetch_add(1, Ordering::AcqRel);
        if n >= self.max {
            self.open.fetch_sub(1, Ordering::AcqRel);
            self.refused.inc();
            return None;
        }
        Some((ConnSlot(self.open.clone()), address))
    }
}

struct ConnSlot(Arc<AtomicUsize>);

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serves `router` on `listener` until `stop` resolves, then lets open requests finish. With
/// `nodes`, node-route requests are served by the buffer-free path of [`super::node::raw`]
/// and everything else by hyper.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    nodes: Option<Arc<App>>,
    timeouts: Timeouts,
    limit: ConnLimit,
    stop: impl Future<Output = ()>,
) {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.header_read)
        .keep_alive(true)
        .max_header_size(MAX_HEAD)
        .max_buf_size(MAX_HEAD);
    // What only hyper needs, shared: each connection keeps a pointer to it, not a copy of
    // the builder's settings and the router (at 10,000 node connections, most of which
    // never reach hyper).
    let shared = Arc::new(ForHyper {
        nodes,
        router,
        builder,
        timeouts,
        graceful: parking_lot::Mutex::new(Some(GracefulShutdown::new())),
    });
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let Some((slot, address)) = limit.admit(peer) else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let for_hyper = shared.clone();
        let guest = shared.nodes.as_ref().map(|app| app.strangers.guest(address));
        let task = tokio::spawn(connection(stream, slot, guest.clone(), for_hyper));
        if let Some(guest) = guest {
            guest.closes(task.abort_handle());
        }
    }
    drop(listener);
    let Some(graceful) = shared.graceful.lock().take() else { return };
    // Held long-polls may take up to a minute; do not wait for them forever.
    let _ = tokio::time::timeout(Duration::from_secs(5), graceful.shutdown()).await;
}

/// One connection's task: the node path first, hyper for the rest of its life once a request
/// the node path does not serve comes. Every node keeps one of these open, so its size is
/// measured (`tests::a_connection_task_is_small`): the peer's address and the timeouts are
/// read where they are needed, not kept in it. `guest`: the connection's share of the
/// strangers' budget, on the port that serves nodes.
async fn connection(mut stream: TcpStream, slot: ConnSlot, guest: Option<Arc<Guest>>, for_hyper: Arc<ForHyper>) {
    let read = match (&for_hyper.nodes, &guest) {
        (Some(app), Some(guest)) => match super::node::raw::serve(&mut stream, app, &for_hyper.timeouts, guest).await {
            Some(read) => read,
            None => return drop(slot),
        },
        _ => Vec::new(),
    };
    // Boxed: hyper's connection state is large, and inline it would be part of every node
    // connection's task even while the node path serves it.
    let hyper = Box::pin(async move {
        // Past shutdown there is no watcher to give: the connection closes.
        let Some(watcher) = for_hyper.graceful.lock().as_ref().map(GracefulShutdown::watcher) else { return };
        let peer = stream.peer_addr().ok();
        let info = ConnInfo::new(peer.map(|p| p.ip()), guest, read.capacity());
        let io = TokioIo::new(IdleStream::new(stream, read, for_hyper.timeouts.idle, info.clone()));
        let service = TowerToHyperService::new(conn::service(for_hyper.router.clone(), info));
        let conn = watcher.watch(for_hyper.builder.serve_connection(io, service));
        if let Err(e) = conn.await {
            tracing::debug!(peer = ?peer, error = %e, "connection closed");
        }
    });
    hyper.await;
    drop(slot);
}

/// hyper's part of the listener (and the node path's app), shared by its connections.
struct ForHyper {
    /// The app of the node routes' own path, on the port that serves them.
    nodes: Option<Arc<App>>,
    router: Router,
    builder: hyper::server::conn::http1::Builder,
    timeouts: Timeouts,
    /// Taken at shutdown; a connection handed to hyper after that is closed.
    graceful: parking_lot::Mutex<Option<GracefulShutdown>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::sizes::output_size;

    /// A connection's task is what every node keeps for as long as it is connected.
    #[test]
    fn a_connection_task_is_small() {
        let task = output_size(|(s, slot, g, h): (TcpStream, ConnSlot, Option<Arc<Guest>>, Arc<ForHyper>)| {
            connection(s, slot, g, h)
        });
        eprintln!("a connection's task future: {task} bytes");
        // Debug build. With its steps inlined the node path's loop alone is about 950 bytes,
        // and the peer's address and the timeouts kept in the task add about 200.
        assert!(task <= 512, "a connection's task future is {task} bytes");
    }
}
