//! The web view (docs/behaviour.md#web-view): three static files embedded in the binary, served at `/ui`,
//! with headers that keep the page to this origin (`connect-src 'self'`: it cannot call any
//! other host) and out of frames. The page reads the JSON API with the admin's token.
//!
//! Plain HTML, CSS and a small script, no framework and no build step: nothing here needs a
//! registry, the files are what is served, and the page renders from the API the rest of
//! Fleet already tests (server-side rendering would duplicate every view in Rust).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("../../ui/index.html");
const SCRIPT: &str = include_str!("../../ui/app.js");
const STYLE: &str = include_str!("../../ui/app.css");

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; \
                   base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

pub async fn index() -> Response {
    asset(INDEX, "text/html; charset=utf-8")
}

pub async fn script() -> Response {
    asset(SCRIPT, "text/javascript; charset=utf-8")
}

pub async fn style() -> Response {
    asset(STYLE, "text/css; charset=utf-8")
}

/// `/ui/` → `../ui`: the page's relative asset and API paths assume `/ui` (also behind a
/// prefix-stripping proxy, where an absolute redirect would lose the prefix).
pub async fn slash() -> Response {
    (StatusCode::PERMANENT_REDIRECT, [(header::LOCATION, "../ui")]).into_response()
}
