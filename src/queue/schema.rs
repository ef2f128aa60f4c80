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

/// Besides the queue tables, triggers that send the wake-up hint
/// (STORE-22) on channel `<schema>.wake` whenever something a waiting
/// worker or blocked run looks for changes: a new queued run, a run's
/// status (a slot of a queue freed, a run parked on a timer), a cancel
/// request, an answer, and, where those tables exist, a signal or a parked
/// wait. A hint only: every receiver reads the store again.
pub const PG_QUEUE_SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS queue_runs(
    rid BIGINT PRIMARY KEY,
    queue TEXT NOT NULL,
    priority BIGINT NOT NULL,
    dedup_id TEXT,
    enqueued_at DOUBLE PRECISION NOT NULL,
    started_at DOUBLE PRECISION
);
CREATE INDEX IF NOT EXISTS queue_runs_fifo ON queue_runs(queue, rid) WHERE started_at IS NULL;
CREATE INDEX IF NOT EXISTS queue_runs_by_priority ON queue_runs(queue, priority, rid)
    WHERE started_at IS NULL;
CREATE INDEX IF NOT EXISTS queue_runs_started ON queue_runs(queue, started_at)
    WHERE started_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS queue_runs_dedup ON queue_runs(queue, dedup_id)
    WHERE dedup_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_running_queue ON runs(rid) WHERE status = 'running';

CREATE OR REPLACE FUNCTION queue_runs_left() RETURNS trigger LANGUAGE plpgsql
    SET search_path FROM CURRENT AS $$
BEGIN
    DELETE FROM queue_runs WHERE rid = OLD.rid AND (TG_OP = 'DELETE' OR started_at IS NULL);
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER queue_runs_left AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (OLD.status = 'queued' AND NEW.status NOT IN ('queued', 'running'))
    EXECUTE FUNCTION queue_runs_left();
CREATE OR REPLACE TRIGGER queue_runs_deleted AFTER DELETE ON runs FOR EACH ROW
    EXECUTE FUNCTION queue_runs_left();

CREATE OR REPLACE FUNCTION wake() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '.wake', TG_TABLE_NAME);
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER wake_queued AFTER INSERT ON runs FOR EACH ROW
    WHEN (NEW.status = 'queued') EXECUTE FUNCTION wake();
CREATE OR REPLACE TRIGGER wake_status AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION wake();
CREATE OR REPLACE TRIGGER wake_cancel AFTER INSERT OR UPDATE ON cancel_requests FOR EACH ROW
    EXECUTE FUNCTION wake();
CREATE OR REPLACE TRIGGER wake_answer AFTER DELETE ON pending_interrupts FOR EACH ROW
    EXECUTE FUNCTION wake();
DO $$
BEGIN
    IF to_regclass('signals') IS NOT NULL THEN
        CREATE OR REPLACE TRIGGER wake_signal AFTER INSERT ON signals FOR EACH ROW
            EXECUTE FUNCTION wake();
    END IF;
    IF to_regclass('waits') IS NOT NULL THEN
        CREATE OR REPLACE TRIGGER wake_wait AFTER INSERT ON waits FOR EACH ROW
            EXECUTE FUNCTION wake();
    END IF;
END $$;
"#;
