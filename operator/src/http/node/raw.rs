//! The node routes' own HTTP/1.1 path. 10,000 nodes each hold a connection whose request
//! waits up to a minute; through hyper every one of them keeps a read and a write buffer
//! (8 KiB each at least, not configurable lower) for as long as it is open. Here a connection
//! that waits keeps no buffer: between requests it waits for readability with nothing
//! allocated, a request head is read into a buffer sized to what arrived, the body into one
//! sized to `content-length`, and both are freed before the request is held. The answer is
//! written from the shared desired-state body. What is answered is decided by the node
//! sequence ([`super::sequence`]) and written from the same [`Answer`] as axum's response,
//! so both paths answer alike; this module only reads and writes.
//!
//! Every connection starts here. A request this path does not serve — any other route, a
//! chunked or `Expect` body, an upgrade, a head it cannot parse — hands the connection to
//! hyper with the bytes read so far, for the rest of its life. The limits of docs/behaviour.md#hardening hold on
//! both paths: the head within the header-read timeout and 64 KiB (`431`), a body within
//! 10 s of its head (`408`) and 1 MiB (`413`), nothing written or read for the idle timeout.
//! What a head and a join body hold before the peer has authenticated comes out of the
//! listener's budget for strangers ([`Guest`]); a connection shed from it closes.

use super::reply::{self, Outcome};
use super::sequence::{self, Next, NodeRequest, ReadBody, Route, Unread};
use crate::http::answer::{Answer, JSON};
use crate::http::app::App;
use crate::http::auth;
use crate::http::error::ApiError;
use crate::http::limits::{Timeouts, BODY_DEADLINE, MAX_HEAD};
use crate::http::peers::TrustedProxies;
use crate::http::strangers::Guest;
use axum::http::StatusCode;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::io::ReadBuf;
use tokio::net::TcpStream;
use tokio::time::{timeout, timeout_at, Instant};

/// Most headers a node request carries is about eight; more goes to hyper (which allows 100).
const MAX_HEADERS: usize = 32;
/// The first read of a head takes at most this; the buffer doubles while the head is longer.
const FIRST_READ: usize = 1024;
/// A body up to this is written in one piece with its head.
const COALESCE: usize = 16 * 1024;

/// What a node request's head says, owned so the read buffer can go.
#[derive(Debug)]
struct Head {
    route: Route,
    // Boxed strings and a `u32` length: a held request keeps its head.
    query: Option<Box<str>>,
    token: Option<Box<str>>,
    content_length: u64,
    /// The client asked to close after this answer (or speaks HTTP/1.0).
    close: bool,
    /// Bytes of the head in the buffer.
    len: u32,
}

impl Head {
    /// What the sequence reads of the head, from `client`.
    fn request(&self, client: Option<IpAddr>) -> NodeRequest<'_> {
        NodeRequest {
            route: self.route,
            query: self.query.as_deref(),
            token: self.token.as_deref(),
            content_length: Some(self.content_length),
            client,
        }
    }
}

enum Parsed {
    /// More bytes are needed.
    Partial,
    Node(Head),
    /// Not for this path: hyper takes the connection.
    Other,
    /// Answered with this, and the connection closed.
    Bad(ApiError),
}

/// Digits only (docs/behaviour.md#hardening): `+5`, `5,5`, `5 5` and `0x5` are refused here
/// on every route, as hyper refuses them on the connections it serves.
fn content_length(value: &[u8]) -> Option<u64> {
    let v = value.trim_ascii();
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// `400` for a `Content-Length` that is not digits only.
fn bad_length(headers: &[httparse::Header<'_>]) -> Option<ApiError> {
    let bad =
        headers.iter().any(|h| h.name.eq_ignore_ascii_case("content-length") && content_length(h.value).is_none());
    bad.then(|| ApiError::invalid_request(crate::http::limits::BAD_CONTENT_LENGTH))
}

fn parse_head(buf: &[u8]) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Ok(httparse::Status::Complete(n)) => n,
        Err(_) => return Parsed::Other,
    };
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Parsed::Other;
    };
    if let Some(e) = bad_length(req.headers) {
        return Parsed::Bad(e);
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q.into())),
        None => (target, None),
    };
    let Some(route) = Route::of(method, path) else { return Parsed::Other };
    let mut head = Head { route, query, token: None, content_length: 0, close: version == 0, len: len as u32 };
    let mut lengths = 0;
    for h in req.headers.iter() {
        let value = std::str::from_utf8(h.value).ok();
        let name = h.name;
        if name.eq_ignore_ascii_case("transfer-encoding")
            || name.eq_ignore_ascii_case("expect")
            || name.eq_ignore_ascii_case("upgrade")
        {
            return Parsed::Other;
        } else if name.eq_ignore_ascii_case("content-length") {
            lengths += 1;
            // Checked by `bad_length`; one past u64 goes to hyper, which answers it.
            match content_length(h.value) {
                Some(n) => head.content_length = n,
                None => return Parsed::Other,
            }
        } else if name.eq_ignore_ascii_case("authorization") {
            head.token = value.and_then(auth::bearer_of).map(Box::from);
        } else if name.eq_ignore_ascii_case("connection") {
            let v = value.unwrap_or("");
            if v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")) {
                head.close = true;
            } else if v.split(',').any(|t| t.trim().eq_ignore_ascii_case("keep-alive")) && version == 0 {
                head.close = false;
            }
        }
    }
    // Two lengths, or a body on a GET: hyper's stricter handling answers it.
    if lengths > 1 || (!route.has_body() && head.content_length > 0) {
        return Parsed::Other;
    }
    Parsed::Node(head)
}

