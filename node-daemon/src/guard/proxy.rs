//! The proxy: HTTP/1.1 from fleet-node, one upstream connection per request to the engine
//! (a Unix socket or TCP). Requests the policy refuses get `403` with a Docker-style JSON body
//! (`{"message": "docker-guard: <rule>"}`, which bollard shows as the error), logged with the
//! rule. Admitted requests and their answers are passed through, streamed (a stop may take as
//! long as an agent's drain).

use super::calls;
use super::files::Tree;
use super::listing;
use super::policy::Policy;
use super::route::{route, Call, Refusal, Route};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixStream};

/// Create bodies are small; anything larger is refused unread.
const MAX_BODY: usize = 1 << 20;
/// The most of a list answer the guard reads to cut it (a host with thousands of containers
/// lists a few MiB).
pub const MAX_LIST: usize = 64 << 20;

pub type Body = BoxBody<Bytes, hyper::Error>;

/// Where the engine listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upstream {
    Unix(PathBuf),
    Tcp(String),
}

impl Upstream {
    /// `unix://PATH` or `tcp://HOST:PORT`.
    pub fn parse(url: &str) -> Result<Upstream, String> {
        if let Some(p) = url.strip_prefix("unix://") {
            return Ok(Upstream::Unix(p.into()));
        }
        if let Some(a) = url.strip_prefix("tcp://") {
            return Ok(Upstream::Tcp(a.trim_end_matches('/').to_string()));
        }
        Err(format!("--docker {url:?} must be unix://PATH or tcp://HOST:PORT"))
    }

    pub(super) async fn send(&self, req: Request<Full<Bytes>>) -> Result<Response<Incoming>, String> {
        let fail = |e: std::io::Error| format!("cannot reach the Docker engine at {self:?}: {e}");
        match self {
            Upstream::Unix(p) => exchange(UnixStream::connect(p).await.map_err(fail)?, req).await,
            Upstream::Tcp(a) => exchange(TcpStream::connect(a).await.map_err(fail)?, req).await,
        }
    }
}

async fn exchange<S>(io: S, req: Request<Full<Bytes>>) -> Result<Response<Incoming>, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(io)).await.map_err(|e| format!("Docker engine: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender.send_request(req).await.map_err(|e| format!("Docker engine: {e}"))
}

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

/// What the guard serves with: the node's policy, its own files, the engine.
pub struct Guard {
    pub policy: Policy,
    pub tree: Tree,
    pub upstream: Upstream,
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

/// What the engine made of a forwarded call.
pub enum Sent {
    Answer(Response<Incoming>),
    Failed(String),
}

impl Sent {
    pub fn into_response(self) -> Response<Body> {
        match self {
            Sent::Answer(resp) => resp.map(|b| b.boxed()),
            Sent::Failed(e) => answer(StatusCode::BAD_GATEWAY, &e),
        }
    }
}

/// Sends the engine `method path` (a path and query the guard built) with `body` (the guard's
/// own serialisation, for a create) and nothing of the client's request but its meaning.
pub async fn forward(g: &Guard, method: &Method, path: &str, body: Option<Vec<u8>>) -> Sent {
    let mut out = Request::builder().method(method.clone()).uri(path).header("host", "docker");
    if body.is_some() {
        out = out.header("content-type", "application/json");
    }
    let Ok(req) = out.body(Full::new(Bytes::from(body.unwrap_or_default()))) else {
        return Sent::Failed("docker-guard: the request cannot be forwarded".into());
    };
    match g.upstream.send(req).await {
        Ok(resp) => Sent::Answer(resp),
        Err(e) => Sent::Failed(e),
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

pub fn answer(status: StatusCode, message: &str) -> Response<Body> {
    json_response(status, serde_json::json!({ "message": message }).to_string().into_bytes())
}

pub fn json_response(status: StatusCode, body: Vec<u8>) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(body)).map_err(|never| match never {}).boxed());
    *resp.status_mut() = status;
    resp.headers_mut().insert("content-type", hyper::header::HeaderValue::from_static("application/json"));
    resp
}
