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

use super::reply::{self, Outcome};
use super::sequence::{self, Next, NodeRequest, ReadBody, Route, Unread};
use crate::http::answer::{Answer, JSON};
use crate::http::app::App;
use crate::http::auth;
use crate::http::error::ApiError;
use crate::http::limits::{Timeouts, BODY_DEADLINE, MAX_HEAD};
use axum::http::StatusCode;
use std::future::Future;
use std::io;
use std::pin::Pin;
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
    query: Option<String>,
    token: Option<String>,
    content_length: u64,
    /// The client asked to close after this answer (or speaks HTTP/1.0).
    close: bool,
    /// Bytes of the head in the buffer.
    len: usize,
}

impl Head {
    /// What the sequence reads of the head.
    fn request(&self) -> NodeRequest<'_> {
        NodeRequest {
            route: self.route,
            query: self.query.as_deref(),
            token: self.token.as_deref(),
            content_length: Some(self.content_length),
        }
    }
}

enum Parsed {
    /// More bytes are needed.
    Partial,
    Node(Head),
    /// Not for this path: hyper takes the connection.
    Other,
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
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q.to_string())),
        None => (target, None),
    };
    let Some(route) = Route::of(method, path) else { return Parsed::Other };
    let mut head = Head { route, query, token: None, content_length: 0, close: version == 0, len };
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
            // Digits only, as hyper reads it (docs/behaviour.md#hardening): `+5` is parsed by `u64` but refused
            // by hyper, which answers it.
            let digits = value.map(str::trim).filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()));
            match digits.and_then(|v| v.parse::<u64>().ok()) {
                Some(n) => head.content_length = n,
                None => return Parsed::Other,
            }
        } else if name.eq_ignore_ascii_case("authorization") {
            head.token = value.and_then(auth::bearer_of).map(str::to_string);
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

/// Serves node requests on `stream` until it closes (`None`) or a request comes that hyper
/// must serve: `Some` with the bytes already read from it.
pub async fn serve(stream: &mut TcpStream, app: &App, timeouts: &Timeouts) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    loop {
        // hyper's semantics: the header-read timeout runs from the end of the last answer,
        // so it bounds an idle keep-alive as well as a trickled head.
        let deadline = Instant::now() + timeouts.header_read;
        let head = loop {
            if !buf.is_empty() {
                match parse_head(&buf) {
                    Parsed::Partial => {}
                    Parsed::Node(h) => break h,
                    Parsed::Other => return Some(buf),
                }
                if buf.len() >= MAX_HEAD {
                    let e = ApiError::head_too_large().answer();
                    let _ = Box::pin(write_answer(stream, e, true, *timeouts)).await;
                    return None;
                }
            }
            read_some(stream, &mut buf, deadline).await.ok()?;
        };
        let rest = buf.split_off(head.len);
        drop(std::mem::take(&mut buf));
        let body = RawBody { stream, buf: rest, len: head.content_length, idle: timeouts.idle, read: false };
        // Boxed, as every step that is not the wait itself: what a connection keeps in its
        // task while it waits for a request, or holds one, is then only the state of that
        // wait (a few hundred bytes, at 10,000 connections).
        let (answer, keep, leftover) = Box::pin(answer(app, &head, body)).await?;
        Box::pin(write_answer(stream, answer, head.close || !keep, *timeouts)).await.ok()?;
        if head.close || !keep {
            return None;
        }
        buf = leftover;
    }
}

/// Reads what is there into `buf` (growing it to at most [`MAX_HEAD`]), waiting until
/// `deadline`; an error at EOF, a read error or the deadline. It waits on the stream's own
/// readiness (no waiter of its own) beside one timer: this is the state every idle
/// keep-alive connection keeps.
async fn read_some(stream: &TcpStream, buf: &mut Vec<u8>, deadline: Instant) -> io::Result<()> {
    let mut expiry = std::pin::pin!(tokio::time::sleep_until(deadline));
    std::future::poll_fn(|cx| loop {
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
    idle: Duration,
    /// The body was read whole: the connection can carry another request.
    read: bool,
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
            let mut body = std::mem::take(&mut self.buf);
            match read_body(self.stream, &mut body, self.len as usize, self.idle).await {
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
async fn answer(app: &App, head: &Head, mut body: RawBody<'_>) -> Option<(Answer, bool, Vec<u8>)> {
    // Boxed: the steps before the hold are gone when it starts.
    let next = Box::pin(sequence::prepare(app, &head.request(), &mut body)).await.ok()?;
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
        assert_eq!(h.len, "POST /api/v1/nodes/me/exchange?since=3&wait=20 HTTP/1.1\r\nAuthorization: Bearer t0k\r\nContent-Length: 12\r\n\r\n".len());
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
            "PUT /api/v1/nodes/me/observed HTTP/1.1\r\ncontent-length: -3\r\n\r\n",
            "PUT /api/v1/nodes/me/observed HTTP/1.1\r\ncontent-length: +3\r\n\r\n",
            "GET /api/v1/nodes/me/desired HTTP/1.1\r\ncontent-length: 3\r\n\r\n",
            "G\0T / HTTP/1.1\r\n\r\n",
        ] {
            assert!(matches!(parse_head(raw.as_bytes()), Parsed::Other), "{raw:?}");
        }
        assert!(matches!(parse_head(b"GET /api/v1/nodes/me/desired HTTP/1.1\r\nHost: x"), Parsed::Partial));
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
        let serve = output_size(|(s, a, t): (&'static mut TcpStream, &'static App, &'static Timeouts)| serve(s, a, t));
        let answer = output_size(|(s, a, h): (&'static TcpStream, &'static App, &'static Head)| {
            answer(a, h, RawBody { stream: s, buf: Vec::new(), len: 0, idle: Duration::ZERO, read: false })
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
