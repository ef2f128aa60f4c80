//! The SQLite schema: what a new store is created with, and its version.

/// From version 10 on a run's own trace has no `traces` row: its spans are
/// stored under `tid = -rid`. No table changed; the version keeps an older
/// engine, which finds spans only through `traces`, from opening the store.
pub const SCHEMA_VERSION: i64 = 13;

pub const SCHEMA: &str = r#"
CREATE TABLE runs(
    rid INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    trace_id TEXT,
    fingerprint TEXT,
    args_json TEXT,
    output_json TEXT,
    error_json TEXT,
    budget_json TEXT,
    lease_owner TEXT,
    lease_until REAL
);
CREATE INDEX runs_by_created ON runs(created_at);
CREATE TABLE traces(tid INTEGER PRIMARY KEY, trace_id TEXT NOT NULL UNIQUE);
CREATE TABLE journal(
    rid INTEGER NOT NULL,
    step_key TEXT NOT NULL,
    value_json TEXT NOT NULL,
    PRIMARY KEY(rid, step_key)
) WITHOUT ROWID;
CREATE TABLE spans(
    sid INTEGER PRIMARY KEY,
    tid INTEGER NOT NULL,
    rid INTEGER,
    span_id BLOB NOT NULL,
    parent BLOB,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL,
    status TEXT NOT NULL,
    flags INTEGER NOT NULL,
    step_key TEXT,
    attributes_json TEXT,
    error_json TEXT,
    input_tokens INTEGER,
    output_tokens INTEGER,
    cache_read_tokens INTEGER,
    cache_creation_tokens INTEGER,
    reasoning_tokens INTEGER,
    cost_usd REAL,
    cost_complete INTEGER,
    input_json TEXT,
    output_json TEXT
);
-- Descending: a new run's own trace is `-rid`, below every earlier one, so
-- its spans append at the index's right edge instead of splitting its left.
CREATE INDEX spans_by_trace ON spans(tid DESC);
-- Covers `compose costs`: it reads only these columns of llm spans.
CREATE INDEX llm_spans_by_start ON spans(started_at, rid, input_tokens, output_tokens,
    cost_usd, cost_complete, name, attributes_json) WHERE kind = 'llm';
CREATE TABLE pending_interrupts(
    rid INTEGER NOT NULL,
    interrupt_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    question TEXT,
    payload_json TEXT,
    created_at REAL NOT NULL,
    PRIMARY KEY(rid, interrupt_id)
) WITHOUT ROWID;
CREATE TABLE agent_state(
    rid INTEGER NOT NULL,
    scope_key TEXT NOT NULL,
    messages_json TEXT,
    partial_results_json TEXT,
    turn INTEGER,
    updated_at REAL,
    PRIMARY KEY(rid, scope_key)
) WITHOUT ROWID;
CREATE TABLE chats(
    chat_id TEXT PRIMARY KEY,
    agent_name TEXT,
    system TEXT,
    model TEXT,
    messages_json TEXT,
    created_at REAL,
    updated_at REAL
);
"#;

/// The page size of a new store. Every commit appends each page it changed
/// to the WAL whole, and SQLite copies and checksums every byte of those
/// frames; the rows the engine commits (a step's journal row and span, a
/// run's row, an agent call's spans) are a few hundred bytes, so halving
/// SQLite's default 4,096 halves those bytes for about as many pages per
/// commit (bench/wal_pages.py). A store keeps the page size it was created
/// with.
pub const PAGE_SIZE: i64 = 2048;
