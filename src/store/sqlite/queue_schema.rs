//! Tables of the queues (STORE-20 … STORE-23): SQLite schema version 6,
//! PostgreSQL schema version 3 (EXT-0.3: new tables only). A run waiting
//! in a queue has status `queued` and a `queue_runs` row without
//! `started_at`; a claim sets `started_at` (the rate limit counts those)
//! and moves the run to `running`.

use crate::error::{AtPath, CoreResult};
use rusqlite::Connection;

pub const SQLITE_VERSION: i64 = 6;

pub const SQLITE_QUEUE_SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS queue_runs(
    rid INTEGER PRIMARY KEY,
    queue TEXT NOT NULL,
    priority INTEGER NOT NULL,
    dedup_id TEXT,
    enqueued_at REAL NOT NULL,
    started_at REAL
);
CREATE INDEX IF NOT EXISTS queue_runs_fifo ON queue_runs(queue, rid) WHERE started_at IS NULL;
CREATE INDEX IF NOT EXISTS queue_runs_by_priority ON queue_runs(queue, priority, rid)
    WHERE started_at IS NULL;
CREATE INDEX IF NOT EXISTS queue_runs_started ON queue_runs(queue, started_at)
    WHERE started_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS queue_runs_dedup ON queue_runs(queue, dedup_id)
    WHERE dedup_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_running ON runs(rid) WHERE status = 'running';
-- A queued run that leaves the queue without a claim (cancelled, or resumed
-- by hand) stops waiting in it; a deleted run takes its row along.
CREATE TRIGGER IF NOT EXISTS queue_runs_left AFTER UPDATE OF status ON runs
    WHEN OLD.status = 'queued' AND NEW.status NOT IN ('queued', 'running')
    BEGIN DELETE FROM queue_runs WHERE rid = OLD.rid AND started_at IS NULL; END;
CREATE TRIGGER IF NOT EXISTS queue_runs_deleted AFTER DELETE ON runs
    BEGIN DELETE FROM queue_runs WHERE rid = OLD.rid; END;
"#;

pub fn apply_sqlite(conn: &Connection, path: &str) -> CoreResult<()> {
    conn.execute_batch(SQLITE_QUEUE_SCHEMA).at(path)
}
