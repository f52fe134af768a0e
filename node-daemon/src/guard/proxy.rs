//! The proxy: HTTP/1.1 from fleet-node, one upstream connection per request to the engine
//! (a Unix socket or TCP). Requests the policy refuses get `403` with a Docker-style JSON body
//! (`{"message": "docker-guard: <rule>"}`, which bollard shows as the error), logged with the
//! rule. Admitted requests and their answers are passed through, streamed (a stop may take as
//! long as an agent's drain).

use super::listing;
use super::policy::Policy;
use super::route::{route, Refusal, Route};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
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
const MAX_LIST: usize = 64 << 20;

type Body = BoxBody<Bytes, hyper::Error>;

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

    async fn send(&self, req: Request<Full<Bytes>>) -> Result<Response<Incoming>, String> {
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

/// Serves the guard on `listener` until the process ends.
pub async fn serve(policy: Policy, listener: Listener, upstream: Upstream) {
    let shared = Arc::new((policy, upstream));
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

async fn serve_conn<S>(stream: S, shared: Arc<(Policy, Upstream)>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| {
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(handle(&shared.0, &shared.1, req).await) }
    });
    if let Err(e) = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await {
        tracing::debug!(error = %e, "guard connection closed");
    }
}

async fn handle(policy: &Policy, upstream: &Upstream, req: Request<Incoming>) -> Response<Body> {
    let (method, path) = (req.method().to_string(), req.uri().path().to_string());
    let route = match route(&method, &path) {
        Ok(r) => r,
        Err(r) => return refused(&method, &path, r),
    };
    let (parts, body) = req.into_parts();
    let bytes = match Limited::new(body, MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return answer(StatusCode::PAYLOAD_TOO_LARGE, "docker-guard: the body is larger than 1 MiB"),
    };
    if !route.takes_body() && !bytes.is_empty() {
        let r = Refusal(format!("a body on {method} is refused: only the create calls carry one"));
        return refused(&method, &path, r);
    }
    let query = parts.uri.query();
    let checked = match &route {
        Route::CreateContainer => policy.container_request(query, &bytes).map(Bytes::from),
        Route::CreateVolume => policy.volume_request(&bytes).map(Bytes::from),
        Route::Container(id) => match owned(policy, upstream, id).await {
            Ok(r) => r.map(|()| bytes),
            Err(e) => return answer(StatusCode::BAD_GATEWAY, &e),
        },
        Route::Plain | Route::ListContainers | Route::ListVolumes | Route::InspectImage => Ok(bytes),
    };
    let forwarded = match checked {
        Ok(b) => b,
        Err(r) => return refused(&method, &path, r),
    };
    let Some(out) = forward_request(&parts, &route, forwarded) else {
        return answer(StatusCode::BAD_REQUEST, "docker-guard: the request cannot be forwarded");
    };
    let resp = match upstream.send(out).await {
        Ok(resp) => resp,
        Err(e) => return answer(StatusCode::BAD_GATEWAY, &e),
    };
    match route {
        Route::ListContainers => cut_list(resp, |b| listing::containers(policy, b)).await,
        Route::ListVolumes => cut_list(resp, |b| listing::volumes(policy, b)).await,
        _ => resp.map(|b| b.boxed()),
    }
}

/// The request as the engine gets it: the checked body (a create's is the guard's own
/// serialisation), the client's headers but those about the connection and the body's framing.
fn forward_request(parts: &hyper::http::request::Parts, route: &Route, body: Bytes) -> Option<Request<Full<Bytes>>> {
    let mut out =
        Request::builder().method(parts.method.clone()).uri(parts.uri.path_and_query().map_or("/", |p| p.as_str()));
    for (name, value) in &parts.headers {
        let framing = matches!(
            name.as_str(),
            "host"
                | "connection"
                | "keep-alive"
                | "transfer-encoding"
                | "content-length"
                | "content-type"
                | "expect"
                | "upgrade"
        );
        if !framing {
            out = out.header(name, value);
        }
    }
    if route.takes_body() {
        out = out.header("content-type", "application/json");
    }
    out.header("host", "docker").body(Full::new(body)).ok()
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

/// Whether container `id` is one of this node's, asked of the engine; one the engine does
/// not know is let through (it answers 404 itself).
async fn owned(policy: &Policy, upstream: &Upstream, id: &str) -> Result<Result<(), Refusal>, String> {
    let req = Request::get(format!("/containers/{id}/json"))
        .header("host", "docker")
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let resp = upstream.send(req).await?;
    if resp.status() == StatusCode::NOT_FOUND {
        return Ok(Ok(()));
    }
    let status = resp.status();
    let body = resp.into_body().collect().await.map_err(|e| format!("Docker engine: {e}"))?.to_bytes();
    if !status.is_success() {
        return Err(format!("Docker engine answered {status} to the ownership check of {id}"));
    }
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let labels = &v["Config"]["Labels"];
    if policy.owns(|k| labels.get(k).and_then(serde_json::Value::as_str)) {
        Ok(Ok(()))
    } else {
        Ok(Err(Refusal(format!("container {id} is not one of node {}'s (fleet.node label)", policy.node))))
    }
}

fn refused(method: &str, path: &str, r: Refusal) -> Response<Body> {
    tracing::warn!(method, path, rule = %r.0, "docker-guard refused a request");
    answer(StatusCode::FORBIDDEN, &format!("docker-guard: {}", r.0))
}

fn answer(status: StatusCode, message: &str) -> Response<Body> {
    json_response(status, serde_json::json!({ "message": message }).to_string().into_bytes())
}

fn json_response(status: StatusCode, body: Vec<u8>) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(body)).map_err(|never| match never {}).boxed());
    *resp.status_mut() = status;
    resp.headers_mut().insert("content-type", hyper::header::HeaderValue::from_static("application/json"));
    resp
}
