//! The proxy: HTTP/1.1 from fleet-node, one upstream connection per request to the engine
//! (a Unix socket or TCP). Requests the policy refuses get `403` with a Docker-style JSON body
//! (`{"message": "docker-guard: <rule>"}`, which bollard shows as the error), logged with the
//! rule. Admitted requests and their answers are passed through, streamed (a stop may take as
//! long as an agent's drain).

use super::calls;
use super::forward::{answer, forward, json_response, Body, Guard, Sent};
use super::listing;
use super::policy::Policy;
use super::route::{route, Call, Refusal, Route};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixStream};

/// Create bodies are small; anything larger is refused unread.
const MAX_BODY: usize = 1 << 20;
/// The most of a list answer the guard reads to cut it (a host with thousands of containers
/// lists a few MiB).
pub const MAX_LIST: usize = 64 << 20;

/// Where the guard listens: TCP, or a Unix socket (shared with the node on a private volume,
/// so nothing else on the host can reach it).
pub enum Listener {
    Tcp(TcpListener),
    Unix(tokio::net::UnixListener),
}

impl Listener {
    /// `unix://PATH` (a stale socket file there is replaced; the socket is made usable by the
    /// node's uid) or `ADDR:PORT`.
    pub async fn bind(spec: &str) -> Result<Listener, String> {
        if let Some(path) = spec.strip_prefix("unix://") {
            let _ = std::fs::remove_file(path);
            let l = tokio::net::UnixListener::bind(path).map_err(|e| format!("cannot listen on {path}: {e}"))?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
                .map_err(|e| format!("cannot open {path} to the node: {e}"))?;
            return Ok(Listener::Unix(l));
        }
        let addr: std::net::SocketAddr =
            spec.parse().map_err(|_| format!("--listen {spec:?} must be ADDR:PORT or unix://PATH"))?;
        TcpListener::bind(addr).await.map(Listener::Tcp).map_err(|e| format!("cannot listen on {addr}: {e}"))
    }

    async fn accept(&self) -> std::io::Result<Conn> {
        match self {
            Listener::Tcp(l) => l.accept().await.map(|(s, _)| Conn::Tcp(s)),
            Listener::Unix(l) => l.accept().await.map(|(s, _)| Conn::Unix(s)),
        }
    }
}

enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// Serves the guard on `listener` until the process ends.
pub async fn serve(guard: Guard, listener: Listener) {
    let shared = Arc::new(guard);
    loop {
        let conn = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let shared = shared.clone();
        match conn {
            Conn::Tcp(s) => tokio::spawn(serve_conn(s, shared)),
            Conn::Unix(s) => tokio::spawn(serve_conn(s, shared)),
        };
    }
}

async fn serve_conn<S>(stream: S, shared: Arc<Guard>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| {
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(handle(&shared, req).await) }
    });
    if let Err(e) = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await {
        tracing::debug!(error = %e, "guard connection closed");
    }
}

async fn handle(g: &Guard, req: Request<Incoming>) -> Response<Body> {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let call = match route(method.as_str(), &path, req.uri().query()) {
        Ok(c) => c,
        Err(r) => return refused(method.as_str(), &path, r),
    };
    let bytes = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return answer(StatusCode::PAYLOAD_TOO_LARGE, "docker-guard: the body is larger than 1 MiB"),
    };
    if !call.route.takes_body() && !bytes.is_empty() {
        let r = Refusal(format!("a body on {method} is refused: only the create calls carry one"));
        return refused(method.as_str(), &path, r);
    }
    match dispatch(g, &method, &call, &bytes).await {
        Ok(resp) => resp,
        Err(r) => refused(method.as_str(), &path, r),
    }
}

async fn dispatch(g: &Guard, method: &Method, call: &Call, bytes: &[u8]) -> calls::Outcome {
    match &call.route {
        Route::CreateContainer => calls::create_container(g, call, bytes).await,
        Route::CreateVolume => calls::create_volume(g, call, bytes).await,
        Route::Container(reference, action) => calls::container(g, call, reference, *action).await,
        Route::InspectImage(name) => calls::inspect_image(g, call, name).await,
        Route::Busy(reference) => Ok(calls::busy(g, reference).await),
        Route::ListContainers => Ok(list(g, call, listing::containers).await),
        Route::ListVolumes => Ok(list(g, call, listing::volumes).await),
        Route::Plain(_) => Ok(forward(g, method, &call.forward_path(""), None).await.into_response()),
    }
}

async fn list(g: &Guard, call: &Call, cut: fn(&Policy, &[u8]) -> Result<Vec<u8>, String>) -> Response<Body> {
    match forward(g, &Method::GET, &call.forward_path(""), None).await {
        Sent::Answer(resp) => cut_list(resp, |b| cut(&g.policy, b)).await,
        failed => failed.into_response(),
    }
}

/// A list answer cut to this node's objects; an answer that is not a success passes as is.
async fn cut_list(resp: Response<Incoming>, cut: impl Fn(&[u8]) -> Result<Vec<u8>, String>) -> Response<Body> {
    if !resp.status().is_success() {
        return resp.map(|b| b.boxed());
    }
    let bytes = match Limited::new(resp.into_body(), MAX_LIST).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return answer(StatusCode::BAD_GATEWAY, &format!("docker-guard: the engine's list: {e}")),
    };
    match cut(&bytes) {
        Ok(body) => json_response(StatusCode::OK, body),
        Err(e) => answer(StatusCode::BAD_GATEWAY, &format!("docker-guard: the engine's {e}")),
    }
}

fn refused(method: &str, path: &str, r: Refusal) -> Response<Body> {
    tracing::warn!(method, path, rule = %r.0, "docker-guard refused a request");
    answer(StatusCode::FORBIDDEN, &format!("docker-guard: {}", r.0))
}
