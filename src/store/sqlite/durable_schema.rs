//! Tables of the durable primitives (schema version 4, EXT-0.3). Applied
//! after the base schema of a new store and as an upgrade step of an older
//! one; every statement is idempotent.

use crate::error::{AtPath, CoreResult};
use rusqlite::Connection;

pub const DURABLE_SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS timers(
    rid INTEGER NOT NULL,
    step_key TEXT NOT NULL,
    wake_at REAL,
    created_at REAL NOT NULL,
    PRIMARY KEY(rid, step_key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS signals(
    sid INTEGER PRIMARY KEY,
    rid INTEGER NOT NULL,
    name TEXT NOT NULL,
    seq INTEGER NOT NULL,
    value_json TEXT NOT NULL,
    created_at REAL NOT NULL,
    UNIQUE(rid, name, seq)
);
CREATE TABLE IF NOT EXISTS cancel_requests(
    rid INTEGER PRIMARY KEY,
    reason TEXT,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS waits(
    rid INTEGER PRIMARY KEY,
    step_key TEXT NOT NULL,
    wake_at REAL,
    signal_name TEXT,
    signal_seq INTEGER,
    after_sid INTEGER,
    module TEXT
);
CREATE INDEX IF NOT EXISTS waits_by_wake ON waits(wake_at) WHERE wake_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS waits_on_signals ON waits(rid)
    WHERE signal_name IS NOT NULL OR after_sid IS NOT NULL;
"#;

/// Schema version 8: the runs a worker may recover (running, or holding a
/// lease) are found through one partial index instead of one per condition,
/// so starting and settling a run each write one index page fewer.
pub const ACTIVE_RUNS_VERSION: i64 = 8;

pub const ACTIVE_RUNS_SCHEMA: &str = r#"
CREATE INDEX IF NOT EXISTS runs_active ON runs(rid)
    WHERE status = 'running' OR lease_owner IS NOT NULL;
DROP INDEX IF EXISTS runs_running;
DROP INDEX IF EXISTS runs_leased;
"#;

pub fn apply(conn: &Connection, path: &str) -> CoreResult<()> {
    conn.execute_batch(DURABLE_SCHEMA).at(path)
}

/// Deletes the durable rows of a run (with the run itself).
pub fn delete_sql(rid: i64) -> String {
    format!(
        "DELETE FROM timers WHERE rid = {rid}; DELETE FROM signals WHERE rid = {rid}; \
         DELETE FROM cancel_requests WHERE rid = {rid}; DELETE FROM waits WHERE rid = {rid};"
    )
}