/// Every `X-Forwarded-For` value of a complete `head`, in order, comma-joined.
fn forwarded_for(head: &[u8]) -> Option<String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    req.parse(head).ok()?;
    let values: Vec<_> = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("x-forwarded-for"))
        .map(|h| String::from_utf8_lossy(h.value))
        .collect();
    (!values.is_empty()).then(|| values.join(","))
}

/// The client's address: the peer's, or behind a trusted proxy the one it forwards (the head
/// is read again for it only then).
fn client_of(stream: &TcpStream, proxies: &TrustedProxies, head: &[u8]) -> Option<IpAddr> {
    let peer = stream.peer_addr().ok()?.ip();
    let forwarded = if proxies.trusts(peer) { forwarded_for(head) } else { None };
    Some(proxies.client(peer, forwarded.as_deref()))
}

/// Serves node requests on `stream` until it closes (`None`) or a request comes that hyper
/// must serve: `Some` with the bytes already read from it. `guest`: the connection's share of
/// the strangers' budget.
pub async fn serve(stream: &mut TcpStream, app: &App, timeouts: &Timeouts, guest: &Arc<Guest>) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    loop {
        // hyper's semantics: the header-read timeout runs from the end of the last answer,
        // so it bounds an idle keep-alive as well as a trickled head.
        let deadline = Instant::now() + timeouts.header_read;
        // No await while a parse result (or a refusal) is alive: what is alive across a
        // wait is kept in every waiting connection's task.
        let head = loop {
            if !buf.is_empty() {
                let refusal = match parse_head(&buf) {
                    Parsed::Partial if buf.len() < MAX_HEAD => None,
                    Parsed::Partial => Some(ApiError::head_too_large()),
                    Parsed::Node(h) => break h,
                    // Still held: hyper's path goes on counting from these bytes.
                    Parsed::Other => return Some(buf),
                    Parsed::Bad(e) => Some(e),
                };
                if let Some(refusal) = refusal {
                    drop(std::mem::take(&mut buf));
                    guest.release();
                    return Box::pin(refuse(stream, refusal, *timeouts)).await;
                }
            }
            read_some(stream, &mut buf, &deadline, guest).await.ok()?;
        };
        let client = client_of(stream, &app.proxies, &buf[..head.len as usize]);
        let rest = buf.split_off(head.len as usize);
        drop(std::mem::take(&mut buf));
        // A join's body is read before any credential: what came of it with the head is held
        // already. Any other body is read once the node's token passed.
        let join = (head.route == Route::Join).then_some(guest);
        if !guest.hold(if join.is_some() { rest.capacity() } else { 0 }) {
            return None;
        }
        let body = RawBody { stream, buf: rest, len: head.content_length, timeouts, read: false, guest: join };
        // Boxed, as every step that is not the wait itself: what a connection keeps in its
        // task while it waits for a request, or holds one, is then only the state of that
        // wait (a few hundred bytes, at 10,000 connections).
        let (answer, keep, leftover) = Box::pin(answer(app, &head, client, body)).await?;
        // The third failed credential closes the connection (docs/behaviour.md#hardening).
        let refused = answer.status == StatusCode::UNAUTHORIZED && guest.refused();
        let close = head.close || !keep || refused;
        Box::pin(write_answer(stream, answer, close, *timeouts)).await.ok()?;
        if close || !guest.hold(leftover.capacity()) {
            return None;
        }
        buf = leftover;
    }
}

