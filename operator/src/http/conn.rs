//! What the requests hyper serves on one connection know of it (docs/behaviour.md#hardening):
//! the peer's address (for the client address of `peers`) and its guest: its share of the
//! strangers' budget, which also counts the credentials that failed on it — the third `401`
//! closes it, whichever path answered the first two. The listener
//! wraps the router per connection ([`service`]); handlers find the [`ConnInfo`] in the
//! request's extensions.

use super::peers::TrustedProxies;
use super::strangers::Guest;
use axum::extract::Request;
use axum::http::header::CONNECTION;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use axum::Router;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tower::ServiceExt;

/// One connection as its requests see it.
pub struct ConnInfo {
    pub peer: Option<IpAddr>,
    /// The connection's share of the budget; `None` on the metrics port.
    pub guest: Option<Arc<Guest>>,
    /// A request is being served: what is read meanwhile is its body, not a head.
    serving: AtomicBool,
    /// Head bytes read since the last request started.
    head: AtomicUsize,
}

impl ConnInfo {
    /// `handed`: the bytes the node path read before it handed the connection over, which
    /// its guest holds already.
    pub fn new(peer: Option<IpAddr>, guest: Option<Arc<Guest>>, handed: usize) -> Arc<ConnInfo> {
        Arc::new(ConnInfo { peer, guest, serving: AtomicBool::new(false), head: AtomicUsize::new(handed) })
    }

    /// The client behind this connection, for a request with `headers`.
    pub fn client(&self, proxies: &TrustedProxies, headers: &HeaderMap) -> Option<IpAddr> {
        let mut forwarded: Option<String> = None;
        for v in headers.get_all("x-forwarded-for") {
            let v = String::from_utf8_lossy(v.as_bytes());
            forwarded = Some(match forwarded {
                Some(all) => format!("{all},{v}"),
                None => v.into_owned(),
            });
        }
        Some(proxies.client(self.peer?, forwarded.as_deref()))
    }

    /// `n` bytes read from the peer. Between requests they are a head, held for a peer not
    /// yet authenticated; `false` when the budget shed this connection.
    pub fn read(&self, n: usize) -> bool {
        let Some(guest) = &self.guest else { return true };
        if n == 0 || self.serving.load(Ordering::Acquire) {
            return true;
        }
        let held = self.head.fetch_add(n, Ordering::AcqRel) + n;
        guest.hold(held)
    }

    /// A request starts (hyper parsed its head: those bytes are its own to free) or ends (a
    /// join's body is gone with it). Either way the connection holds nothing for a stranger.
    fn serving(&self, on: bool) {
        self.serving.store(on, Ordering::Release);
        self.head.store(0, Ordering::Release);
        if let Some(g) = &self.guest {
            g.release();
        }
    }

    /// Counts a `401`; `true` at the third, when the connection closes after this answer.
    fn refused(&self) -> bool {
        self.guest.as_ref().is_some_and(|g| g.refused())
    }
}

/// `router` for the requests of one connection: each carries `info`, and the answer to the
/// third failed credential closes the connection.
pub fn service(
    router: Router,
    info: Arc<ConnInfo>,
) -> impl tower::Service<Request<hyper::body::Incoming>, Response = Response, Error = Infallible, Future: Send> + Clone
{
    tower::service_fn(move |req: Request<hyper::body::Incoming>| {
        let (router, info) = (router.clone(), info.clone());
        async move {
            info.serving(true);
            let mut req = req.map(axum::body::Body::new);
            req.extensions_mut().insert(info.clone());
            let Ok(mut resp) = router.oneshot(req).await;
            info.serving(false);
            if resp.status() == StatusCode::UNAUTHORIZED && info.refused() {
                resp.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
            }
            Ok(resp)
        }
    })
}
