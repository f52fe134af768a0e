//! How the guard answers and forwards (docs/behaviour.md#what-the-guard-checks-and-why): what it
//! serves with, the call it sends the engine — a method, a path and query it built itself and
//! its own serialisation of a body, nothing of the client's request but its meaning — and the
//! Docker-style JSON answers it makes itself.

use super::files::Tree;
use super::policy::Policy;
use super::upstream::Upstream;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};

pub type Body = BoxBody<Bytes, hyper::Error>;

/// What the guard serves with: the node's policy, its own files, the engine.
pub struct Guard {
    pub policy: Policy,
    pub tree: Tree,
    pub upstream: Upstream,
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

pub fn answer(status: StatusCode, message: &str) -> Response<Body> {
    json_response(status, serde_json::json!({ "message": message }).to_string().into_bytes())
}

pub fn json_response(status: StatusCode, body: Vec<u8>) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(body)).map_err(|never| match never {}).boxed());
    *resp.status_mut() = status;
    resp.headers_mut().insert("content-type", hyper::header::HeaderValue::from_static("application/json"));
    resp
}
