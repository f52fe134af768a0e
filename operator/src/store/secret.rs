//! The secrets the store hands out (join keys, node tokens) and the hash it keeps of them:
//! a secret is stored and indexed only as its SHA-256.

use sha2::{Digest, Sha256};

pub fn hash(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// 32 random bytes, URL-safe base64, after `prefix` (`fjk_` for a join key, `fnt_` for a
/// node token: a leaked secret says what it is).
pub fn random_secret(prefix: &str) -> String {
    use base64::Engine;
    let bytes: [u8; 32] = rand::random();
    format!("{prefix}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// The id a join key is listed and revoked by: the first 8 bytes of its hash, in hex (not the
/// key, and not enough of the hash to stand for it).
pub fn hex_id(hash: &[u8]) -> String {
    hash.iter().take(8).map(|b| format!("{b:02x}")).collect()
}
