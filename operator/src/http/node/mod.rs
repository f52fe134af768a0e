//! The node protocol (docs/behaviour.md#node-protocol): join with a one-time key, the desired-state long-poll, the
//! observed report, and the exchange that carries both. One sequence decides every answer
//! ([`sequence`]); two transports carry it: axum handlers ([`routes`]) for what hyper
//! serves, and the node routes' own HTTP/1.1 path ([`raw`]), where every connection starts
//! and which holds 10,000 waiting nodes without a buffer each.

pub mod join;
pub mod poll;
pub mod raw;
pub mod reply;
pub mod report;
pub mod routes;
pub mod sequence;
