//! The PostgreSQL schema and its migration steps (its own version series;
//! step `n` brings a schema at `n - 1` to `n`).

/// Schema step 4 (idempotent): how often each run was recovered since it
/// last settled (STORE-12), and the holders whose lease of a run was taken
/// over, whose late spans are then refused even once the run has settled
/// (STORE-11).
pub(super) const LEASE_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS run_recoveries(\
     rid BIGINT PRIMARY KEY, count INTEGER NOT NULL); \
     CREATE TABLE IF NOT EXISTS lease_takeovers(rid BIGINT NOT NULL, owner TEXT NOT NULL, \
     PRIMARY KEY(rid, owner)); \
     CREATE INDEX IF NOT EXISTS runs_by_lease_expiry ON runs(lease_until) WHERE lease_owner IS NOT NULL;";

/// Versions of the PostgreSQL schema (its own series; step `n` brings a
/// schema at `n - 1` to `n`).
pub const PG_SCHEMA_VERSION: i32 = 7;

pub(super) const PG_SCHEMA_V1: &str = r#"
CREATE TABLE runs(
    rid BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    trace_id TEXT,
    fingerprint TEXT,
    args_json TEXT,
    output_json TEXT,
    error_json TEXT,
    budget_json TEXT,
    lease_owner TEXT,
    lease_until DOUBLE PRECISION
);
CREATE INDEX runs_by_created ON runs(created_at);
CREATE TABLE journal(
    rid BIGINT NOT NULL,
    step_key TEXT NOT NULL,
    value_json TEXT NOT NULL,
    PRIMARY KEY(rid, step_key)
);
CREATE TABLE spans(
    sid BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    trace_id TEXT NOT NULL,
    rid BIGINT,
    span_id BYTEA NOT NULL,
    parent BYTEA,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    ended_at DOUBLE PRECISION,
    status TEXT NOT NULL,
    flags INTEGER NOT NULL,
    step_key TEXT,
    attributes_json TEXT,
    error_json TEXT,
    input_tokens BIGINT,
    output_tokens BIGINT,
    cache_read_tokens BIGINT,
    cache_creation_tokens BIGINT,
    reasoning_tokens BIGINT,
    cost_usd DOUBLE PRECISION,
    cost_complete BOOLEAN,
    input_json TEXT,
    output_json TEXT
);
CREATE INDEX spans_by_trace ON spans(trace_id);
CREATE INDEX spans_by_run ON spans(rid);
CREATE TABLE pending_interrupts(
    rid BIGINT NOT NULL,
    interrupt_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    question TEXT,
    payload_json TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY(rid, interrupt_id)
);
CREATE TABLE agent_state(
    rid BIGINT NOT NULL,
    scope_key TEXT NOT NULL,
    messages_json TEXT,
    partial_results_json TEXT,
    turn BIGINT,
    updated_at DOUBLE PRECISION,
    PRIMARY KEY(rid, scope_key)
);
CREATE TABLE chats(
    chat_id TEXT PRIMARY KEY,
    agent_name TEXT,
    system TEXT,
    model TEXT,
    messages_json TEXT,
    created_at DOUBLE PRECISION,
    updated_at DOUBLE PRECISION
);
CREATE TABLE cancel_requests(
    rid BIGINT PRIMARY KEY,
    reason TEXT,
    created_at DOUBLE PRECISION NOT NULL
);
"#;

/// `(version, DDL)` of each step, in order; a schema at version `v` gets
/// every step above `v`.
pub(super) const MIGRATIONS: [(i32, &str); 7] = [
    (1, PG_SCHEMA_V1),
    (2, PG_SCHEMA_V2),
    (3, PG_QUEUE_SCHEMA),
    (4, LEASE_SCHEMA),
    (5, IDENT_SCHEMA),
    (6, MODULE_SCHEMA),
    (7, PUBLISHED_SCHEMA),
];

/// Schema version 6: the module defining each run's flow, so an error can
/// name the import that registers it; NULL for runs stored before it.
pub const MODULE_SCHEMA: &str = "ALTER TABLE runs ADD COLUMN IF NOT EXISTS module TEXT;";

