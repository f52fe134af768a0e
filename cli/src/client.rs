//! The controller's admin API over HTTP, and what an error means for the admin: the server's
//! message and what to do about it.

use fleet_api::ErrorBody;
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::fmt;
use std::time::Duration;

pub struct Client {
    http: reqwest::Client,
    url: String,
    token: Option<String>,
}

/// A failed call, said so an admin knows what to do.
#[derive(Debug)]
pub struct CallError(pub String);

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CallError {}

impl Client {
    pub fn new(url: &str, token: Option<String>) -> Client {
        // A redirect is never followed: the token would go along to wherever it points.
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .connect_timeout(Duration::from_secs(5))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("a TLS client");
        Client { http, url: url.trim_end_matches('/').to_string(), token }
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, CallError> {
        self.call(Method::GET, path, None).await
    }

    pub async fn post<T: DeserializeOwned>(&self, path: &str, body: Value) -> Result<T, CallError> {
        self.call(Method::POST, path, Some(body)).await
    }

    pub async fn put<T: DeserializeOwned>(&self, path: &str, body: Value) -> Result<T, CallError> {
        self.call(Method::PUT, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> Result<(), CallError> {
        self.call::<Value>(Method::DELETE, path, None).await.map(|_| ())
    }

    async fn call<T: DeserializeOwned>(&self, method: Method, path: &str, body: Option<Value>) -> Result<T, CallError> {
        let token = self.token.as_deref().ok_or_else(|| {
            CallError("no token: set FLEET_TOKEN or pass --token-file (`fleet-controller dev` prints one)".into())
        })?;
        let mut req = self.http.request(method, format!("{}{path}", self.url)).bearer_auth(token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.map_err(|e| {
            CallError(format!(
                "cannot reach the controller at {}: {}; is it running? (set --url or FLEET_URL)",
                self.url,
                root_cause(&e)
            ))
        })?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| CallError(format!("the answer broke off: {e}")))?;
        if status.is_success() {
            let bytes: &[u8] = if bytes.is_empty() { b"null" } else { &bytes };
            let expected = |e: serde_json::Error| {
                CallError(format!("the controller's answer is not what fleetctl expects ({e}): upgrade fleetctl?"))
            };
            let v: Value = serde_json::from_slice(bytes).map_err(expected)?;
            return serde_json::from_value(crate::clean::value(v)).map_err(expected);
        }
        let err: Option<ErrorBody> = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| serde_json::from_value(crate::clean::value(v)).ok());
        Err(CallError(explain(status, err)))
    }
}

fn root_cause(e: &dyn std::error::Error) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// The server's message, then what to do about it.
pub fn explain(status: StatusCode, err: Option<ErrorBody>) -> String {
    let said = err.map(|e| format!("{} ({})", e.message, e.error)).unwrap_or_else(|| format!("HTTP {status}"));
    let todo = match status {
        StatusCode::UNAUTHORIZED => {
            " — the token was refused: it may be expired, or issued for another audience or issuer; get a new one"
        }
        StatusCode::FORBIDDEN => {
            " — the token lacks fleet:admin (reads need fleet:read): ask for a token with that scope"
        }
        StatusCode::SERVICE_UNAVAILABLE => {
            " — the controller has no service account yet: set FLEET_CLIENT_ID and FLEET_CLIENT_SECRET on it"
        }
        _ => "",
    };
    format!("{said}{todo}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_what_to_do() {
        let body = |code: &str, m: &str| Some(ErrorBody { error: code.into(), message: m.into() });
        let e = explain(StatusCode::UNAUTHORIZED, body("invalid_token", "the token has expired"));
        assert!(e.starts_with("the token has expired (invalid_token) — the token was refused"), "{e}");
        let e = explain(StatusCode::FORBIDDEN, body("insufficient_scope", "this route needs the scope fleet:admin"));
        assert!(e.contains("lacks fleet:admin"), "{e}");
        let e = explain(StatusCode::SERVICE_UNAVAILABLE, body("not_configured", "x"));
        assert!(e.contains("set FLEET_CLIENT_ID and FLEET_CLIENT_SECRET"), "{e}");
        assert_eq!(
            explain(StatusCode::NOT_FOUND, body("not_found", "no node with id or name \"x\"")),
            "no node with id or name \"x\" (not_found)"
        );
        assert_eq!(explain(StatusCode::BAD_GATEWAY, None), "HTTP 502 Bad Gateway");
    }
}
