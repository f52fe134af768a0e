//! An answer as both transports of the node routes write it: a status, a JSON body or none,
//! and further headers. axum turns it into a response here; the raw HTTP/1.1 path writes the
//! same parts itself (`node::raw`). Built in one place for errors (`error`) and one for the
//! node routes' replies (`node::reply`), an answer cannot differ between the two paths.

use axum::body::Bytes;
use axum::http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// The content type of every body an answer carries.
pub const JSON: &str = "application/json";

#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    /// The body, JSON, sent with `content-type: application/json`.
    pub json: Option<Bytes>,
    /// Headers after the content type, lower-case names.
    pub headers: &'static [(&'static str, &'static str)],
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let mut r = match self.json {
            Some(body) => ([(CONTENT_TYPE, JSON)], body).into_response(),
            None => ().into_response(),
        };
        *r.status_mut() = self.status;
        for (name, value) in self.headers {
            r.headers_mut().insert(HeaderName::from_static(name), HeaderValue::from_static(value));
        }
        r
    }
}
