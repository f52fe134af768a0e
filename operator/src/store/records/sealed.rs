//! A PAT as the registry keeps it: its id and its sealed box in one allocation. At 100,000
//! PATs each allocation is ~1 MB: the id and the box apart would be two (64 and 96 bytes in
//! jemalloc's classes), together they are one of 112 for ids of the usual form.
//!
//! The box is kept as bytes and encoded to base64 (as stored and served) only when a desired
//! body or a row is written; a stored text that is not canonical base64 is kept as it is, so
//! what is served is always what was stored. An id that ends in lowercase hex (IAM's
//! `cred_7f06…d5`) keeps that part as bytes; any other id is kept as its text.
//!
//! Layout: `[id form] [id…] [box form] [box…]`, where the id is `[u16 length][text]` or
//! `[u8 prefix length][prefix][u8 byte count][bytes]`, and the box runs to the end.
//!
//! A box is needed only to serve it: once its node has a desired state holding it, the
//! registry keeps the id alone ([`Sealed::id_only`], 32 bytes instead of 112) and a later
//! desired state reads the box back from the database.

use std::borrow::Cow;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Sealed(Box<[u8]>);

const ID_TEXT: u8 = 0;
const ID_HEX: u8 = 1;
const BOX_RAW: u8 = 0;
const BOX_TEXT: u8 = 1;
/// The box is in the database only.
const BOX_NONE: u8 = 2;

impl Sealed {
    /// A PAT with its sealed box's bytes.
    pub fn raw(id: &str, sealed: &[u8]) -> Sealed {
        Self::build(id, BOX_RAW, sealed)
    }

    /// A PAT with its sealed box as stored (base64).
    pub fn from_base64(id: &str, text: &str) -> Sealed {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        match b64.decode(text) {
            Ok(raw) if b64.encode(&raw) == text => Self::build(id, BOX_RAW, &raw),
            _ => Self::build(id, BOX_TEXT, text.as_bytes()),
        }
    }

    /// A PAT whose box is in the database only.
    pub fn stored(id: &str) -> Sealed {
        Self::build(id, BOX_NONE, &[])
    }

    fn build(id: &str, form: u8, sealed: &[u8]) -> Sealed {
        let mut out = Vec::with_capacity(4 + id.len() + 1 + sealed.len());
        push_id(&mut out, id);
        out.push(form);
        out.extend_from_slice(sealed);
        Sealed(out.into_boxed_slice())
    }

    /// The PAT's id.
    pub fn id(&self) -> Cow<'_, str> {
        match self.parts() {
            Some((IdPart::Text(t), _)) => Cow::Borrowed(t),
            Some((IdPart::Hex(prefix, raw), _)) => {
                let mut s = String::with_capacity(prefix.len() + 2 * raw.len());
                s.push_str(prefix);
                for b in raw {
                    s.push(hex_digit(b >> 4));
                    s.push(hex_digit(b & 15));
                }
                Cow::Owned(s)
            }
            None => Cow::Borrowed(""),
        }
    }

    /// The same PAT without its box: what the registry keeps once its node has it.
    pub fn id_only(&self) -> Sealed {
        let at = self.id_end();
        let mut out = Vec::with_capacity(at + 1);
        out.extend_from_slice(&self.0[..at]);
        out.push(BOX_NONE);
        Sealed(out.into_boxed_slice())
    }

    /// Whether the box is held here (else it is in the database only).
    pub fn has_box(&self) -> bool {
        !matches!(self.parts(), Some((_, (BOX_NONE, _))) | None)
    }

    /// The id as kept: equal for the same PAT with or without its box, so a hash of it
    /// does not change when the box is let go.
    pub fn id_bytes(&self) -> &[u8] {
        &self.0[..self.id_end()]
    }

    /// Where the id part ends (the box form's position).
    fn id_end(&self) -> usize {
        match self.parts() {
            Some((_, (_, sealed))) => self.0.len() - sealed.len() - 1,
            None => self.0.len(),
        }
    }

    /// The sealed box as stored and served; `None` when it is in the database only.
    pub fn ciphertext(&self) -> Option<String> {
        use base64::Engine;
        match self.parts() {
            Some((_, (BOX_RAW, raw))) => Some(base64::engine::general_purpose::STANDARD.encode(raw)),
            Some((_, (BOX_NONE, _))) | None => None,
            // Built from a `&str`, so always UTF-8.
            Some((_, (_, text))) => Some(String::from_utf8_lossy(text).into_owned()),
        }
    }

    /// The sealed box as stored and served (empty when it is in the database only).
    pub fn to_base64(&self) -> String {
        self.ciphertext().unwrap_or_default()
    }

    /// The sealed box's length when it is held as bytes.
    pub fn raw_len(&self) -> Option<usize> {
        match self.parts() {
            Some((_, (BOX_RAW, raw))) => Some(raw.len()),
            _ => None,
        }
    }

    /// The id and (box form, box bytes); `None` only for bytes this type did not build.
    fn parts(&self) -> Option<(IdPart<'_>, (u8, &[u8]))> {
        let (&form, rest) = self.0.split_first()?;
        let (id, rest) = match form {
            ID_TEXT => {
                let (len, rest) = rest.split_first_chunk::<2>()?;
                let (text, rest) = rest.split_at_checked(u16::from_le_bytes(*len) as usize)?;
                (IdPart::Text(std::str::from_utf8(text).ok()?), rest)
            }
            _ => {
                let (&plen, rest) = rest.split_first()?;
                let (prefix, rest) = rest.split_at_checked(plen as usize)?;
                let (&n, rest) = rest.split_first()?;
                let (raw, rest) = rest.split_at_checked(n as usize)?;
                (IdPart::Hex(std::str::from_utf8(prefix).ok()?, raw), rest)
            }
        };
        let (&box_form, sealed) = rest.split_first()?;
        Some((id, (box_form, sealed)))
    }
}

