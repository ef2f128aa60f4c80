//! The tables of events, streams and the journal's fork rows on SQLite
//! (OPS-21 … OPS-23): schema step 13, applied to a new store and as an
//! upgrade step of an older one; every statement is idempotent.

/// Schema step 13: the latest value of each event key of a run, the values
/// of a run's streams by sequence number, the streams closed, and the fork
/// rows of the journal (a prune looks them up to spare the runs they
/// borrow from).
pub const VERSION: i64 = 13;

pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS run_events(
    rid INTEGER NOT NULL,
    key TEXT NOT NULL,
    value_json TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY(rid, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS run_streams(
    rid INTEGER NOT NULL,
    key TEXT NOT NULL,
    seq INTEGER NOT NULL,
    value_json TEXT NOT NULL,
    PRIMARY KEY(rid, key, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS run_stream_ends(
    rid INTEGER NOT NULL,
    key TEXT NOT NULL,
    PRIMARY KEY(rid, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS journal_forks ON journal(rid) WHERE step_key = '__fork__';
"#;
