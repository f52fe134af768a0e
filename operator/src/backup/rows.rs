//! A row as the backup reads and writes it, whatever the backend: values of the four kinds of
//! the catalogue (`tables`), and a checksum of a table that does not depend on the order the
//! rows were read in nor on the backend they came from (a row's values are encoded by kind, a
//! PostgreSQL `BOOLEAN` as the 0/1 SQLite keeps).

use sha2::{Digest, Sha256};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Null,
    Int(i64),
    Text(String),
    Blob(Vec<u8>),
}

impl Value {
    /// A tag, then the value; lengths first so that no two rows encode alike.
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Value::Null => out.push(b'N'),
            Value::Int(i) => {
                out.push(b'I');
                out.extend_from_slice(&i.to_be_bytes());
            }
            Value::Text(t) => {
                out.push(b'T');
                out.extend_from_slice(&(t.len() as u64).to_be_bytes());
                out.extend_from_slice(t.as_bytes());
            }
            Value::Blob(b) => {
                out.push(b'B');
                out.extend_from_slice(&(b.len() as u64).to_be_bytes());
                out.extend_from_slice(b);
            }
        }
    }
}

/// The rows of one table, digested as they are read: the count and the checksum.
#[derive(Debug, Default)]
pub struct Tally {
    digests: Vec<[u8; 32]>,
}

impl Tally {
    pub fn add(&mut self, row: &[Value]) {
        let mut bytes = Vec::with_capacity(64);
        for v in row {
            v.encode(&mut bytes);
        }
        self.digests.push(Sha256::digest(&bytes).into());
    }

    pub fn rows(&self) -> u64 {
        self.digests.len() as u64
    }

    /// The SHA-256 of the rows' digests in sorted order, hex (the first 16 bytes).
    pub fn checksum(mut self) -> String {
        self.digests.sort_unstable();
        let mut h = Sha256::new();
        for d in &self.digests {
            h.update(d);
        }
        h.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tables_checksum_is_the_same_in_any_order_and_tells_rows_apart() {
        let rows = [
            vec![Value::Text("a".into()), Value::Int(1)],
            vec![Value::Text("b".into()), Value::Null],
            vec![Value::Blob(vec![1, 2]), Value::Int(0)],
        ];
        let sum = |order: &[usize]| {
            let mut t = Tally::default();
            order.iter().for_each(|&i| t.add(&rows[i]));
            t.checksum()
        };
        assert_eq!(sum(&[0, 1, 2]), sum(&[2, 0, 1]));
        assert_ne!(sum(&[0, 1, 2]), sum(&[0, 1]));
        // The same bytes under another kind, or split otherwise, are another row.
        let one = |row: Vec<Value>| {
            let mut t = Tally::default();
            t.add(&row);
            t.checksum()
        };
        assert_ne!(one(vec![Value::Text("ab".into())]), one(vec![Value::Blob(b"ab".to_vec())]));
        assert_ne!(
            one(vec![Value::Text("ab".into()), Value::Text("".into())]),
            one(vec![Value::Text("a".into()), Value::Text("b".into())])
        );
        assert_ne!(one(vec![Value::Null]), one(vec![Value::Int(0)]));
    }
}
