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

#[cfg(test)]
mod tests {
    use crate::store::sqlite::open_connection;
    use rusqlite::Connection;

    fn runs_indexes(conn: &Connection) -> Vec<String> {
        let mut st = conn
            .prepare(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'runs' \
                 AND sql IS NOT NULL ORDER BY name",
            )
            .unwrap();
        let names = st.query_map([], |r| r.get(0)).unwrap();
        names.collect::<rusqlite::Result<_>>().unwrap()
    }

    fn plan(conn: &Connection, sql: &str) -> Vec<String> {
        let mut st = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let rows = st.query_map([], |r| r.get(3)).unwrap();
        rows.collect::<rusqlite::Result<_>>().unwrap()
    }

    #[test]
    fn version_8_replaces_the_two_recovery_indexes_with_one() {
        let dir = std::env::temp_dir().join(format!("composeai-active-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("runs.db").to_string_lossy().into_owned();
        let _ = std::fs::remove_file(&path);
        let conn = open_connection(&path, false).unwrap();
        assert_eq!(runs_indexes(&conn), ["runs_active", "runs_by_created"]);
        // Both halves of the recovery query read the runs it may return
        // through the partial index, never the whole table.
        let steps = plan(&conn, crate::store::sqlite::durable::RECOVERABLE_RUNS);
        let scans: Vec<_> = steps.iter().filter(|s| s.contains("runs")).collect();
        assert_eq!(scans.len(), 2, "{steps:?}");
        assert!(
            scans.iter().all(|s| s.contains("USING INDEX runs_active")),
            "{steps:?}"
        );
        // A version-5 store (the two older indexes) is brought to version 8.
        conn.execute_batch(
            "DROP INDEX runs_active; \
             CREATE INDEX runs_running ON runs(rid) WHERE status = 'running'; \
             CREATE INDEX runs_leased ON runs(rid) WHERE lease_owner IS NOT NULL; \
             PRAGMA user_version = 5;",
        )
        .unwrap();
        drop(conn);
        let conn = open_connection(&path, false).unwrap();
        assert_eq!(runs_indexes(&conn), ["runs_active", "runs_by_created"]);
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, crate::store::sqlite::SCHEMA_VERSION);
        drop(conn);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