enum IdPart<'a> {
    Text(&'a str),
    Hex(&'a str, &'a [u8]),
}

/// Appends the id: its trailing lowercase hex (an even number of digits) as bytes when there
/// is any, else its text.
fn push_id(out: &mut Vec<u8>, id: &str) {
    let hex_len = id.bytes().rev().take_while(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')).count() & !1;
    let (prefix, hex) = id.split_at(id.len() - hex_len);
    if hex_len > 0 && prefix.len() <= 255 && hex_len / 2 <= 255 {
        out.push(ID_HEX);
        out.push(prefix.len() as u8);
        out.extend_from_slice(prefix.as_bytes());
        out.push((hex_len / 2) as u8);
        out.extend(hex.as_bytes().chunks(2).map(|d| (nibble(d[0]) << 4) | nibble(d[1])));
    } else {
        // IAM's ids are at most 200 bytes (`platform::iam`); a longer stored one is cut at
        // 65,535, which no path segment reaches.
        let text = &id.as_bytes()[..id.len().min(u16::MAX as usize)];
        out.push(ID_TEXT);
        out.extend_from_slice(&(text.len() as u16).to_le_bytes());
        out.extend_from_slice(text);
    }
}

fn nibble(d: u8) -> u8 {
    match d {
        b'0'..=b'9' => d - b'0',
        _ => d - b'a' + 10,
    }
}

fn hex_digit(n: u8) -> char {
    char::from_digit(u32::from(n), 16).unwrap_or('0')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_pat_is_kept_as_bytes_and_served_as_the_base64_stored() {
        let pk = fleet_api::seal::generate_keypair().1;
        let text = fleet_api::seal::seal(&pk, b"pat-token");
        let sealed = Sealed::from_base64("cred_1", &text);
        assert_eq!(sealed.raw_len(), Some(9 + fleet_api::seal::OVERHEAD));
        assert_eq!(sealed.to_base64(), text);
        // Anything else a row may hold is kept and served as it was.
        for odd in ["", "c", "sealed-1", "QUJD\n", "QUI"] {
            assert_eq!(Sealed::from_base64("cred_1", odd).to_base64(), odd, "{odd:?}");
        }
        assert_eq!(Sealed::from_base64("cred_1", "sealed-1").raw_len(), None);
    }

    /// Every id comes back as it was given, whatever its form.
    #[test]
    fn ids_come_back_as_given() {
        let long = "x".repeat(300);
        let long_hex = format!("p_{}", "ab".repeat(300));
        for id in [
            "cred_7f06edb9962b48a89f0efbb83fa834d5",
            "cred_7f06edb9962b48a89f0efbb83fa834d",
            "p0",
            "abc",
            "deadbeef",
            "",
            "CRED_ABCDEF",
            "tok-0a",
            "ü-0a",
            long.as_str(),
            long_hex.as_str(),
        ] {
            let s = Sealed::raw(id, &[1, 2, 3]);
            assert_eq!(s.id(), id, "{id:?}");
            assert_eq!(s.raw_len(), Some(3), "{id:?}");
        }
    }

    /// Without its box a PAT keeps its id, its hash key and a 32-byte allocation; the box
    /// is gone and nothing pretends otherwise.
    #[test]
    fn a_pat_without_its_box_keeps_its_id() {
        for id in ["cred_7f06edb9962b48a89f0efbb83fa834d5", "tok-x", ""] {
            for s in [Sealed::raw(id, &[7; 85]), Sealed::from_base64(id, "sealed-1")] {
                assert!(s.has_box());
                let kept = s.id_only();
                assert!(!kept.has_box(), "{id:?}");
                assert_eq!(kept.id(), id);
                assert_eq!(kept.id_bytes(), s.id_bytes());
                assert_eq!(kept.ciphertext(), None);
                assert_eq!(kept.id_only(), kept);
                assert_eq!(Sealed::stored(id), kept);
            }
        }
        assert!(Sealed::raw("cred_7f06edb9962b48a89f0efbb83fa834d5", &[0; 85]).id_only().0.len() <= 32);
    }

    /// IAM's usual id and a sealed PAT (devkit's are 37 bytes, 85 sealed) fit jemalloc's
    /// 112-byte class together.
    #[test]
    fn an_id_and_its_box_are_one_small_allocation() {
        let s = Sealed::raw("cred_7f06edb9962b48a89f0efbb83fa834d5", &[0; 37 + fleet_api::seal::OVERHEAD]);
        assert!(s.0.len() <= 112, "{} bytes", s.0.len());
    }
}
