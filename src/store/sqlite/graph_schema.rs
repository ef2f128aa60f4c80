//! The graph tables (EXT-30, EXT-30a, EXT-32): threads, their checkpoints
//! and the audit trail. Schema version 5, and version 9 for the checkpoints
//! of threads; re-applying either is harmless.

use crate::error::{AtPath, CoreResult};
use rusqlite::Connection;

pub const VERSION: i64 = 5;

/// Schema version 9: a thread's checkpoints in a table of their own.
pub const STEPS_VERSION: i64 = 9;

pub const GRAPH_SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS graph_threads(
    thread_id TEXT PRIMARY KEY,
    graph TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    head TEXT,
    version INTEGER NOT NULL,
    status TEXT NOT NULL,
    run_id TEXT,
    owner TEXT,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL
);
-- A checkpoint holds its step's delta (positional reducer operations) or,
-- every so often, the whole state; states are rebuilt from the nearest
-- snapshot along parent links.
CREATE TABLE IF NOT EXISTS graph_checkpoints(
    checkpoint_id TEXT PRIMARY KEY,
    thread_id TEXT,
    rid INTEGER,
    parent_id TEXT,
    version INTEGER NOT NULL,
    source TEXT NOT NULL,
    status TEXT NOT NULL,
    run_id TEXT,
    step INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    delta_json TEXT,
    snapshot_json TEXT,
    meta_json TEXT NOT NULL
) WITHOUT ROWID;
-- Versions increase along a thread (and a thread-less run): the newest
-- checkpoint is the head.
CREATE INDEX IF NOT EXISTS graph_checkpoints_by_thread ON graph_checkpoints(thread_id, version);
CREATE INDEX IF NOT EXISTS graph_checkpoints_by_run ON graph_checkpoints(rid, version)
    WHERE thread_id IS NULL;
CREATE TABLE IF NOT EXISTS graph_audit(
    aid INTEGER PRIMARY KEY,
    thread_id TEXT NOT NULL,
    actor TEXT,
    action TEXT NOT NULL,
    checkpoint_id TEXT,
    at_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS graph_audit_by_thread ON graph_audit(thread_id, aid);
"#;

/// Checkpoints of threads from schema version 9 on (older rows stay in
/// `graph_checkpoints` and are read from there). The rowid is the thread's
/// `chain` (a random key given to the thread once) in the high bits and the
/// version in the low ones (see `checkpoint::step_rowid`), so a thread's
/// rows are clustered in version order with no secondary index: a step
/// appends one small row at its thread's end of the tree and writes a
/// single page, and a full page at the end of the table is split without
/// rewriting its neighbours. `parent_id` is left out (NULL) when it is the
/// previous version; `run_id` is stored in its 16-byte form.
pub const STEPS_SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS graph_steps(
    ckpt INTEGER PRIMARY KEY,
    parent_id TEXT,
    source TEXT NOT NULL,
    status TEXT NOT NULL,
    run_id BLOB,
    step INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    delta_json TEXT,
    snapshot_json TEXT,
    meta_json TEXT NOT NULL
);
"#;

/// Applies the version 9 step: `graph_steps`, and the `chain` column of
/// `graph_threads` with its index (a thread made before gets its chain
/// when it is next written).
pub fn apply_steps(conn: &Connection, path: &str) -> CoreResult<()> {
    conn.execute_batch(STEPS_SCHEMA).at(path)?;
    let has_chain: bool = conn
        .query_row(
            "SELECT count(*) FROM pragma_table_info('graph_threads') WHERE name = 'chain'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .at(path)?
        > 0;
    if !has_chain {
        conn.execute_batch("ALTER TABLE graph_threads ADD COLUMN chain INTEGER")
            .at(path)?;
    }
    conn.execute_batch(
        "CREATE UNIQUE INDEX IF NOT EXISTS graph_threads_by_chain ON graph_threads(chain)",
    )
    .at(path)
}
