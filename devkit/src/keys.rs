//! The signing key behind devkit's JWKS: Ed25519, generated at start.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde_json::json;
use std::time::{SystemTime, UNIX_EPOCH};

pub struct Signer {
    issuer: String,
    kid: String,
    encoding: EncodingKey,
    public: Vec<u8>,
}

impl Signer {
    pub fn generate(issuer: &str) -> Signer {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).expect("the system RNG works");
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("a fresh key parses");
        let kid = format!("devkit-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        Signer {
            issuer: issuer.to_string(),
            kid,
            encoding: EncodingKey::from_ed_der(pkcs8.as_ref()),
            public: pair.public_key().as_ref().to_vec(),
        }
    }

    pub fn jwks(&self) -> serde_json::Value {
        json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "use": "sig", "alg": "EdDSA",
                         "kid": self.kid, "x": B64URL.encode(&self.public)}]})
    }

    /// Signs arbitrary claims with this key (tests use it for malformed tokens).
    pub fn sign(&self, claims: &serde_json::Value) -> String {
        let mut h = Header::new(Algorithm::EdDSA);
        h.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&h, claims, &self.encoding).expect("signing with a valid key")
    }

    /// Signs `claims` under a header of the test's own making (`crit`, say), with this key.
    pub fn sign_with_header(&self, header: &serde_json::Value, claims: &serde_json::Value) -> String {
        let part = |v: &serde_json::Value| B64URL.encode(serde_json::to_vec(v).expect("JSON serialises"));
        let input = format!("{}.{}", part(header), part(claims));
        let sig = jsonwebtoken::crypto::sign(input.as_bytes(), &self.encoding, Algorithm::EdDSA).expect("signing");
        format!("{input}.{sig}")
    }

    pub fn mint(&self, audience: &str, scope: &str, ttl_seconds: i64) -> String {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
        self.sign(&json!({"iss": self.issuer, "aud": audience, "sub": "devkit-admin", "scope": scope,
                          "iat": now, "nbf": now - 5, "exp": now + ttl_seconds}))
    }

    /// The key id tokens carry (tests forge tokens with it).
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The raw Ed25519 public key, as the JWKS publishes it.
    pub fn public_key(&self) -> &[u8] {
        &self.public
    }

    pub fn issuer(&self) -> &str {
        &self.issuer
    }
}
