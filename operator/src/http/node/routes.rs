//! The node routes over axum, for the requests hyper carries: those the raw path hands over
//! (a chunked body, `Expect`, a connection that first asked for another route). Each handler
//! gives the request's parts to the sequence and answers what it decides.

use super::reply::Outcome;
use super::sequence::{self, Next, NodeRequest, ReadBody, Route, Unread};
use crate::http::app::App;
use crate::http::auth;
use crate::http::body::{declared, read_all, read_held};
use crate::http::conn::ConnInfo;
use crate::http::strangers::Guest;
use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use axum::Extension;
use fleet_api::{DesiredState, ErrorBody, JoinRequest, JoinResponse, ObservedReport};
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

/// Join with a one-time key (docs/behaviour.md#joining). The node token is shown once.
#[utoipa::path(post, path = "/api/v1/nodes:join", tag = "node", request_body = JoinRequest,
    responses((status = 201, body = JoinResponse),
              (status = 400, description = "invalid_request", body = ErrorBody),
              (status = 401, description = "join_key_invalid", body = ErrorBody),
              (status = 409, description = "node_name_taken", body = ErrorBody),
              (status = 413, description = "payload_too_large", body = ErrorBody),
              (status = 429, description = "too_many_requests: more than 20 failed joins a second from the client's address", body = ErrorBody),
              (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn join(
    State(app): State<Arc<App>>,
    conn: Option<Extension<Arc<ConnInfo>>>,
    headers: HeaderMap,
    body: Body,
) -> Outcome {
    serve(&app, conn, Route::Join, headers, None, body).await
}

/// The node's desired state; held until the generation differs from `since` or `wait` runs out.
#[utoipa::path(get, path = "/api/v1/nodes/me/desired", tag = "node", security(("node" = [])),
    params(("since" = Option<i64>, Query, description = "the generation the node has", minimum = 0),
           ("wait" = Option<u64>, Query, description = "seconds to hold, 0…60 (default 0)", minimum = 0, maximum = 60)),
    responses((status = 200, body = DesiredState), (status = 304, description = "unchanged"),
              (status = 400, description = "invalid_request", body = ErrorBody),
              (status = 429, description = "too_many_requests: more than 4 held polls", body = ErrorBody), (status = 401, description = "node_token_invalid (no token, or a deleted node's), or node_unknown (a token the store never knew: it is older than the node)", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn desired(
    State(app): State<Arc<App>>,
    conn: Option<Extension<Arc<ConnInfo>>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Outcome {
    serve(&app, conn, Route::Desired, headers, query, Body::empty()).await
}

/// What the node has (docs/behaviour.md#desired-state-and-observed-report). Unknown fields are refused, naming the field.
#[utoipa::path(put, path = "/api/v1/nodes/me/observed", tag = "node", security(("node" = [])), request_body = ObservedReport,
    responses((status = 204, description = "accepted (or ignored as stale)"),
              (status = 400, description = "invalid_request", body = ErrorBody),
              (status = 413, description = "payload_too_large", body = ErrorBody), (status = 401, description = "node_token_invalid (no token, or a deleted node's), or node_unknown (a token the store never knew: it is older than the node)", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn observed(
    State(app): State<Arc<App>>,
    conn: Option<Extension<Arc<ConnInfo>>>,
    headers: HeaderMap,
    body: Body,
) -> Outcome {
    serve(&app, conn, Route::Observed, headers, None, body).await
}

/// The report and the long-poll in one request, so a node keeps one connection (docs/behaviour.md#desired-state-and-observed-report):
/// the body is taken as by `PUT observed`, then the answer is that of `GET desired` with the
/// same `since` and `wait`. A refused report is answered `400` and nothing is held.
#[utoipa::path(post, path = "/api/v1/nodes/me/exchange", tag = "node", security(("node" = [])), request_body = ObservedReport,
    params(("since" = Option<i64>, Query, description = "the generation the node has", minimum = 0),
           ("wait" = Option<u64>, Query, description = "seconds to hold, 0…60 (default 0)", minimum = 0, maximum = 60)),
    responses((status = 200, body = DesiredState), (status = 304, description = "report taken; generation unchanged"),
              (status = 400, description = "invalid_request", body = ErrorBody),
              (status = 408, description = "request_timeout", body = ErrorBody),
              (status = 413, description = "payload_too_large", body = ErrorBody),
              (status = 429, description = "too_many_requests: more than 4 held polls", body = ErrorBody), (status = 401, description = "node_token_invalid (no token, or a deleted node's), or node_unknown (a token the store never knew: it is older than the node)", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn exchange(
    State(app): State<Arc<App>>,
    conn: Option<Extension<Arc<ConnInfo>>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    body: Body,
) -> Outcome {
    serve(&app, conn, Route::Exchange, headers, query, body).await
}

/// A body hyper reads. hyper answers whatever happens to the peer meanwhile (a read error is
/// a `400`), so no read loses the request. A join's body is held by the connection's guest
/// (its share of the strangers' budget) as it arrives.
struct HyperBody(Option<Body>, Option<Arc<Guest>>);

impl ReadBody for HyperBody {
    type Body = Bytes;
    type Gone = Infallible;

    fn read(&mut self, limit: usize) -> impl Future<Output = Result<Bytes, Unread<Infallible>>> + Send {
        let body = self.0.take().unwrap_or_else(Body::empty);
        let guest = self.1.take();
        async move {
            match guest {
                Some(guest) => read_held(body, limit, &guest).await.map_err(Unread::Refused),
                None => read_all(body, limit).await.map_err(Unread::Refused),
            }
        }
    }
}

/// One node request over axum: the sequence, then the hold if it comes to one.
async fn serve(
    app: &App,
    conn: Option<Extension<Arc<ConnInfo>>>,
    route: Route,
    headers: HeaderMap,
    query: Option<String>,
    body: Body,
) -> Outcome {
    let conn = conn.map(|Extension(c)| c);
    let guest = conn.as_ref().and_then(|c| c.guest.clone()).filter(|_| route == Route::Join);
    let mut body = HyperBody(Some(body), guest);
    let req = NodeRequest {
        route,
        query: query.as_deref(),
        token: auth::bearer(&headers),
        content_length: declared(&headers),
        client: conn.as_ref().and_then(|c| c.client(&app.proxies, &headers)),
    };
    let Ok(next) = sequence::prepare(app, &req, &mut body).await;
    // The header values are slices of hyper's read buffer: held through a long-poll they keep
    // that buffer alive, and hyper allocates a second one for the connection's next read.
    drop((headers, query, body, conn));
    match next {
        Next::Answer(outcome) => outcome,
        Next::Hold(held) => held.answer(app).await,
    }
}