/// Schema version 7: what runs publish (OPS-21, OPS-22) and the fork rows
/// of the journal a prune looks up (OPS-23), as on SQLite. A new event
/// value, stream value or stream end sends the wake-up hint, which readers
/// wait on.
pub const PUBLISHED_SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS run_events(
    rid BIGINT NOT NULL,
    key TEXT NOT NULL,
    value_json TEXT NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY(rid, key)
);
CREATE TABLE IF NOT EXISTS run_streams(
    rid BIGINT NOT NULL,
    key TEXT NOT NULL,
    seq BIGINT NOT NULL,
    value_json TEXT NOT NULL,
    PRIMARY KEY(rid, key, seq)
);
CREATE TABLE IF NOT EXISTS run_stream_ends(
    rid BIGINT NOT NULL,
    key TEXT NOT NULL,
    PRIMARY KEY(rid, key)
);
CREATE INDEX IF NOT EXISTS journal_forks ON journal(rid) WHERE step_key = '__fork__';
CREATE OR REPLACE TRIGGER wake_event AFTER INSERT OR UPDATE ON run_events
    FOR EACH STATEMENT EXECUTE FUNCTION wake();
CREATE OR REPLACE TRIGGER wake_stream AFTER INSERT ON run_streams
    FOR EACH STATEMENT EXECUTE FUNCTION wake();
CREATE OR REPLACE TRIGGER wake_stream_end AFTER INSERT ON run_stream_ends
    FOR EACH STATEMENT EXECUTE FUNCTION wake();
"#;

/// Schema version 5: each journal row's step identity (issue 27), NULL for
/// rows written before it (they replay unchecked).
pub const IDENT_SCHEMA: &str = "ALTER TABLE journal ADD COLUMN IF NOT EXISTS ident TEXT;";

/// Schema version 2: timers, signals, parked waits (EXT-1 … EXT-12) and
/// the graph tables (EXT-30 … EXT-33), as on SQLite.
pub const PG_SCHEMA_V2: &str = r#"
CREATE TABLE IF NOT EXISTS timers(
    rid BIGINT NOT NULL,
    step_key TEXT NOT NULL,
    wake_at DOUBLE PRECISION,
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY(rid, step_key)
);
CREATE TABLE IF NOT EXISTS signals(
    sid BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rid BIGINT NOT NULL,
    name TEXT NOT NULL,
    seq BIGINT NOT NULL,
    value_json TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    UNIQUE(rid, name, seq)
);
CREATE TABLE IF NOT EXISTS waits(
    rid BIGINT PRIMARY KEY,
    step_key TEXT NOT NULL,
    wake_at DOUBLE PRECISION,
    signal_name TEXT,
    signal_seq BIGINT,
    after_sid BIGINT,
    module TEXT
);
CREATE INDEX IF NOT EXISTS waits_by_wake ON waits(wake_at) WHERE wake_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS waits_on_signals ON waits(rid)
    WHERE signal_name IS NOT NULL OR after_sid IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_running ON runs(rid) WHERE status = 'running';
CREATE INDEX IF NOT EXISTS runs_leased ON runs(rid) WHERE lease_owner IS NOT NULL;
CREATE TABLE IF NOT EXISTS graph_threads(
    thread_id TEXT PRIMARY KEY,
    graph TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    head TEXT,
    version BIGINT NOT NULL,
    status TEXT NOT NULL,
    run_id TEXT,
    owner TEXT,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS graph_checkpoints(
    checkpoint_id TEXT PRIMARY KEY,
    thread_id TEXT,
    rid BIGINT,
    parent_id TEXT,
    version BIGINT NOT NULL,
    source TEXT NOT NULL,
    status TEXT NOT NULL,
    run_id TEXT,
    step BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    delta_json TEXT,
    snapshot_json TEXT,
    meta_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS graph_checkpoints_by_thread
    ON graph_checkpoints(thread_id, version);
CREATE INDEX IF NOT EXISTS graph_checkpoints_by_run ON graph_checkpoints(rid, version)
    WHERE thread_id IS NULL;
CREATE TABLE IF NOT EXISTS graph_audit(
    aid BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    thread_id TEXT NOT NULL,
    actor TEXT,
    action TEXT NOT NULL,
    checkpoint_id TEXT,
    at_ms BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS graph_audit_by_thread ON graph_audit(thread_id, aid);
"#;

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
