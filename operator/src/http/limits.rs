//! The limits of docs/behaviour.md#hardening on HTTP, in one place: both transports of the node routes (the raw
//! HTTP/1.1 path and hyper behind axum) and the admin routes read them from here, so a limit
//! cannot differ between the paths a request may take.

use std::time::Duration;

/// The header-read timeout (a head must arrive whole within it; it also bounds an idle
/// keep-alive) and the idle timeout (nothing read or written for that long closes the
/// connection), from the configuration.
pub use crate::config::HttpTimeouts as Timeouts;

/// A request head must fit this (`431`). It also bounds how far one connection's read
/// buffer grows (hyper's default lets a trickled head reach ~400 KiB).
pub const MAX_HEAD: usize = 64 * 1024;

/// A request body is at most this (`413`).
pub const BODY_LIMIT: usize = 1024 * 1024;

/// A join body is at most this (`413`): a join announces a node, nothing large.
pub const JOIN_LIMIT: usize = 64 * 1024;

/// A body must arrive within this of its head (`408`).
pub const BODY_DEADLINE: Duration = Duration::from_secs(10);

/// Longest a desired-state poll may be held (`wait`, seconds; more is `400`).
pub const MAX_WAIT_SECONDS: u64 = 60;

/// Failed joins allowed per second from one client address (docs/reference.md#http-api; more is `429`).
pub const MAX_FAILED_JOINS_PER_SECOND: u32 = 20;

/// A connection is closed after answering this many `401`s (docs/behaviour.md#hardening): a
/// stranger trying credentials must reconnect for every few.
pub const MAX_FAILED_CREDENTIALS: u8 = 3;

/// The message of the `400` for a `Content-Length` that is not digits only.
pub const BAD_CONTENT_LENGTH: &str = "Content-Length must be digits only";
