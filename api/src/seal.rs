//! libsodium sealed boxes (X25519 + XSalsa20-Poly1305, `crypto_box_seal`): the controller
//! seals each PAT to one node's public key; only that node's secret key opens it.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use crypto_box::aead::OsRng;
use crypto_box::{PublicKey, SecretKey};

/// Bytes a sealed box adds to the plaintext.
pub const OVERHEAD: usize = 48;

/// A fresh X25519 key pair: (secret, public), 32 bytes each.
pub fn generate_keypair() -> ([u8; 32], [u8; 32]) {
    let sk = SecretKey::generate(&mut OsRng);
    let pk = sk.public_key();
    (sk.to_bytes(), *pk.as_bytes())
}

/// The public key of an X25519 secret key.
pub fn public_of(secret_key: &[u8; 32]) -> [u8; 32] {
    *SecretKey::from(*secret_key).public_key().as_bytes()
}

/// Whether an X25519 public key is a point of small order (docs/behaviour.md#hardening): every secret key
/// agrees the same shared secret with it (all zeros), so a box sealed to it is open to anyone.
/// The test is libsodium's: a clamped scalar multiple of such a point is the identity, whose
/// encoding is zero; for any other point it is not.
pub fn is_small_order(public_key: &[u8; 32]) -> bool {
    let any_scalar = [0x5a; 32];
    curve25519_dalek::montgomery::MontgomeryPoint(*public_key).mul_clamped(any_scalar).to_bytes() == [0u8; 32]
}

/// Decodes a base64 X25519 public key.
pub fn decode_public_key(b64: &str) -> Option<[u8; 32]> {
    let bytes = B64.decode(b64.trim()).ok()?;
    bytes.try_into().ok()
}

/// Seals `plaintext` to `public_key`; the result is base64.
pub fn seal(public_key: &[u8; 32], plaintext: &[u8]) -> String {
    B64.encode(seal_raw(public_key, plaintext))
}

/// Seals `plaintext` to `public_key`: the sealed box's bytes, [`OVERHEAD`] more than the
/// plaintext (what the controller keeps; base64 is a third larger).
pub fn seal_raw(public_key: &[u8; 32], plaintext: &[u8]) -> Vec<u8> {
    let pk = PublicKey::from(*public_key);
    // Sealing only fails on a message larger than memory allows.
    pk.seal(&mut OsRng, plaintext).expect("sealing a PAT cannot fail")
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OpenError {
    #[error("ciphertext is not base64")]
    NotBase64,
    #[error("credential cannot be opened with this node's key")]
    WrongKey,
}

/// Opens a base64 sealed box with `secret_key`.
pub fn open(secret_key: &[u8; 32], ciphertext_b64: &str) -> Result<Vec<u8>, OpenError> {
    let ct = B64.decode(ciphertext_b64).map_err(|_| OpenError::NotBase64)?;
    let sk = SecretKey::from(*secret_key);
    sk.unseal(&ct).map_err(|_| OpenError::WrongKey)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_order_keys_are_recognised_and_real_ones_are_not() {
        let mut p = [0xffu8; 32]; // p = 2^255 - 19, little-endian: ed ff … ff 7f
        p[0] = 0xed;
        p[31] = 0x7f;
        let mut p_minus_1 = p;
        p_minus_1[0] = 0xec;
        let mut p_plus_1 = p;
        p_plus_1[0] = 0xee;
        let mut one = [0u8; 32];
        one[0] = 1;
        for (what, k) in [("0", [0u8; 32]), ("1", one), ("p-1", p_minus_1), ("p", p), ("p+1", p_plus_1)] {
            assert!(is_small_order(&k), "{what}");
        }
        for _ in 0..32 {
            assert!(!is_small_order(&generate_keypair().1));
        }
    }

    #[test]
    fn libsodium_vectors_open() {
        // Vectors made with libsodium, checked in beside the crate.
        check_vectors(include_str!("../testdata/sealed-box.json"));
    }

    fn check_vectors(text: &str) {
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        let vectors = v["vectors"].as_array().unwrap();
        assert!(vectors.len() >= 4);
        for vec in vectors {
            let sk: [u8; 32] = B64.decode(vec["secretKey"].as_str().unwrap()).unwrap().try_into().unwrap();
            let pk: [u8; 32] = B64.decode(vec["publicKey"].as_str().unwrap()).unwrap().try_into().unwrap();
            assert_eq!(*SecretKey::from(sk).public_key().as_bytes(), pk);
            let plain = B64.decode(vec["plaintext"].as_str().unwrap()).unwrap();
            let ct = vec["ciphertext"].as_str().unwrap();
            assert_eq!(B64.decode(ct).unwrap().len(), plain.len() + OVERHEAD);
            assert_eq!(open(&sk, ct).unwrap(), plain);
            // and a box we make opens with the same key
            assert_eq!(open(&sk, &seal(&pk, &plain)).unwrap(), plain);
        }
    }

    #[test]
    fn only_the_right_key_opens() {
        let (sk, pk) = generate_keypair();
        let (other, _) = generate_keypair();
        let ct = seal(&pk, b"pat_secret");
        assert_eq!(open(&sk, &ct).unwrap(), b"pat_secret");
        assert_eq!(open(&other, &ct), Err(OpenError::WrongKey));
        assert_eq!(open(&sk, "not base64!"), Err(OpenError::NotBase64));
        assert_eq!(OpenError::WrongKey.to_string(), "credential cannot be opened with this node's key");
    }
}
