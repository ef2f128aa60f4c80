//! ULIDs for run, trace, span and tool-call ids, and their compact 16-byte
//! storage form.

use parking_lot::Mutex;
use std::sync::OnceLock;
use ulid::{Generator, Ulid};

fn generator() -> &'static Mutex<Generator> {
    static GEN: OnceLock<Mutex<Generator>> = OnceLock::new();
    GEN.get_or_init(|| Mutex::new(Generator::new()))
}

/// A new ULID, strictly increasing within this process (monotonic within a
/// millisecond), so ids sort by creation order.
pub fn new_ulid() -> String {
    let mut gen = generator().lock();
    match gen.generate() {
        Ok(id) => id.to_string(),
        // The random part overflowed within one millisecond: fall back to a
        // fresh id, still time-ordered at millisecond precision.
        Err(_) => Ulid::new().to_string(),
    }
}

/// The longest run id a caller may choose (OPS-10).
pub const MAX_RUN_ID: usize = 128;

/// Checks a caller-chosen run id: 1 to `MAX_RUN_ID` characters, each an
/// ASCII letter or digit or one of `-_.:@/`.
pub fn check_run_id(run_id: &str) -> Result<(), String> {
    let bad = run_id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-_.:@/".contains(*c)));
    if run_id.is_empty() || run_id.chars().count() > MAX_RUN_ID {
        return Err(format!(
            "run_id must be 1 to {MAX_RUN_ID} characters long, got {} -- use a shorter key \
             (a hash of a long one)",
            run_id.chars().count()
        ));
    }
    if let Some(c) = bad {
        return Err(format!(
            "run_id {run_id:?} has the character {c:?} -- a run id is made of letters, digits \
             and - _ . : @ /"
        ));
    }
    Ok(())
}

/// `new_ulid` in its 16-byte stored form, with the time it was made (in
/// seconds since the epoch): one clock read for both.
pub fn new_ulid_bytes() -> ([u8; 16], f64) {
    let now = std::time::SystemTime::now();
    let at = now
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let mut gen = generator().lock();
    let id = match gen.generate_from_datetime(now) {
        Ok(id) => id,
        Err(_) => Ulid::from_datetime(now),
    };
    (id.to_bytes(), at)
}

/// The stored form of an id: 16 bytes when it is a canonical ULID, else the
/// text itself (ids written by other tools are kept verbatim).
pub enum StoredId {
    Bytes([u8; 16]),
    Text(String),
}

pub fn encode_id(id: &str) -> StoredId {
    match Ulid::from_string(id) {
        // Canonical only: the text it decodes back to (on the stack).
        Ok(u) if u.array_to_str(&mut [0; ulid::ULID_LEN]) == id => StoredId::Bytes(u.to_bytes()),
        _ => StoredId::Text(id.to_string()),
    }
}

pub fn decode_id(bytes: &[u8]) -> String {
    match <[u8; 16]>::try_from(bytes) {
        Ok(b) => Ulid::from_bytes(b).to_string(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

impl rusqlite::ToSql for StoredId {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(match self {
            StoredId::Bytes(b) => ToSqlOutput::Borrowed(ValueRef::Blob(b)),
            StoredId::Text(t) => ToSqlOutput::Borrowed(ValueRef::Text(t.as_bytes())),
        })
    }
}

/// Reads an id column written by `encode_id` (a blob or text).
pub fn read_id(v: rusqlite::types::ValueRef<'_>) -> Option<String> {
    use rusqlite::types::ValueRef;
    match v {
        ValueRef::Blob(b) => Some(decode_id(b)),
        ValueRef::Text(t) => Some(String::from_utf8_lossy(t).into_owned()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ulids_are_26_chars_and_increase() {
        let mut prev = new_ulid();
        assert_eq!(prev.len(), 26);
        for _ in 0..10_000 {
            let next = new_ulid();
            assert!(next > prev, "{next} <= {prev}");
            prev = next;
        }
    }

    #[test]
    fn ulid_round_trips_through_bytes() {
        let id = new_ulid();
        match encode_id(&id) {
            StoredId::Bytes(b) => assert_eq!(decode_id(&b), id),
            StoredId::Text(_) => panic!("canonical ulid stored as text"),
        }
    }

    #[test]
    fn foreign_ids_are_kept_as_text() {
        assert!(matches!(encode_id("call_7"), StoredId::Text(t) if t == "call_7"));
        assert!(matches!(
            encode_id("01jz3q8m2c4vdx9r7t5n6b1a0e"),
            StoredId::Text(_)
        ));
    }
}