/// Answers `refusal` and closes: the end of a connection whose head cannot be served.
async fn refuse(stream: &mut TcpStream, refusal: ApiError, timeouts: Timeouts) -> Option<Vec<u8>> {
    let _ = write_answer(stream, refusal.answer(), true, timeouts).await;
    None
}

/// Reads what is there into `buf` (growing it to at most [`MAX_HEAD`], each growth held by
/// `guest` first), waiting until `deadline`; an error at EOF, a read error, the deadline or
/// the guest shed. It waits on the stream's own readiness (no waiter of its own) beside one
/// timer: this is the state every idle keep-alive connection keeps.
async fn read_some(stream: &TcpStream, buf: &mut Vec<u8>, deadline: &Instant, guest: &Arc<Guest>) -> io::Result<()> {
    let mut expiry = std::pin::pin!(tokio::time::sleep_until(*deadline));
    std::future::poll_fn(move |cx| loop {
        match stream.poll_read_ready(cx) {
            Poll::Pending if expiry.as_mut().poll(cx).is_ready() => {
                return Poll::Ready(Err(io::ErrorKind::TimedOut.into()))
            }
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Ready(Ok(())) => {}
        }
        if buf.len() == buf.capacity() {
            let want = (buf.capacity() * 2).clamp(FIRST_READ, MAX_HEAD);
            if !guest.hold(want) {
                return Poll::Ready(Err(io::ErrorKind::OutOfMemory.into()));
            }
            buf.reserve_exact(want - buf.len());
        }
        // A `WouldBlock` clears the readiness, so the next poll waits again.
        match stream.try_read_buf(buf) {
            Ok(0) => return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into())),
            Ok(_) => return Poll::Ready(Ok(())),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Poll::Ready(Err(e)),
        }
    })
    .await
}

/// Reads the rest of a body of `len` bytes into `body` (which holds its start) within
/// [`BODY_DEADLINE`] (`408`); bytes past it (a pipelined request) are returned. `Err(None)`:
/// the peer went away, or sent nothing for the idle timeout (closed without an answer, as
/// hyper's connections are).
async fn read_body(
    stream: &TcpStream,
    body: &mut Vec<u8>,
    len: usize,
    idle: Duration,
) -> Result<Vec<u8>, Option<ApiError>> {
    let deadline = Instant::now() + BODY_DEADLINE;
    if body.len() < len {
        body.reserve_exact(len - body.len());
    }
    while body.len() < len {
        let quiet = Instant::now() + idle;
        match timeout_at(deadline.min(quiet), stream.readable()).await {
            Err(_) if quiet < deadline => return Err(None),
            Err(_) => return Err(Some(ApiError::request_timeout())),
            Ok(Err(_)) => return Err(None),
            Ok(Ok(())) => {}
        }
        match stream.try_read_buf(body) {
            Ok(0) => return Err(None),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return Err(None),
        }
    }
    Ok(body.split_off(len))
}

/// The body of a request on this path: its start came with the head (`buf`), the rest is
/// read off the stream to the declared length. What follows it, the start of the next
/// request, is left in `buf`.
struct RawBody<'a> {
    stream: &'a TcpStream,
    buf: Vec<u8>,
    len: u64,
    timeouts: &'a Timeouts,
    /// The body was read whole: the connection can carry another request.
    read: bool,
    /// A join's body is held by the connection's guest: it is read before any credential.
    guest: Option<&'a Arc<Guest>>,
}

/// The peer went away, or sent nothing for the idle timeout, while its body was due: the
/// connection closes without an answer, as hyper's do.
struct PeerGone;

impl ReadBody for RawBody<'_> {
    type Body = Vec<u8>;
    type Gone = PeerGone;

    fn read(&mut self, limit: usize) -> impl Future<Output = Result<Vec<u8>, Unread<PeerGone>>> + Send {
        // Every body here declares its length, which the sequence checked against `limit`.
        debug_assert!(self.len <= limit as u64);
        async move {
            if self.guest.is_some_and(|g| !g.hold(self.len as usize)) {
                return Err(Unread::Gone(PeerGone));
            }
            let mut body = std::mem::take(&mut self.buf);
            match read_body(self.stream, &mut body, self.len as usize, self.timeouts.idle).await {
                Ok(next) => {
                    (self.buf, self.read) = (next, true);
                    Ok(body)
                }
                Err(Some(e)) => Err(Unread::Refused(e)),
                Err(None) => Err(Unread::Gone(PeerGone)),
            }
        }
    }
}

