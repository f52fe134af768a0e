//! The engine behind the guard: a Unix socket or TCP, one connection per request (a stop may
//! take as long as an agent's drain, and nothing is kept between calls).

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::path::PathBuf;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

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

    pub(crate) async fn send(&self, req: Request<Full<Bytes>>) -> Result<Response<Incoming>, String> {
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
