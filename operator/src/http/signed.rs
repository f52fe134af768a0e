//! Admin reads a follower forwards, signed instead of carrying the admin's token
//! (docs/behaviour.md#high-availability). The follower verifies the token itself, then sends
//! the leader the verified subject and scopes with an HMAC-SHA256 over the method, the path
//! with its query, the body's digest, the time, the caller and the forwarding replica, keyed
//! by `FLEET_REPLICA_SECRET`. Anyone on the pod network who sees a forwarded request learns no
//! token to replay, and a signature is good for 30 s only, for that one request.

use super::auth::Admin;
use super::error::ApiError;
use axum::http::HeaderMap;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use ring::hmac;
use sha2::{Digest, Sha256};

pub const SUB: &str = "x-fleet-forwarded-sub";
pub const SCOPES: &str = "x-fleet-forwarded-scopes";
pub const AT: &str = "x-fleet-forwarded-at";
pub const SIGNATURE: &str = "x-fleet-forwarded-signature";
/// How old a signature may be, either way (replicas' clocks are close; PostgreSQL's `now()`
/// orders the lease, this only bounds a replay).
pub const WINDOW_MS: i64 = 30_000;

/// Signs and checks forwarded requests with the replicas' shared secret.
pub struct Signer {
    key: hmac::Key,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer(…)")
    }
}

/// What a signature covers, one field a line; the body is empty (only reads are forwarded).
fn message(method: &str, path: &str, at: i64, sub: &str, scopes: &str, replica: &str) -> Vec<u8> {
    let body = hex(&Sha256::digest(b""));
    format!("fleet-forward-v1\n{method}\n{path}\n{body}\n{at}\n{sub}\n{scopes}\n{replica}").into_bytes()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Signer {
    pub fn new(secret: &[u8]) -> Signer {
        Signer { key: hmac::Key::new(hmac::HMAC_SHA256, secret) }
    }

    /// The headers of a forwarded request from `replica` for `admin`, signed at `at_ms`.
    pub fn headers(
        &self,
        method: &str,
        path: &str,
        admin: &Admin,
        replica: &str,
        at_ms: i64,
    ) -> Vec<(&'static str, String)> {
        let sub = B64.encode(admin.sub.as_bytes());
        let scopes = admin.scopes.join(" ");
        let tag = hmac::sign(&self.key, &message(method, path, at_ms, &sub, &scopes, replica));
        vec![(SUB, sub), (SCOPES, scopes), (AT, at_ms.to_string()), (SIGNATURE, B64.encode(tag.as_ref()))]
    }

    /// The caller a forwarded request speaks for, when its signature and time verify;
    /// `401 invalid_token` otherwise.
    pub fn verify(
        &self,
        method: &str,
        path: &str,
        headers: &HeaderMap,
        replica: &str,
        now_ms: i64,
    ) -> Result<Admin, ApiError> {
        let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let refused = |why: &str| ApiError::invalid_token(format!("a forwarded request that does not verify: {why}"));
        let (Some(sub), Some(scopes), Some(at), Some(sig)) = (get(SUB), get(SCOPES), get(AT), get(SIGNATURE)) else {
            return Err(refused("its signature headers are missing"));
        };
        let at: i64 = at.parse().map_err(|_| refused("its time is not a number"))?;
        if (now_ms - at).abs() > WINDOW_MS {
            return Err(refused("it was signed more than 30 s ago"));
        }
        let sig = B64.decode(sig).map_err(|_| refused("its signature is not base64"))?;
        hmac::verify(&self.key, &message(method, path, at, sub, scopes, replica), &sig)
            .map_err(|_| refused("its signature is not the replicas' (FLEET_REPLICA_SECRET differs?)"))?;
        let sub = B64.decode(sub).ok().and_then(|s| String::from_utf8(s).ok()).unwrap_or_else(|| "?".into());
        Ok(Admin { sub, scopes: scopes.split_whitespace().map(str::to_string).collect() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn signed(s: &Signer, path: &str, at: i64) -> HeaderMap {
        let admin = Admin { sub: "ops@example.com".into(), scopes: vec!["fleet:read".into()] };
        let mut h = HeaderMap::new();
        for (k, v) in s.headers("GET", path, &admin, "r1", at) {
            h.insert(k, HeaderValue::from_str(&v).unwrap());
        }
        h
    }

    #[test]
    fn a_signature_holds_for_its_request_and_thirty_seconds() {
        let s = Signer::new(b"0123456789abcdef0123456789abcdef");
        let now = 1_000_000_000;
        let h = signed(&s, "/api/v1/nodes?limit=5", now);
        let admin = s.verify("GET", "/api/v1/nodes?limit=5", &h, "r1", now + 1_000).unwrap();
        assert_eq!((admin.sub.as_str(), admin.scopes), ("ops@example.com", vec!["fleet:read".to_string()]));
        let e = |r: Result<Admin, ApiError>| r.unwrap_err().message;
        assert!(e(s.verify("GET", "/api/v1/nodes?limit=5", &h, "r1", now + 31_000)).contains("more than 30 s ago"));
        assert!(e(s.verify("GET", "/api/v1/nodes?limit=6", &h, "r1", now)).contains("signature is not the replicas'"));
        assert!(
            e(s.verify("GET", "/api/v1/nodes?limit=5", &h, "r2", now)).contains("signature is not"),
            "another replica"
        );
        let other = Signer::new(b"another secret, another fleet....");
        assert!(e(other.verify("GET", "/api/v1/nodes?limit=5", &h, "r1", now)).contains("signature is not"));
        let mut forged = h.clone();
        forged.insert(SCOPES, HeaderValue::from_static("fleet:admin"));
        assert!(
            e(s.verify("GET", "/api/v1/nodes?limit=5", &forged, "r1", now)).contains("signature is not"),
            "scopes raised"
        );
        assert!(e(s.verify("GET", "/x", &HeaderMap::new(), "r1", now)).contains("headers are missing"));
    }
}
