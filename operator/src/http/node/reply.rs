//! What a node request comes to: a [`Reply`] when it succeeds, an error otherwise, and the
//! [`Answer`] either is on both transports. Every reply offers the exchange (docs/behaviour.md#desired-state-and-observed-report).

use crate::http::answer::Answer;
use crate::http::error::ApiError;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use fleet_api::protocol;

/// A node request's outcome.
pub type Outcome = Result<Reply, ApiError>;

/// What a node route answers when it succeeds.
#[derive(Debug)]
pub enum Reply {
    /// `201` with the join's answer.
    Joined(Bytes),
    /// `200` with the desired state.
    Desired(Bytes),
    /// `304`: the generation is unchanged.
    NotModified,
    /// `204`: the report was taken.
    Accepted,
}

/// The header every successful node-route answer carries.
const OFFER: &[(&str, &str)] = &[(protocol::EXCHANGE_HEADER, protocol::EXCHANGE_PATH)];

impl Reply {
    fn status(&self) -> StatusCode {
        match self {
            Reply::Joined(_) => StatusCode::CREATED,
            Reply::Desired(_) => StatusCode::OK,
            Reply::NotModified => StatusCode::NOT_MODIFIED,
            Reply::Accepted => StatusCode::NO_CONTENT,
        }
    }

    pub fn answer(self) -> Answer {
        let status = self.status();
        let json = match self {
            Reply::Joined(b) | Reply::Desired(b) => Some(b),
            Reply::NotModified | Reply::Accepted => None,
        };
        Answer { status, json, headers: OFFER }
    }
}

/// The answer an outcome is, on either transport.
pub fn answer(outcome: Outcome) -> Answer {
    match outcome {
        Ok(reply) => reply.answer(),
        Err(e) => e.answer(),
    }
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        self.answer().into_response()
    }
}
