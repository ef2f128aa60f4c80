//! Schema step 14: each run's deadline (OPS-12), the schedules (OPS-11)
//! and the flows each live worker serves.

use crate::error::{AtPath, CoreResult};
use rusqlite::Connection;

pub const VERSION: i64 = 14;

const TABLES: &str = r#"
CREATE INDEX IF NOT EXISTS runs_by_deadline ON runs(deadline) WHERE deadline IS NOT NULL;
CREATE TABLE IF NOT EXISTS schedules(
    name TEXT PRIMARY KEY,
    flow TEXT NOT NULL,
    cron TEXT NOT NULL,
    timezone TEXT NOT NULL,
    catchup TEXT NOT NULL,
    queue TEXT,
    args_json TEXT NOT NULL,
    paused INTEGER NOT NULL DEFAULT 0,
    next_fire REAL,
    last_fire REAL,
    last_run_id TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS worker_flows(
    owner TEXT NOT NULL,
    flow TEXT NOT NULL,
    seen_at REAL NOT NULL,
    PRIMARY KEY(owner, flow)
) WITHOUT ROWID;
"#;

/// Applies the step; idempotent, as the steps before it (a store stamped
/// older may have part of it).
pub fn apply(conn: &Connection, path: &str) -> CoreResult<()> {
    let has_deadline: bool = conn
        .query_row(
            "SELECT count(*) > 0 FROM pragma_table_info('runs') WHERE name = 'deadline'",
            [],
            |r| r.get(0),
        )
        .at(path)?;
    if !has_deadline {
        conn.execute_batch("ALTER TABLE runs ADD COLUMN deadline REAL")
            .at(path)?;
    }
    conn.execute_batch(TABLES).at(path)
}
