//! Admin reads a follower forwards, signed instead of carrying the admin's token
//! (docs/behaviour.md#high-availability). The follower verifies the token itself, then sends
//! the leader the verified subject and scopes with an HMAC-SHA256 over the method, the path
//! with its query, the body's digest, the time, the caller and the forwarding replica, keyed
//! by `FLEET_REPLICA_SECRET`, and a random nonce. Anyone on the pod network who sees a forwarded
//! request learns no token to replay, and a signature is good for 30 s only, for that one
//! request, once: the leader remembers the nonces it took for as long as they could verify.
//! Forwarded requests are reads and carry no body: one with a body is refused, so the digest
//! the signature covers (of the empty body) is the digest of the body received.

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
pub const NONCE: &str = "x-fleet-forwarded-nonce";
/// The most nonces remembered at once; past it forwarded requests are refused (the caller
/// retries) rather than forgotten early, which would let one be replayed.
const MAX_NONCES: usize = 200_000;
/// How old a signature may be, either way (replicas' clocks are close; PostgreSQL's `now()`
/// orders the lease, this only bounds a replay).
pub const WINDOW_MS: i64 = 30_000;

/// Signs and checks forwarded requests with the replicas' shared secret.
pub struct Signer {
    key: hmac::Key,
    /// Nonces taken, with the time (ms) after which their signature no longer verifies anyway.
    seen: parking_lot::Mutex<std::collections::HashMap<String, i64>>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer(…)")
    }
}

/// What a signature covers, one field a line: `body` is the digest of the body (reads carry
/// none, and one with a body is refused before this is checked).
struct Signed<'a> {
    method: &'a str,
    path: &'a str,
    at: i64,
    sub: &'a str,
    scopes: &'a str,
    replica: &'a str,
    nonce: &'a str,
}

impl Signed<'_> {
    fn message(&self) -> Vec<u8> {
        let body = hex(&Sha256::digest(b""));
        let Signed { method, path, at, sub, scopes, replica, nonce } = self;
        format!("fleet-forward-v2\n{method}\n{path}\n{body}\n{at}\n{sub}\n{scopes}\n{replica}\n{nonce}").into_bytes()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Signer {
    pub fn new(secret: &[u8]) -> Signer {
        Signer { key: hmac::Key::new(hmac::HMAC_SHA256, secret), seen: Default::default() }
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
        let nonce = B64.encode(rand::random::<[u8; 16]>());
        let signed = Signed { method, path, at: at_ms, sub: &sub, scopes: &scopes, replica, nonce: &nonce };
        let tag = hmac::sign(&self.key, &signed.message());
        vec![
            (SUB, sub),
            (SCOPES, scopes),
            (AT, at_ms.to_string()),
            (NONCE, nonce),
            (SIGNATURE, B64.encode(tag.as_ref())),
        ]
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
        let (Some(sub), Some(scopes), Some(at), Some(nonce), Some(sig)) =
            (get(SUB), get(SCOPES), get(AT), get(NONCE), get(SIGNATURE))
        else {
            return Err(refused("its signature headers are missing"));
        };
        if carries_a_body(headers) {
            return Err(refused("it carries a body (forwarded requests are reads)"));
        }
        let at: i64 = at.parse().map_err(|_| refused("its time is not a number"))?;
        if now_ms.abs_diff(at) > WINDOW_MS as u64 {
            return Err(refused("it was not signed within 30 s of now"));
        }
        let sig = B64.decode(sig).map_err(|_| refused("its signature is not base64"))?;
        let signed = Signed { method, path, at, sub, scopes, replica, nonce };
        hmac::verify(&self.key, &signed.message(), &sig)
            .map_err(|_| refused("its signature is not the replicas' (FLEET_REPLICA_SECRET differs?)"))?;
        self.take_nonce(nonce, at, now_ms).map_err(refused)?;
        let sub = B64.decode(sub).ok().and_then(|s| String::from_utf8(s).ok()).unwrap_or_else(|| "?".into());
        Ok(Admin { sub, scopes: super::auth::scopes_of(scopes) })
    }

    /// Takes a nonce once: one seen while its signature could still verify is a replay.
    fn take_nonce(&self, nonce: &str, at: i64, now_ms: i64) -> Result<(), &'static str> {
        let mut seen = self.seen.lock();
        if seen.len() >= MAX_NONCES {
            seen.retain(|_, until| *until >= now_ms);
        }
        if seen.len() >= MAX_NONCES {
            return Err("too many forwarded requests at once; retry");
        }
        match seen.insert(nonce.to_string(), at.saturating_add(WINDOW_MS)) {
            Some(until) if until >= now_ms => Err("it was already answered once (a replay)"),
            _ => Ok(()),
        }
    }
}

/// Whether a request says it has a body (a length above zero, or a chunked one).
fn carries_a_body(headers: &HeaderMap) -> bool {
    let length = headers.get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok());
    length.is_some_and(|l| l != "0") || headers.contains_key(axum::http::header::TRANSFER_ENCODING)
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
        assert!(e(s.verify("GET", "/api/v1/nodes?limit=5", &h, "r1", now + 31_000)).contains("within 30 s of now"));
        assert!(e(s.verify("GET", "/api/v1/nodes?limit=6", &h, "r1", now)).contains("signature is not the replicas'"));
        assert!(
            e(s.verify("GET", "/api/v1/nodes?limit=5", &h, "r2", now)).contains("signature is not"),
            "another replica"
        );
        let other = Signer::new(b"another secret, another fleet....");
        assert!(e(other.verify("GET", "/api/v1/nodes?limit=5", &h, "r1", now)).contains("signature is not"));
        assert!(
            e(s.verify("GET", "/api/v1/nodes?limit=5", &h, "r1", now)).contains("already answered once"),
            "a replay"
        );
        let mut forged = h.clone();
        forged.insert(SCOPES, HeaderValue::from_static("fleet:admin"));
        assert!(
            e(s.verify("GET", "/api/v1/nodes?limit=5", &forged, "r1", now)).contains("signature is not"),
            "scopes raised"
        );
        assert!(e(s.verify("GET", "/x", &HeaderMap::new(), "r1", now)).contains("headers are missing"));
    }

    /// A forged time far off either way is refused without overflowing (a panic in a debug
    /// build once), and so is a forwarded request carrying a body the signature cannot cover.
    #[test]
    fn forged_times_and_bodies_are_refused() {
        let s = Signer::new(b"0123456789abcdef0123456789abcdef");
        let now = 1_000_000_000;
        for at in [i64::MIN, i64::MAX, -1] {
            let mut h = signed(&s, "/api/v1/nodes", now);
            h.insert(AT, HeaderValue::from_str(&at.to_string()).unwrap());
            assert!(
                s.verify("GET", "/api/v1/nodes", &h, "r1", now).unwrap_err().message.contains("within 30 s"),
                "{at}"
            );
        }
        let mut h = signed(&s, "/api/v1/nodes", now);
        h.insert(axum::http::header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        assert!(s.verify("GET", "/api/v1/nodes", &h, "r1", now).unwrap_err().message.contains("carries a body"));
        let fresh = signed(&s, "/api/v1/nodes", now);
        assert!(s.verify("GET", "/api/v1/nodes", &fresh, "r1", now).is_ok(), "each signature has its own nonce");
    }
}
