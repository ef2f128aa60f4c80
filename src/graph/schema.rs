//! The graph tables (EXT-30, EXT-30a, EXT-32): threads, their checkpoints
//! and the audit trail. Schema version 5; re-applying is harmless.

pub const VERSION: i64 = 5;

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