/// The answer to one request, whether the connection can carry another, and the bytes of the
/// next request already read. `None`: the peer went away.
async fn answer(
    app: &App,
    head: &Head,
    client: Option<IpAddr>,
    mut body: RawBody<'_>,
) -> Option<(Answer, bool, Vec<u8>)> {
    // Boxed: the steps before the hold are gone when it starts.
    let next = Box::pin(sequence::prepare(app, &head.request(client), &mut body)).await.ok()?;
    let outcome = match next {
        Next::Answer(outcome) => outcome,
        // Boxed: the hold's state exists only while a request is held, not in every
        // connection's task.
        Next::Hold(held) => watched(body.stream, Box::pin(held.answer(app))).await?,
    };
    // Answered before its body was read, a route with one cannot go on: the body's bytes
    // would be taken for the next request.
    let keep = body.read || !head.route.has_body();
    Some((reply::answer(outcome), keep, body.buf))
}

/// The long-poll `hold`, given up (`None`) when the peer closes the connection meanwhile.
/// The peer's end is watched through the stream's own readiness, with no future (and no
/// waiter of its own) beside the hold.
fn watched<'a>(
    stream: &'a TcpStream,
    mut hold: Pin<Box<impl Future<Output = Outcome> + 'a>>,
) -> impl Future<Output = Option<Outcome>> + 'a {
    std::future::poll_fn(move |cx| {
        if let Poll::Ready(r) = hold.as_mut().poll(cx) {
            return Poll::Ready(Some(r));
        }
        match peer_closed(stream, cx) {
            true => Poll::Ready(None),
            false => Poll::Pending,
        }
    })
}

/// Whether the peer has closed (or reset) the connection; bytes of a next request sent early
/// do not count. Not closed: the stream wakes `cx` when that may have changed.
fn peer_closed(stream: &TcpStream, cx: &mut Context<'_>) -> bool {
    let mut one = [0u8; 1];
    let mut buf = ReadBuf::new(&mut one);
    match stream.poll_peek(cx, &mut buf) {
        Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => true,
        // Early bytes stay readable, so the stream would not wake again for them: from here
        // on only the hold ends the wait (a close is then seen by the next read).
        Poll::Ready(Ok(_)) => false,
        Poll::Pending => false,
    }
}

fn reason(status: StatusCode) -> &'static str {
    status.canonical_reason().unwrap_or("")
}

