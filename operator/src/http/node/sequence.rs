//! The one owner of a node request's steps, whichever transport carries it: the gate
//! (`503`), the node's token (`401`), `since` and `wait` (`400`), the body (`413`, `408`,
//! `400`), the report or the join taken, then the long-poll — the precedence of docs/reference.md#http-api.
//!
//! A transport hands in what the request's head says ([`NodeRequest`]) and a way to read its
//! body ([`ReadBody`]); it gets back the outcome, or a node and a wait to hold ([`Next`]).
//! The hold is the transport's to run because only it knows how to watch its peer meanwhile,
//! and because nothing of the request (its headers, its body) may be kept while it waits.

use super::poll::{self, Wait};
use super::reply::{Outcome, Reply};
use super::{join, report};
use crate::http::app::App;
use crate::http::auth;
use crate::http::body::fits;
use crate::http::error::ApiError;
use crate::http::limits::{BODY_LIMIT, JOIN_LIMIT};
use crate::store::Id;
use fleet_api::protocol;
use std::future::Future;
use std::net::IpAddr;

/// A node route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Join,
    Desired,
    Observed,
    Exchange,
}

impl Route {
    /// The node route a request's method and path name, if any.
    pub fn of(method: &str, path: &str) -> Option<Route> {
        match (method, path) {
            ("POST", protocol::JOIN_PATH) => Some(Route::Join),
            ("GET", protocol::DESIRED_PATH) => Some(Route::Desired),
            ("PUT", protocol::OBSERVED_PATH) => Some(Route::Observed),
            ("POST", protocol::EXCHANGE_PATH) => Some(Route::Exchange),
            _ => None,
        }
    }

    /// The route's name in the metrics.
    pub fn name(self) -> &'static str {
        match self {
            Route::Join => "join",
            Route::Desired => "desired",
            Route::Observed => "observed",
            Route::Exchange => "exchange",
        }
    }

    pub fn has_body(self) -> bool {
        self != Route::Desired
    }
}

/// What the sequence reads of a request's head.
#[derive(Debug, Clone, Copy)]
pub struct NodeRequest<'a> {
    pub route: Route,
    /// The raw query string (`since`, `wait`).
    pub query: Option<&'a str>,
    /// The bearer token of `Authorization`.
    pub token: Option<&'a str>,
    /// The body's declared length; `None` when it has none (a chunked body).
    pub content_length: Option<u64>,
    /// The client's address (behind a trusted proxy, the one it forwarded): the join
    /// throttle counts per address.
    pub client: Option<IpAddr>,
}

/// Why a body was not read.
#[derive(Debug)]
pub enum Unread<G> {
    /// Answered with this (`408`, `413`, `400`).
    Refused(ApiError),
    /// The peer is gone: nothing is answered.
    Gone(G),
}

/// How a transport reads a request's body for the sequence.
pub trait ReadBody {
    type Body: AsRef<[u8]> + Send;
    /// The peer going away while its body was due; a transport that answers even then
    /// names an empty type.
    type Gone: Send;
    /// The whole body, at most `limit` bytes, within the body deadline. A declared length
    /// was checked against `limit` before.
    fn read(&mut self, limit: usize) -> impl Future<Output = Result<Self::Body, Unread<Self::Gone>>> + Send;
}

/// Where a request stands once everything but the long-poll is done.
#[derive(Debug)]
pub enum Next {
    Answer(Outcome),
    Hold(Held),
}

/// A long-poll to hold: the node, known by its token (the start of whose hash is kept, so the
/// poll answers only while the token still is the node's), and its `since` and `wait`.
#[derive(Debug)]
pub struct Held {
    node: Id,
    token_tag: u64,
    wait: Wait,
}

impl Held {
    /// The long-poll's outcome, once the generation changes or the wait runs out. The hold's
    /// own future, not one around it: every held connection keeps it.
    pub fn answer<'a>(&'a self, app: &'a App) -> impl Future<Output = Outcome> + Send + 'a {
        poll::hold(app, &self.node, self.token_tag, self.wait)
    }
}

/// Every step before the long-poll. `Err`: the peer went away meanwhile.
pub async fn prepare<B: ReadBody>(app: &App, req: &NodeRequest<'_>, body: &mut B) -> Result<Next, B::Gone> {
    if app.reconciler.is_none() {
        return Ok(Next::Answer(Err(ApiError::not_configured())));
    }
    if req.route == Route::Join {
        return Box::pin(join(app, req, body)).await.map(Next::Answer);
    }
    app.metrics.node_request(req.route.name());
    let node = match Box::pin(auth::node_by_token(&app.store, req.token, app.offline_after)).await {
        Ok(node) => node,
        Err(e) => return Ok(Next::Answer(Err(e))),
    };
    // A report alone is not held: it has no wait.
    let wait = match req.route {
        Route::Observed => None,
        _ => match poll::parse_wait(req.query) {
            Ok(wait) => Some(wait),
            Err(e) => return Ok(Next::Answer(Err(e))),
        },
    };
    if req.route.has_body() {
        if let Err(e) = take_report(app, &node, req, body).await? {
            return Ok(Next::Answer(Err(e)));
        }
    }
    Ok(match wait {
        None => Next::Answer(Ok(Reply::Accepted)),
        Some(wait) => {
            let token_tag = poll::token_tag(&crate::store::secret::hash(req.token.unwrap_or("")));
            Next::Hold(Held { node, token_tag, wait })
        }
    })
}

/// The report an observed or an exchange carries: read, then taken. Its body is gone when
/// this returns, before any hold.
async fn take_report<B: ReadBody>(
    app: &App,
    node: &Id,
    req: &NodeRequest<'_>,
    body: &mut B,
) -> Result<Result<(), ApiError>, B::Gone> {
    let bytes = match read(req, body, BODY_LIMIT).await {
        Ok(bytes) => bytes,
        Err(Unread::Refused(e)) => return Ok(Err(report::rejected(app, node, e))),
        Err(Unread::Gone(g)) => return Err(g),
    };
    Ok(report::accept(app, node, bytes.as_ref()))
}

/// A join: the throttle, then the body (at most [`JOIN_LIMIT`]); an error reading it is a
/// refused join too.
async fn join<B: ReadBody>(app: &App, req: &NodeRequest<'_>, body: &mut B) -> Result<Outcome, B::Gone> {
    if let Err(e) = join::admitted(app, req.client) {
        return Ok(Err(e));
    }
    let bytes = match read(req, body, JOIN_LIMIT).await {
        Ok(bytes) => Ok(bytes),
        Err(Unread::Refused(e)) => Err(e),
        Err(Unread::Gone(g)) => return Err(g),
    };
    let body = match &bytes {
        Ok(b) => Ok(b.as_ref()),
        Err(e) => Err(e),
    };
    Ok(Box::pin(join::answer(app, req.client, body)).await)
}

/// The body within `limit`: a declared length past it is `413` before a byte is read.
async fn read<B: ReadBody>(req: &NodeRequest<'_>, body: &mut B, limit: usize) -> Result<B::Body, Unread<B::Gone>> {
    fits(req.content_length, limit).map_err(Unread::Refused)?;
    Box::pin(body.read(limit)).await
}