/// Writes one answer within the idle timeout.
async fn write_answer(stream: &mut TcpStream, answer: Answer, close: bool, timeouts: Timeouts) -> io::Result<()> {
    let Answer { status, json: body, headers } = answer;
    let mut head = format!("HTTP/1.1 {} {}\r\n", status.as_u16(), reason(status));
    if let Some(b) = &body {
        head.push_str(&format!("content-type: {JSON}\r\ncontent-length: {}\r\n", b.len()));
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if close {
        head.push_str("connection: close\r\n");
    }
    head.push_str("\r\n");
    let write = async {
        let w = stream;
        match body {
            Some(b) if b.len() <= COALESCE => {
                let mut all = head.into_bytes();
                all.extend_from_slice(&b);
                w.write_all(&all).await
            }
            Some(b) => {
                w.write_all(head.as_bytes()).await?;
                w.write_all(&b).await
            }
            None => w.write_all(head.as_bytes()).await,
        }
    };
    timeout(timeouts.idle, write).await.map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node_head(raw: &str) -> Head {
        match parse_head(raw.as_bytes()) {
            Parsed::Node(h) => h,
            Parsed::Partial => panic!("partial: {raw:?}"),
            Parsed::Other => panic!("other: {raw:?}"),
            Parsed::Bad(e) => panic!("bad: {raw:?}: {e:?}"),
        }
    }

    #[test]
    fn node_routes_are_served_here() {
        let h = node_head("POST /api/v1/nodes/me/exchange?since=3&wait=20 HTTP/1.1\r\nAuthorization: Bearer t0k\r\nContent-Length: 12\r\n\r\n{}");
        assert_eq!(h.route, Route::Exchange);
        assert_eq!(h.query.as_deref(), Some("since=3&wait=20"));
        assert_eq!(h.token.as_deref(), Some("t0k"));
        assert_eq!(h.content_length, 12);
        assert!(!h.close);
        assert_eq!(h.len as usize, "POST /api/v1/nodes/me/exchange?since=3&wait=20 HTTP/1.1\r\nAuthorization: Bearer t0k\r\nContent-Length: 12\r\n\r\n".len());
        let h = node_head("GET /api/v1/nodes/me/desired HTTP/1.0\r\n\r\n");
        assert_eq!(h.route, Route::Desired);
        assert!(h.close, "HTTP/1.0 closes unless it asks for keep-alive");
        let h = node_head("PUT /api/v1/nodes/me/observed HTTP/1.1\r\nconnection: Close\r\ncontent-length: 0\r\n\r\n");
        assert!(h.close);
    }

    #[test]
    fn everything_else_goes_to_hyper() {
        for raw in [
            "GET /api/v1/nodes HTTP/1.1\r\n\r\n",
            "GET /api/v1/nodes:join HTTP/1.1\r\n\r\n",
            "POST /api/v1/nodes/me/desired HTTP/1.1\r\n\r\n",
            "GET /api/v1/nodes/me/desired/x HTTP/1.1\r\n\r\n",
            "PUT /api/v1/nodes/me/observed HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "PUT /api/v1/nodes/me/observed HTTP/1.1\r\nExpect: 100-continue\r\ncontent-length: 3\r\n\r\n",
            "PUT /api/v1/nodes/me/observed HTTP/1.1\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n",
            "GET /api/v1/nodes/me/desired HTTP/1.1\r\ncontent-length: 3\r\n\r\n",
            "G\0T / HTTP/1.1\r\n\r\n",
        ] {
            assert!(matches!(parse_head(raw.as_bytes()), Parsed::Other), "{raw:?}");
        }
        assert!(matches!(parse_head(b"GET /api/v1/nodes/me/desired HTTP/1.1\r\nHost: x"), Parsed::Partial));
    }

    #[test]
    fn a_content_length_of_anything_but_digits_is_refused_on_every_route() {
        for v in ["+3", "-3", "3,3", "3 3", "0x3", "", "3a"] {
            for route in ["PUT /api/v1/nodes/me/observed", "POST /api/v1/join-keys"] {
                let raw = format!("{route} HTTP/1.1\r\ncontent-length: {v}\r\n\r\n");
                match parse_head(raw.as_bytes()) {
                    Parsed::Bad(e) => assert_eq!(e.status, StatusCode::BAD_REQUEST, "{raw:?}"),
                    _ => panic!("not refused: {raw:?}"),
                }
            }
        }
        assert_eq!(
            node_head("PUT /api/v1/nodes/me/observed HTTP/1.1\r\ncontent-length:  7 \r\n\r\n").content_length,
            7
        );
    }

    #[test]
    fn forwarded_addresses_are_kept_in_order() {
        let raw = b"POST /api/v1/nodes:join HTTP/1.1\r\nX-Forwarded-For: 1.1.1.1\r\nx-forwarded-for: 2.2.2.2, 3.3.3.3\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(forwarded_for(raw).as_deref(), Some("1.1.1.1,2.2.2.2, 3.3.3.3"));
        assert_eq!(forwarded_for(b"GET / HTTP/1.1\r\n\r\n"), None);
    }
}

/// What a node connection keeps while it waits, measured: 10,000 nodes each keep one.
#[cfg(test)]
mod sizes {
    use super::*;
    use crate::http::sizes::output_size;

    /// A held exchange keeps its task (the node path's loop inline), the request's state
    /// and the hold's, each boxed apart; anything large inlined into one of them again (a
    /// database read, a write, a body read) would be kept by every held connection.
    #[test]
    fn a_held_request_keeps_a_few_hundred_bytes() {
        let serve = output_size(
            |(s, a, t, g): (&'static mut TcpStream, &'static App, &'static Timeouts, &'static Arc<Guest>)| {
                serve(s, a, t, g)
            },
        );
        let answer =
            output_size(|(s, a, h, t): (&'static TcpStream, &'static App, &'static Head, &'static Timeouts)| {
                let body = RawBody { stream: s, buf: Vec::new(), len: 0, timeouts: t, read: false, guest: None };
                answer(a, h, None, body)
            });
        let hold = output_size(|(h, a): (&'static sequence::Held, &'static App)| h.answer(a));
        eprintln!("bytes: serve {serve}, answer {answer}, hold {hold}");
        // Debug-build bounds (release sizes are no larger). With their steps inlined instead
        // of boxed, the three are about 950, 740 and 730 bytes.
        assert!(serve <= 384, "the node path's loop is {serve} bytes");
        assert!(answer <= 320, "a request's state is {answer} bytes");
        assert!(hold <= 448, "a hold's state is {hold} bytes");
    }
}
