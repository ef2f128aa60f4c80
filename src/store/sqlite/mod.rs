//! SQLite implementation of `Store`: one WAL database per state directory.
//!
//! Writes go through a leader-based group commit. A caller enqueues its
//! operation, then takes the connection lock; if a previous lock holder
//! already committed the operation it just reads its result, otherwise it
//! commits everything queued in one transaction. Sequential callers thus
//! commit on their own thread with no hand-off, and concurrent callers share
//! commits.

pub mod batched;
pub mod chat;
mod checkpointer;
pub mod durable;
pub mod durable_schema;
pub mod graph;
pub mod graph_schema;
mod migrate;
mod multirow;
pub mod query;
pub mod queue;
pub mod queue_schema;
pub mod replayed;
pub mod statements;
pub mod step_spans;
pub mod wal_vfs;
pub mod write_tx;

use crate::error::{AtPath, CoreError, CoreResult};
use crate::ids::{encode_id, StoredId};
use crate::journal::{Journal, JournalLoader};
use crate::store::graph::GraphWork;
use crate::store::slot::{record_span_write_error, Slot, FLAG_OUTPUT_IN_JOURNAL, FLAG_REPLAYED};
use crate::store::spans::ReplayedSpan;
use crate::store::spans::SpanView;
use crate::store::sqlite::batched::BatchedSteps;
use crate::store::sqlite::checkpointer::Checkpointer;
use crate::store::sqlite::statements::{Params, Statements};
use crate::store::sqlite::write_tx::WriteTx;
use crate::store::{
    AgentStateRow, Claim, InterruptRow, LeaseCheck, NewRun, PriorSpend, RowSlot, RunRow,
    Settlement, SpanRecord, SpanRow, Store,
};
use crate::time::now;
use parking_lot::{Condvar, Mutex};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, TransactionBehavior};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// From version 10 on a run's own trace has no `traces` row: its spans are
/// stored under `tid = -rid`. No table changed; the version keeps an older
/// engine, which finds spans only through `traces`, from opening the store.
pub const SCHEMA_VERSION: i64 = 10;

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

/// Queued spans are written in the background once this many are waiting
/// (replayed steps queue one each): a replay's settlement, which must write
/// what is still queued (OBS-5), finds at most about this many rows left,
/// while each background commit still carries enough rows to keep pace.
const BACKGROUND_BATCH: usize = 64;
/// Queued writes past which the queuing thread writes them itself.
pub(crate) const MAX_BACKLOG: usize = 4096;

/// How long a finished span may wait in the queue before the background
/// writer commits it on its own.
const SPAN_LATENCY: std::time::Duration = std::time::Duration::from_millis(50);

/// How long a batch-durability step may wait in the queue before the
/// background writer group-commits it: half the 10 ms promised, leaving the
/// rest for the commit itself.
pub const BATCH_LATENCY: std::time::Duration = std::time::Duration::from_millis(5);

/// Batch-durability steps past which the background writer commits them
/// without waiting for `BATCH_LATENCY`: bounds a commit's length, and the
/// rows a settlement (or any synchronous write) has to write first.
const BATCH_STEPS: usize = 256;

#[derive(Default)]
struct Queue {
    ops: Vec<Op>,
    /// A deferred journal write is waiting: commit without waiting for a
    /// full batch.
    urgent: bool,
    /// When the oldest queued batch-durability step must be committed.
    due: Option<std::time::Instant>,
    /// A run row's insert is queued: reads of run rows write it first.
    rows: bool,
    /// Steps queued in `Op::Batched` since the last take.
    batched: usize,
    /// Emptied batches, their buffers kept for the next ones (boxed as in
    /// `Op::Batched`, so they move back without a new allocation).
    #[allow(clippy::vec_box)]
    spare: Vec<Box<BatchedSteps>>,
    /// Until when the background writer sleeps: `None` while it works,
    /// `Some(None)` until woken.
    writer_sleeps: Option<Option<std::time::Instant>>,
    shutdown: bool,
    background_started: bool,
}

enum Op {
    Span(Box<SpanRecord>),
    Step {
        rid: i64,
        key: String,
        value: String,
        slot: Arc<Slot>,
    },
    /// A run row created without a commit of its own
    /// (`Store::create_run_queued`).
    Run(Box<QueuedRun>),
    /// A span of a run whose row was queued: its rid is the row's.
    RowSpan(Arc<RowSlot>, Box<SpanRecord>),
    /// A replayed step's span (`replayed`): consecutive ones are inserted
    /// together.
    Replayed(ReplayedSpan),
    /// Consecutive batch-durability steps with their spans (`batched`).
    Batched(Box<BatchedSteps>),
}

struct QueuedRun {
    new: NewRun,
    owner: String,
    lease_until: f64,
    created_at: f64,
    slot: Arc<RowSlot>,
    /// `(status, output_json, error_json)` when the run settled before its
    /// row was written: the row is inserted settled.
    settled: Option<(String, Option<String>, Option<String>)>,
}

struct Writer {
    /// Before `conn`: finalized before it closes.
    statements: Statements,
    conn: Connection,
    traces: HashMap<String, i64>,
    /// After `conn`, which calls into it on every commit.
    checkpointer: Option<Checkpointer>,
}

/// The store's state, shared with its background writer thread.
pub struct Inner {
    path: String,
    writer: Mutex<Writer>,
    queue: Mutex<Queue>,
    wake: Condvar,
}

pub struct SqliteStore {
    inner: Arc<Inner>,
}

impl std::ops::Deref for SqliteStore {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.inner
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        self.queue.lock().shutdown = true;
        self.wake.notify_all();
    }
}

fn config(path: &str, what: String) -> CoreError {
    CoreError::Config(format!("composeai store '{path}': {what}"))
}

impl SqliteStore {
    /// Opens (creating, or migrating forward) the database at `path`.
    pub fn open(path: &str) -> CoreResult<SqliteStore> {
        let full_sync = std::env::var("COMPOSE_SYNC")
            .map(|v| v.eq_ignore_ascii_case("full"))
            .unwrap_or(false);
        let conn = open_connection(path, full_sync)?;
        // With an fsync per commit (`COMPOSE_SYNC=full`) a concurrent
        // checkpoint's fsyncs queue behind and ahead of the commits' own on
        // the same disk, which costs a step more than SQLite's inline
        // checkpoint (measured: W1-full 210 vs 140 us): the thread serves
        // the default `NORMAL` mode only.
        let checkpointer = if full_sync {
            None
        } else {
            Some(Checkpointer::start(path, &conn))
        };
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path: path.to_string(),
                writer: Mutex::new(Writer {
                    statements: Statements::default(),
                    conn,
                    traces: HashMap::new(),
                    checkpointer,
                }),
                queue: Mutex::new(Queue::default()),
                wake: Condvar::new(),
            }),
        })
    }

    /// Queues `op` and, when it should not wait for the next foreground
    /// commit, wakes the background writer (started on first need).
    fn enqueue(&self, op: Op, urgent: bool) {
        let mut q = self.queue.lock();
        q.ops.push(op);
        q.urgent |= urgent;
        if !self.start_writer(&mut q) {
            return;
        }
        if q.urgent || q.ops.len() >= BACKGROUND_BATCH {
            self.wake.notify_one();
        }
        if q.ops.len() >= MAX_BACKLOG {
            // The producer outruns the writer (a replay queues a span per
            // step faster than they are inserted): it writes the backlog
            // itself, so queued rows never grow with run length.
            drop(q);
            let mut w = self.lock_writer();
            // Failures reach waiting callers through their slots.
            let _ = self.drain(&mut w);
        }
    }

    /// After a batch-durability step was queued: the writer is told of the
    /// batch's deadline, or of a full batch, only when it would otherwise
    /// sleep past it (no wake-up per step).
    fn batch_queued(&self, mut q: parking_lot::MutexGuard<'_, Queue>) -> CoreResult<()> {
        if !self.start_writer(&mut q) {
            // No writer to meet the deadline: commit now.
            drop(q);
            return self.flush();
        }
        let sleeps = q.writer_sleeps;
        if q.due.is_none() {
            let due = std::time::Instant::now() + BATCH_LATENCY;
            q.due = Some(due);
            if sleeps.is_some_and(|until| until.is_none_or(|t| t > due)) {
                self.wake.notify_one();
            }
        } else if sleeps.is_some() && (q.batched >= BATCH_STEPS || q.ops.len() >= BACKGROUND_BATCH)
        {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Starts the background writer on first need; `false` when it could
    /// not be started (queued writes then wait for the next foreground
    /// commit or flush).
    fn start_writer(&self, q: &mut Queue) -> bool {
        if !q.background_started {
            q.background_started = true;
            let inner = Arc::clone(&self.inner);
            let spawned = std::thread::Builder::new()
                .name("composeai-writer".into())
                .spawn(move || inner.background_writer());
            if spawned.is_err() {
                q.background_started = false;
                return false;
            }
        }
        true
    }
}

impl Inner {
    fn lock_writer(&self) -> parking_lot::MutexGuard<'_, Writer> {
        self.writer.lock()
    }

    fn background_writer(&self) {
        loop {
            {
                let mut q = self.queue.lock();
                loop {
                    if q.shutdown
                        || q.urgent
                        || q.ops.len() >= BACKGROUND_BATCH
                        || q.batched >= BATCH_STEPS
                    {
                        break;
                    }
                    let timed_out = if let Some(due) = q.due {
                        q.writer_sleeps = Some(Some(due));
                        self.wake.wait_until(&mut q, due);
                        // Only a deadline that has passed ends the wait: the
                        // one slept on may have been met by a foreground
                        // commit and replaced by a later one (the next
                        // run's row), which is then slept on in turn.
                        q.due.is_some_and(|d| d <= std::time::Instant::now())
                    } else if q.ops.is_empty() {
                        q.writer_sleeps = Some(None);
                        self.wake.wait(&mut q);
                        false
                    } else {
                        // Finished spans reach the store within this delay
                        // even when nothing else commits (OBS-5).
                        let until = std::time::Instant::now() + SPAN_LATENCY;
                        q.writer_sleeps = Some(Some(until));
                        self.wake.wait_until(&mut q, until).timed_out()
                    };
                    q.writer_sleeps = None;
                    if timed_out {
                        break;
                    }
                }
                if q.shutdown && q.ops.is_empty() {
                    return;
                }
            }
            // Take the batch only while holding the connection, so that a
            // `flush` that got the connection first has seen every op.
            let mut w = self.lock_writer();
            let ops = self.take_queue();
            if !ops.is_empty() {
                // Failures reach waiting callers through their slots.
                let _ = self.apply(&mut w, ops, |_| Ok(()));
            }
        }
    }

    /// Writes waiting in the queue.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.queue.lock().ops.len()
    }

    /// Trace ids the writer remembers.
    #[cfg(test)]
    pub(crate) fn cached_traces(&self) -> usize {
        self.lock_writer().traces.len()
    }

    fn take_queue(&self) -> Vec<Op> {
        let mut q = self.queue.lock();
        q.urgent = false;
        q.due = None;
        q.rows = false;
        q.batched = 0;
        // The next batch is likely as long as this one: sized once, the
        // queue does not regrow (and move every op) while a replay fills it.
        let next = Vec::with_capacity(q.ops.len());
        std::mem::replace(&mut q.ops, next)
    }

    /// Runs `f` with the connection, after writing anything queued.
    pub fn with_conn<T>(&self, f: impl FnOnce(&mut Connection) -> CoreResult<T>) -> CoreResult<T> {
        let mut w = self.lock_writer();
        self.drain(&mut w)?;
        f(&mut w.conn)
    }

    fn drain(&self, w: &mut Writer) -> CoreResult<()> {
        let ops = self.take_queue();
        if ops.is_empty() {
            return Ok(());
        }
        self.apply(w, ops, |_| Ok(()))
    }

    /// Applies `ops` and then `extra` in one transaction, filling step slots.
    fn apply(
        &self,
        w: &mut Writer,
        ops: Vec<Op>,
        extra: impl FnOnce(&WriteTx<'_>) -> CoreResult<()>,
    ) -> CoreResult<()> {
        let path = self.path.clone();
        let Writer {
            conn,
            traces,
            statements,
            ..
        } = w;
        let mut results: Vec<(Arc<Slot>, CoreResult<Option<String>>)> = Vec::new();
        let mut extra_failed = false;
        let mut outcome = (|| -> CoreResult<()> {
            let tx = WriteTx::immediate(conn, statements).at(&path)?;
            write_ops(&tx, traces, statements, &ops, &mut results, &path)?;
            if let Err(e) = extra(&tx) {
                extra_failed = true;
                return Err(e);
            }
            tx.commit(statements).at(&path)
        })();
        let mut extra_error = None;
        if extra_failed && !ops.is_empty() {
            // The caller's own work failed (a refused graph operation): the
            // queued writes it carried are committed on their own.
            traces.clear();
            results.clear();
            extra_error = outcome.err();
            outcome = (|| -> CoreResult<()> {
                let tx = WriteTx::immediate(conn, statements).at(&path)?;
                write_ops(&tx, traces, statements, &ops, &mut results, &path)?;
                tx.commit(statements).at(&path)
            })();
        }
        let outcome = match outcome {
            Ok(()) => {
                for (slot, winner) in results {
                    let mut outcome = slot.0.lock();
                    if !matches!(&*outcome, Some(Err(_))) {
                        *outcome = Some(winner);
                    }
                }
                for op in &ops {
                    if let Op::Run(run) = op {
                        match run.slot.in_tx() {
                            0 => run.slot.resolve(Err(CoreError::Config(format!(
                                "run '{}' already exists",
                                run.new.run_id
                            )))),
                            rid => run.slot.resolve(Ok(rid)),
                        }
                    }
                }
                extra_error.map_or(Ok(()), Err)
            }
            Err(e) => {
                // A failed transaction may have cached trace ids that were
                // rolled back.
                traces.clear();
                let mut span_failed = false;
                for op in &ops {
                    match op {
                        Op::Step { slot, .. } => *slot.0.lock() = Some(Err(e.clone())),
                        Op::Run(run) => run.slot.resolve(Err(e.clone())),
                        Op::Span(_) | Op::RowSpan(..) | Op::Replayed(_) => span_failed = true,
                        Op::Batched(batch) => {
                            for slot in batch.slots() {
                                *slot.0.lock() = Some(Err(e.clone()));
                            }
                            span_failed |= batch.has_spans();
                        }
                    }
                }
                if span_failed {
                    record_span_write_error(e.to_string());
                }
                Err(extra_error.unwrap_or(e))
            }
        };
        self.recycle(ops);
        outcome
    }

    /// Keeps the buffers of applied batches for the next ones.
    fn recycle(&self, ops: Vec<Op>) {
        let mut spare = Vec::new();
        for op in ops {
            if let Op::Batched(mut batch) = op {
                batch.clear();
                spare.push(batch);
            }
        }
        if !spare.is_empty() {
            let mut q = self.queue.lock();
            spare.truncate(2usize.saturating_sub(q.spare.len()));
            q.spare.append(&mut spare);
        }
    }

    fn run_row(conn: &Connection, run_id: &str) -> rusqlite::Result<Option<RunRow>> {
        conn.prepare_cached(
            "SELECT rid, run_id, kind, name, status, created_at, updated_at, trace_id, \
             fingerprint, args_json, output_json, error_json, budget_json \
             FROM runs WHERE run_id = ?1",
        )?
        .query_row([run_id], read_run_row)
        .optional()
    }
}

/// `Some(run_id)` when run `rid` is not leased to this process (STORE-11):
/// an attempt here may journal or settle nothing then. A missing run
/// refuses nothing.
pub(crate) fn moved_away(tx: &Connection, rid: i64) -> rusqlite::Result<Option<String>> {
    Leases::new(tx).moved(rid)
}

/// The lease state of the runs one write transaction writes for, each run's
/// row read once: a step's check (`moved`) and its span's (`refused`) read
/// the same row, and a commit carries both.
struct Leases<'c> {
    tx: &'c Connection,
    runs: HashMap<i64, RunLease>,
}

struct RunLease {
    /// `(run_id, lease_owner)`, `None` when the run has no row.
    row: Option<(String, Option<String>)>,
    /// `refused`, once asked.
    refused: Option<bool>,
}

impl<'c> Leases<'c> {
    fn new(tx: &'c Connection) -> Leases<'c> {
        Leases {
            tx,
            runs: HashMap::new(),
        }
    }

    fn run(&mut self, rid: i64) -> rusqlite::Result<&mut RunLease> {
        Ok(match self.runs.entry(rid) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let row = self
                    .tx
                    .prepare_cached("SELECT run_id, lease_owner FROM runs WHERE rid = ?1")?
                    .query_row([rid], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()?;
                e.insert(RunLease { row, refused: None })
            }
        })
    }

    /// `moved_away`.
    fn moved(&mut self, rid: i64) -> rusqlite::Result<Option<String>> {
        let me = crate::owner::owner_id();
        Ok(self
            .run(rid)?
            .row
            .as_ref()
            .and_then(|(run_id, holder)| (holder.as_deref() != Some(me)).then(|| run_id.clone())))
    }

    /// Whether a span of run `rid` from this process is refused: the run is
    /// leased to another process, or was released after this process's
    /// lease of it was taken over. (Spans of a run this process settled
    /// itself may still be on their way.)
    fn refused(&mut self, rid: i64) -> rusqlite::Result<bool> {
        let tx = self.tx;
        let run = self.run(rid)?;
        if let Some(refused) = run.refused {
            return Ok(refused);
        }
        let me = crate::owner::owner_id();
        let refused = match &run.row {
            None => false,
            Some((_, Some(holder))) => holder != me,
            Some((_, None)) => tx
                .prepare_cached("SELECT 1 FROM lease_takeovers WHERE rid = ?1 AND owner = ?2")?
                .exists(params![rid, me])?,
        };
        run.refused = Some(refused);
        Ok(refused)
    }
}

/// The error for a write refused because run `rid` moved on.
fn moved_rid(tx: &Connection, rid: i64) -> CoreError {
    let run_id = tx
        .query_row("SELECT run_id FROM runs WHERE rid = ?1", [rid], |r| {
            r.get::<_, String>(0)
        })
        .unwrap_or_else(|_| format!("#{rid}"));
    crate::store::takeover::moved(&run_id)
}

/// STORE-12 bookkeeping inside `acquire`: a worker's takeover from a dead
/// holder is counted; returns `Some(max)` when the limit is reached (the
/// run is to be failed). A manual takeover starts the count again.
fn count_recovery(
    tx: &Connection,
    rid: i64,
    takeover: crate::store::takeover::Takeover,
    recovering: bool,
) -> rusqlite::Result<Option<u32>> {
    match takeover {
        crate::store::takeover::Takeover::Manual => {
            tx.prepare_cached("DELETE FROM run_recoveries WHERE rid = ?1")?
                .execute([rid])?;
            Ok(None)
        }
        crate::store::takeover::Takeover::Recover { .. } if !recovering => Ok(None),
        crate::store::takeover::Takeover::Recover { max } => {
            let count: i64 = tx
                .prepare_cached("SELECT count FROM run_recoveries WHERE rid = ?1")?
                .query_row([rid], |r| r.get(0))
                .optional()?
                .unwrap_or(0);
            if count >= i64::from(max) {
                return Ok(Some(max));
            }
            tx.prepare_cached(
                "INSERT INTO run_recoveries(rid, count) VALUES(?1, 1) \
                 ON CONFLICT(rid) DO UPDATE SET count = count + 1",
            )?
            .execute([rid])?;
            Ok(None)
        }
    }
}

/// Applies queued journal writes and spans inside `tx`, those of runs
/// another process took over refused.
fn write_ops(
    tx: &Connection,
    traces: &mut HashMap<String, i64>,
    statements: &mut Statements,
    ops: &[Op],
    results: &mut Vec<(Arc<Slot>, CoreResult<Option<String>>)>,
    path: &str,
) -> CoreResult<()> {
    write_ops_tx(tx, traces, statements, ops, results).at(path)
}

fn write_ops_tx(
    tx: &Connection,
    traces: &mut HashMap<String, i64>,
    statements: &mut Statements,
    ops: &[Op],
    results: &mut Vec<(Arc<Slot>, CoreResult<Option<String>>)>,
) -> rusqlite::Result<()> {
    let mut leases = Leases::new(tx);
    // Runs whose rows this transaction inserted, leased to this process
    // or settled by it: nothing can have taken them over, so their spans
    // skip the lease check.
    let mut inserted: HashSet<i64> = HashSet::new();
    let mut replayed: Vec<&ReplayedSpan> = Vec::new();
    let mut i = 0;
    while i < ops.len() {
        let op = &ops[i];
        i += 1;
        match op {
            Op::Replayed(first) => {
                replayed.clear();
                let mut next = Some(first);
                while let Some(s) = next {
                    if !leases.refused(s.rid)? {
                        replayed.push(s);
                    }
                    next = match ops.get(i) {
                        Some(Op::Replayed(s)) => {
                            i += 1;
                            Some(s)
                        }
                        _ => None,
                    };
                }
                crate::store::sqlite::replayed::insert_replayed(tx, traces, statements, &replayed)?;
            }
            Op::Step {
                rid,
                key,
                value,
                slot,
            } => {
                if slot.failed() {
                    continue;
                }
                if let Some(run_id) = leases.moved(*rid)? {
                    results.push((slot.clone(), Err(crate::store::takeover::moved(&run_id))));
                    continue;
                }
                let inserted = statements.execute(tx, JOURNAL_INSERT, |p| {
                    p.set(1, *rid)?;
                    p.set(2, key.as_str())?;
                    p.set(3, value.as_str())
                })?;
                let winner = journal_winner(tx, inserted, *rid, key, value)?;
                results.push((slot.clone(), Ok(winner)));
            }
            Op::Batched(batch) => {
                write_batched(tx, traces, statements, batch, results, &mut leases)?;
            }
            Op::Run(run) => {
                let rid = insert_run(tx, statements, run)?;
                if let Some(rid) = rid {
                    inserted.insert(rid);
                    // A new run's trace id is its own: its spans need no
                    // lookup (a rollback clears the cache).
                    remember_trace(traces, &run.new.trace_id, -rid);
                }
                // 0 (not inserted: the run id exists) fails the slot after
                // the commit, and this run's spans are dropped.
                run.slot.inserted(rid.unwrap_or(0));
            }
            Op::Span(rec) => {
                if !rec.rid.map_or(Ok(false), |rid| leases.refused(rid))? {
                    insert_span_under(tx, traces, statements, rec, rec.rid)?;
                }
            }
            Op::RowSpan(row, rec) => match row.in_tx() {
                // The row was not inserted: its run failed.
                0 => {}
                rid => {
                    if inserted.contains(&rid) || !leases.refused(rid)? {
                        insert_span_under(tx, traces, statements, rec, Some(rid))?;
                    }
                }
            },
        }
    }
    Ok(())
}

/// Applies queued batch-durability steps as `Op::Step` and `Op::Span` of
/// each would: a step whose slot failed is not journaled, nor one of a run
/// that moved away (its slot gets the error), and spans of a refused run
/// are dropped.
fn write_batched(
    tx: &Connection,
    traces: &mut HashMap<String, i64>,
    statements: &mut Statements,
    batch: &BatchedSteps,
    results: &mut Vec<(Arc<Slot>, CoreResult<Option<String>>)>,
    leases: &mut Leases<'_>,
) -> rusqlite::Result<()> {
    let mut journal_rows = Vec::with_capacity(batch.len());
    let mut span_rows = Vec::with_capacity(batch.len());
    let mut run: Option<(i64, Option<String>, bool)> = None;
    let mut failed: Option<(&Arc<Slot>, bool)> = None;
    for i in 0..batch.len() {
        let (rid, slot, has_span) = batch.step(i);
        let (moved, refused) = match &run {
            Some((r, moved, refused)) if *r == rid => (moved, *refused),
            _ => {
                let (_, moved, refused) =
                    run.insert((rid, leases.moved(rid)?, leases.refused(rid)?));
                (&*moved, *refused)
            }
        };
        let slot_failed = match failed {
            Some((s, f)) if Arc::ptr_eq(s, slot) => f,
            _ => failed.insert((slot, slot.failed())).1,
        };
        if !slot_failed {
            match moved {
                Some(run_id) => {
                    results.push((slot.clone(), Err(crate::store::takeover::moved(run_id))))
                }
                None => journal_rows.push(i),
            }
        }
        if has_span && !refused {
            span_rows.push(i);
        }
    }
    let mut winners =
        crate::store::sqlite::batched::insert_journal(tx, statements, batch, &journal_rows)?
            .into_iter();
    let mut next_winner = winners.next();
    for (n, &i) in journal_rows.iter().enumerate() {
        let winner = match next_winner.take() {
            Some((at, stored)) if at == i => {
                next_winner = winners.next();
                Some(stored)
            }
            other => {
                next_winner = other;
                None
            }
        };
        // A slot keeps its last outcome: one per run of steps sharing it.
        let slot = batch.step(i).1;
        let shared_next = journal_rows
            .get(n + 1)
            .is_some_and(|&j| Arc::ptr_eq(batch.step(j).1, slot));
        if !shared_next {
            results.push((slot.clone(), Ok(winner)));
        }
    }
    crate::store::sqlite::batched::insert_spans(tx, traces, statements, batch, &span_rows)
}

/// Inserts a queued run row: running and leased, or settled; `None` when
/// the run id exists.
/// The row of a queued run (`Store::create_run_queued`), inserted settled
/// when the run ended before its row was written.
pub const QUEUED_RUN_INSERT: &str =
    "INSERT OR IGNORE INTO runs(run_id, kind, name, status, created_at, updated_at, trace_id, \
     fingerprint, args_json, budget_json, output_json, error_json, lease_owner, lease_until) \
     VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)";

fn insert_run(
    tx: &Connection,
    statements: &mut Statements,
    run: &QueuedRun,
) -> rusqlite::Result<Option<i64>> {
    let new = &run.new;
    let (status, output, error, owner, until, updated) = match &run.settled {
        None => (
            "running",
            None,
            None,
            Some(run.owner.as_str()),
            Some(run.lease_until),
            run.created_at,
        ),
        Some((status, output, error)) => (
            status.as_str(),
            output.as_deref(),
            error.as_deref(),
            None,
            None,
            now(),
        ),
    };
    let n = statements.execute(tx, QUEUED_RUN_INSERT, |p| {
        p.set(1, new.run_id.as_str())?;
        p.set(2, new.kind.as_str())?;
        p.set(3, new.name.as_str())?;
        p.set(4, status)?;
        p.set(5, run.created_at)?;
        p.set(6, updated)?;
        p.set(7, new.trace_id.as_str())?;
        p.set(8, new.fingerprint.as_deref())?;
        p.set(9, new.args_json.as_deref())?;
        p.set(10, new.budget_json.as_deref())?;
        p.set(11, output)?;
        p.set(12, error)?;
        p.set(13, owner)?;
        p.set(14, until)
    })?;
    Ok((n == 1).then(|| tx.last_insert_rowid()))
}

pub fn read_run_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RunRow> {
    Ok(RunRow {
        rid: r.get(0)?,
        run_id: r.get(1)?,
        kind: r.get(2)?,
        name: r.get(3)?,
        status: r.get(4)?,
        created_at: r.get(5)?,
        updated_at: r.get(6)?,
        trace_id: r.get(7)?,
        fingerprint: r.get(8)?,
        args_json: r.get(9)?,
        output_json: r.get(10)?,
        error_json: r.get(11)?,
        budget_json: r.get(12)?,
    })
}

/// Opens a connection with the store's pragmas, creating the database file
/// private to its user and bringing the schema to `SCHEMA_VERSION`.
pub fn open_connection(path: &str, full_sync: bool) -> CoreResult<Connection> {
    create_private_file(path)?;
    // Commits write their WAL frames in one system call (see `wal_vfs`).
    let conn = match crate::store::sqlite::wal_vfs::name() {
        Some(vfs) => Connection::open_with_flags_and_vfs(path, OpenFlags::default(), vfs),
        None => Connection::open(path),
    }
    .at(path)?;
    // A graph run's commits alone use more distinct statements than the
    // default 16: re-preparing evicted ones would cost every step.
    conn.set_prepared_statement_cache_capacity(64);
    conn.busy_timeout(std::time::Duration::from_secs(30))
        .at(path)?;
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| config(path, format!("not a readable composeai store ({e})")))?;
    migrate::refuse_foreign(&conn, path, version)?;
    if version == 0 {
        // Only an empty database takes it, so before WAL and the schema.
        conn.execute_batch(&format!("PRAGMA page_size={PAGE_SIZE}"))
            .at(path)?;
    }
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .map_err(|e| config(path, format!("cannot enable WAL ({e})")))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(config(
            path,
            format!("cannot enable WAL (journal_mode={mode})"),
        ));
    }
    let sync = if full_sync { "FULL" } else { "NORMAL" };
    conn.execute_batch(&format!(
        "PRAGMA synchronous={sync}; PRAGMA foreign_keys=OFF; PRAGMA temp_store=MEMORY;"
    ))
    .at(path)?;
    migrate::bring_up_to_date(&conn, path, version)?;
    Ok(conn)
}

/// `compose migrate` on a SQLite file: `(version found, version now,
/// latest version)`; a dry run only reads the version.
pub fn migrate_file(path: &str, dry_run: bool) -> CoreResult<(i64, i64, i64)> {
    let found = if std::path::Path::new(path).exists() {
        let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .at(path)?;
        conn.query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| config(path, format!("not a readable composeai store ({e})")))?
    } else {
        0
    };
    if dry_run {
        return Ok((found, found, SCHEMA_VERSION));
    }
    open_connection(path, false)?;
    Ok((found, SCHEMA_VERSION, SCHEMA_VERSION))
}

fn create_private_file(path: &str) -> CoreResult<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let p = std::path::Path::new(path);
    if p.exists() {
        return Ok(());
    }
    if let Some(dir) = p.parent() {
        if !dir.as_os_str().is_empty() && !dir.exists() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| config(path, format!("cannot create its directory ({e})")))?;
        }
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(p)
        .map_err(|e| config(path, format!("cannot create the database ({e})")))?;
    Ok(())
}

pub(crate) fn insert_journal(
    tx: &Connection,
    rid: i64,
    key: &str,
    value: &str,
) -> rusqlite::Result<Option<String>> {
    let inserted = tx
        .prepare_cached(JOURNAL_INSERT)?
        .execute(params![rid, key, value])?;
    journal_winner(tx, inserted, rid, key, value)
}

pub const JOURNAL_INSERT: &str =
    "INSERT OR IGNORE INTO journal(rid, step_key, value_json) VALUES(?1, ?2, ?3)";

/// After the insert of a journal row (`inserted` rows): `None` if it was
/// inserted or the key already held the same value, else the value it
/// holds (the earlier write wins).
fn journal_winner(
    tx: &Connection,
    inserted: usize,
    rid: i64,
    key: &str,
    value: &str,
) -> rusqlite::Result<Option<String>> {
    if inserted == 1 {
        return Ok(None);
    }
    let stored: String = tx
        .prepare_cached("SELECT value_json FROM journal WHERE rid = ?1 AND step_key = ?2")?
        .query_row(params![rid, key], |r| r.get(0))?;
    Ok(if stored == value { None } else { Some(stored) })
}

/// The `tid` the spans of trace `trace_id` (one of them of run `rid`) are
/// stored under, remembered in `traces`. A trace with a `traces` row (a
/// store migrated from 0.11.0, a run created before runs owned their
/// trace, a trace outside any run) keeps it; a run's own trace has no row:
/// its spans take `-rid`, which spares every run's commit the row and its
/// index entry.
pub(crate) fn trace_tid(
    tx: &Connection,
    traces: &mut HashMap<String, i64>,
    trace_id: &str,
    rid: Option<i64>,
) -> rusqlite::Result<i64> {
    // A run's own trace is remembered as `-rid`: a span of another run that
    // names the same trace id (runs do not share trace ids, but a caller may
    // pass one) is looked up, and lands under its own run's `-rid` too.
    if let Some(&tid) = traces.get(trace_id) {
        if tid >= 0 || rid.is_none_or(|r| r == -tid) {
            return Ok(tid);
        }
    }
    let row: Option<i64> = tx
        .prepare_cached("SELECT tid FROM traces WHERE trace_id = ?1")?
        .query_row([trace_id], |r| r.get(0))
        .optional()?;
    let tid = match (row, rid) {
        (Some(tid), _) => tid,
        (None, Some(rid))
            if tx
                .prepare_cached("SELECT 1 FROM runs WHERE rid = ?1 AND trace_id = ?2")?
                .exists(params![rid, trace_id])? =>
        {
            -rid
        }
        (None, _) => {
            tx.prepare_cached("INSERT INTO traces(trace_id) VALUES(?1)")?
                .execute([trace_id])?;
            tx.last_insert_rowid()
        }
    };
    remember_trace(traces, trace_id, tid);
    Ok(tid)
}

fn remember_trace(traces: &mut HashMap<String, i64>, trace_id: &str, tid: i64) {
    if traces.len() >= TRACE_CACHE {
        traces.clear();
    }
    traces.insert(trace_id.to_string(), tid);
}

/// Trace ids the writer remembers at most: a long-lived process starts a
/// trace per run, and a run's spans mostly follow each other closely.
const TRACE_CACHE: usize = 1024;

pub(crate) fn insert_span(
    tx: &Connection,
    traces: &mut HashMap<String, i64>,
    statements: &mut Statements,
    rec: &SpanRecord,
) -> rusqlite::Result<()> {
    insert_span_under(tx, traces, statements, rec, rec.rid)
}

pub const SPAN_INSERT: &str =
    "INSERT INTO spans(tid, rid, span_id, parent, kind, name, started_at, ended_at, status, \
     flags, step_key, attributes_json, error_json, input_tokens, output_tokens, \
     cache_read_tokens, cache_creation_tokens, reasoning_tokens, cost_usd, cost_complete, \
     input_json, output_json) \
     VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, \
     ?19, ?20, ?21, ?22)";

/// A span without attributes, usage or error (a task step's, replayed or
/// not): the columns left out are NULL.
pub const PLAIN_SPAN_INSERT: &str =
    "INSERT INTO spans(tid, rid, span_id, parent, kind, name, started_at, ended_at, status, \
     flags, step_key, input_json, output_json) \
     VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)";

/// The columns both span inserts start with.
struct SpanHead<'a> {
    tid: i64,
    rid: Option<i64>,
    span_id: &'a StoredId,
    parent: &'a Option<StoredId>,
    flags: i64,
    span: &'a SpanRow,
}

impl<'a> SpanHead<'a> {
    fn bind(&self, p: &mut Params<'a>) -> rusqlite::Result<()> {
        let s = self.span;
        p.set(1, self.tid)?;
        p.set(2, self.rid)?;
        p.set(3, self.span_id)?;
        p.set(4, self.parent)?;
        p.set(5, s.kind.as_str())?;
        p.set(6, s.name.as_str())?;
        p.set(7, s.started_at)?;
        p.set(8, s.ended_at)?;
        p.set(9, s.status.as_str())?;
        p.set(10, self.flags)?;
        p.set(11, s.step_key.as_deref())
    }
}

/// Inserts `rec` under run `rid`.
fn insert_span_under(
    tx: &Connection,
    traces: &mut HashMap<String, i64>,
    statements: &mut Statements,
    rec: &SpanRecord,
    rid: Option<i64>,
) -> rusqlite::Result<()> {
    let tid = trace_tid(tx, traces, &rec.trace_id, rid)?;
    let s = &rec.span;
    let mut flags = 0;
    if s.replayed {
        flags |= FLAG_REPLAYED;
    }
    let output = if rec.output_in_journal {
        flags |= FLAG_OUTPUT_IN_JOURNAL;
        None
    } else {
        s.output_json.as_deref()
    };
    let span_id = encode_id(&s.span_id);
    let parent: Option<StoredId> = s.parent_span_id.as_deref().map(encode_id);
    let head = SpanHead {
        tid,
        rid,
        span_id: &span_id,
        parent: &parent,
        flags,
        span: s,
    };
    if s.attributes_json.is_none() && s.usage.is_none() && s.error_json.is_none() {
        statements.execute(tx, PLAIN_SPAN_INSERT, |p| {
            head.bind(p)?;
            p.set(12, s.input_json.as_deref())?;
            p.set(13, output)
        })?;
        return Ok(());
    }
    let u = s.usage.as_ref();
    statements.execute(tx, SPAN_INSERT, |p| {
        head.bind(p)?;
        p.set(12, s.attributes_json.as_deref())?;
        p.set(13, s.error_json.as_deref())?;
        p.set(14, u.map(|u| u.input_tokens))?;
        p.set(15, u.map(|u| u.output_tokens))?;
        p.set(16, u.map(|u| u.cache_read_tokens))?;
        p.set(17, u.map(|u| u.cache_creation_tokens))?;
        p.set(18, u.map(|u| u.reasoning_tokens))?;
        p.set(19, u.and_then(|u| u.cost_usd))?;
        p.set(20, u.map(|u| u.cost_complete))?;
        p.set(21, s.input_json.as_deref())?;
        p.set(22, output)
    })?;
    Ok(())
}

impl Store for SqliteStore {
    fn path(&self) -> &str {
        &self.path
    }

    fn create_run_with(
        &self,
        new: &NewRun,
        owner: &str,
        lease_until: f64,
        work: &mut GraphWork<'_>,
        drain: bool,
    ) -> CoreResult<RunRow> {
        let mut w = self.lock_writer();
        let ops = if drain { self.take_queue() } else { Vec::new() };
        let t = now();
        let mut rid = 0;
        self.apply(&mut w, ops, |tx| {
            tx.prepare_cached(
                "INSERT INTO runs(run_id, kind, name, status, created_at, updated_at, trace_id, \
                 fingerprint, args_json, budget_json, lease_owner, lease_until) \
                 VALUES(?1, ?2, ?3, 'running', ?4, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            )
            .and_then(|mut st| {
                st.execute(params![
                    new.run_id,
                    new.kind,
                    new.name,
                    t,
                    new.trace_id,
                    new.fingerprint,
                    new.args_json,
                    new.budget_json,
                    owner,
                    lease_until
                ])
            })
            .at(&self.path)?;
            rid = tx.last_insert_rowid();
            work(&**tx)
        })?;
        // Committed: the run's spans go under its own trace with no lookup.
        remember_trace(&mut w.traces, &new.trace_id, -rid);
        Ok(RunRow::inserted(new, rid, "running", t))
    }

    fn acquire(
        &self,
        run_id: &str,
        owner: &str,
        lease_until: f64,
        live: LeaseCheck<'_>,
        takeover: crate::store::takeover::Takeover,
    ) -> CoreResult<(RunRow, Vec<(String, String)>)> {
        self.acquire_reading(run_id, owner, lease_until, live, takeover, read_journal)
    }

    fn acquire_journal(
        &self,
        run_id: &str,
        owner: &str,
        lease_until: f64,
        live: LeaseCheck<'_>,
        takeover: crate::store::takeover::Takeover,
        answers: &[(String, String)],
    ) -> CoreResult<Claim> {
        let (row, (journal, span_mark)) =
            self.acquire_reading(run_id, owner, lease_until, live, takeover, |tx, rid| {
                // The answers land in the journal read next, and the span
                // mark comes from the same snapshot: one commit, no second
                // write or read after the claim.
                record_answers_in(tx, rid, answers)?;
                Ok((
                    load_journal(tx, rid)?,
                    crate::store::sqlite::step_spans::span_mark(tx)?,
                ))
            })?;
        Ok(Claim {
            row,
            journal,
            span_mark: Some(span_mark),
        })
    }

    fn renew_leases(&self, owner: &str, until: f64, rids: &[i64]) -> CoreResult<Vec<i64>> {
        let list = rids
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let path = self.path.clone();
        self.with_conn(|c| {
            let mut st = c
                .prepare(&format!(
                    "UPDATE runs SET lease_until = ?1 WHERE lease_owner = ?2 AND rid IN ({list}) \
                     RETURNING rid"
                ))
                .at(&path)?;
            let rows = st
                .query_map(params![until, owner], |r| r.get(0))
                .at(&path)?;
            rows.collect::<rusqlite::Result<Vec<i64>>>().at(&path)
        })
    }

    fn commit_step(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        span: Option<SpanRecord>,
    ) -> CoreResult<Option<String>> {
        let slot = Arc::new(Slot::default());
        {
            let mut q = self.queue.lock();
            q.ops.push(Op::Step {
                rid,
                key: key.to_string(),
                value: value.to_string(),
                slot: slot.clone(),
            });
            if let Some(s) = span {
                q.ops.push(Op::Span(Box::new(s)));
            }
        }
        let mut w = self.lock_writer();
        if let Some(done) = slot.0.lock().take() {
            return done;
        }
        let ops = self.take_queue();
        // An error is delivered through every slot of the batch, ours included.
        let _ = self.apply(&mut w, ops, |_| Ok(()));
        drop(w);
        let result = slot.0.lock().take();
        result.unwrap_or_else(|| Err(CoreError::Store("journal write was lost".into())))
    }

    fn queue_span(&self, span: SpanRecord) {
        self.enqueue(Op::Span(Box::new(span)), false);
    }

    fn queue_replayed(&self, span: ReplayedSpan) {
        self.enqueue(Op::Replayed(span), false);
    }

    fn commit_deferred(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        span: Option<SpanRecord>,
    ) -> Arc<Slot> {
        let slot = Arc::new(Slot::default());
        if let Some(s) = span {
            self.queue.lock().ops.push(Op::Span(Box::new(s)));
        }
        self.enqueue(
            Op::Step {
                rid,
                key: key.to_string(),
                value: value.to_string(),
                slot: slot.clone(),
            },
            true,
        );
        slot
    }

    fn supports_batch(&self) -> bool {
        true
    }

    fn commit_batched(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        span: Option<SpanRecord>,
        slot: &Arc<Slot>,
    ) -> CoreResult<()> {
        let mut q = self.queue.lock();
        q.ops.push(Op::Step {
            rid,
            key: key.to_string(),
            value: value.to_string(),
            slot: slot.clone(),
        });
        if let Some(s) = span {
            q.ops.push(Op::Span(Box::new(s)));
        }
        self.batch_queued(q)
    }

    fn commit_batched_step(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        span: Option<SpanRow>,
        trace: &Arc<str>,
        slot: &Arc<Slot>,
    ) -> CoreResult<()> {
        let view = match &span {
            Some(s) => match SpanView::of(s, value) {
                Some(view) => Some(view),
                None => {
                    let record = span.map(|s| SpanRecord::of_step(trace, rid, s, Some(value)));
                    return self.commit_batched(rid, key, value, record, slot);
                }
            },
            None => None,
        };
        self.commit_batched_view(rid, key, value, view, trace, slot)
    }

    fn commit_batched_view(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        span: Option<SpanView<'_>>,
        trace: &Arc<str>,
        slot: &Arc<Slot>,
    ) -> CoreResult<()> {
        let mut guard = self.queue.lock();
        let q = &mut *guard;
        let span = span.map(|s| (trace, s));
        match q.ops.last_mut() {
            Some(Op::Batched(batch)) => batch.push(rid, key, value, span, slot),
            _ => {
                let mut batch = q.spare.pop().unwrap_or_default();
                batch.push(rid, key, value, span, slot);
                q.ops.push(Op::Batched(batch));
            }
        }
        q.batched += 1;
        self.batch_queued(guard)
    }

    fn flush(&self) -> CoreResult<()> {
        let mut w = self.lock_writer();
        self.drain(&mut w)
    }

    /// The last connection to a WAL database to close copies the WAL into
    /// it and deletes it; a process that exits with its connections open
    /// leaves the WAL (up to `INLINE` frames) for the next process to open
    /// the store to read back whole before its first query. So at exit the
    /// writer's connection closes, then the checkpoint thread's: whichever
    /// process closes last (this one, when no other has the store open)
    /// leaves no WAL behind.
    fn close(&self) -> CoreResult<()> {
        self.queue.lock().shutdown = true;
        self.wake.notify_all();
        let mut w = self.lock_writer();
        let drained = self.drain(&mut w);
        // Later calls fail on a database without tables.
        let memory = Connection::open_in_memory().at(&self.path)?;
        w.statements.clear();
        let writer = std::mem::replace(&mut w.conn, memory);
        w.traces.clear();
        let closed = writer.close().map_err(|(_, e)| e).at(&self.path);
        // After the writer connection, whose commits called into it.
        w.checkpointer.take();
        drained.and(closed)
    }

    fn reads_spans(&self) -> bool {
        true
    }

    fn span_mark(&self) -> CoreResult<Option<i64>> {
        let mut w = self.lock_writer();
        self.drain(&mut w)?;
        crate::store::sqlite::step_spans::span_mark(&w.conn)
            .map(Some)
            .at(&self.path)
    }

    fn step_spans(&self, rid: i64, mark: i64) -> CoreResult<Vec<crate::store::spans::StepSpanRow>> {
        let mut w = self.lock_writer();
        self.drain(&mut w)?;
        crate::store::sqlite::step_spans::step_spans(&w.conn, rid, mark).at(&self.path)
    }

    fn settle_with(
        &self,
        rid: i64,
        owner: &str,
        s: &Settlement,
        work: &mut GraphWork<'_>,
    ) -> CoreResult<()> {
        let mut w = self.lock_writer();
        let ops = if s.defer_spans {
            Vec::new()
        } else {
            self.take_queue()
        };
        let path = self.path.clone();
        self.apply(&mut w, ops, |tx| {
            settle_tx(tx, &path, rid, owner, s)?;
            work(&**tx)
        })
    }

    fn create_run_queued(
        &self,
        new: &NewRun,
        owner: &str,
        lease_until: f64,
    ) -> CoreResult<(RunRow, Arc<RowSlot>)> {
        let slot = Arc::new(RowSlot::default());
        let t = now();
        let run = RunRow::inserted(new, 0, "running", t);
        let op = Op::Run(Box::new(QueuedRun {
            new: new.clone(),
            owner: owner.to_string(),
            lease_until,
            created_at: t,
            slot: slot.clone(),
            settled: None,
        }));
        let mut q = self.queue.lock();
        q.ops.push(op);
        q.rows = true;
        if !self.start_writer(&mut q) {
            // No writer to make it visible soon: insert it now.
            drop(q);
            self.flush()?;
        } else if q.due.is_none() {
            // Other processes see the row within the batch latency. A
            // writer that works, or sleeps until an earlier deadline (an
            // earlier run's), looks at the queue by then unprompted: back
            // to back short runs cost no wake-up each.
            let due = std::time::Instant::now() + BATCH_LATENCY;
            q.due = Some(due);
            if q.writer_sleeps
                .is_some_and(|until| until.is_none_or(|t| t > due))
            {
                self.wake.notify_one();
            }
        }
        Ok((run, slot))
    }

    fn queue_row_span(&self, row: &Arc<RowSlot>, span: SpanRecord) {
        self.enqueue(Op::RowSpan(row.clone(), Box::new(span)), false);
    }

    fn settle_row(&self, row: &Arc<RowSlot>, owner: &str, s: &Settlement) -> CoreResult<()> {
        let mut w = self.lock_writer();
        // Holding the connection: the row was inserted by a commit that
        // already filled the slot, or its insert is among the queued ops.
        let mut ops = self.take_queue();
        // A settlement with no rows of its own, of a run whose row no commit
        // has written yet: the row is inserted settled (nothing else can
        // refer to a run nobody saw), one statement instead of a row insert,
        // its update and the cleanup of rows it cannot have.
        let in_place = s.pending.is_empty()
            && s.agent_states.is_empty()
            && s.wait.is_none()
            && ops.iter_mut().any(|op| match op {
                Op::Run(run) if Arc::ptr_eq(&run.slot, row) => {
                    run.settled = Some((
                        s.status.clone(),
                        s.output_json.clone(),
                        s.error_json.clone(),
                    ));
                    true
                }
                _ => false,
            });
        let path = self.path.clone();
        let outcome = self.apply(&mut w, ops, |tx| match row.in_tx() {
            0 => Err(CoreError::Store("the run row was not written".into())),
            _ if in_place => Ok(()),
            rid => settle_tx(tx, &path, rid, owner, s),
        });
        // The insert's own failure says why.
        match row.committed() {
            Some(Err(e)) => Err(e),
            _ => outcome,
        }
    }

    fn set_budget(&self, rid: i64, budget_json: &str) -> CoreResult<()> {
        self.with_conn(|c| {
            c.execute(
                "UPDATE runs SET budget_json = ?1 WHERE rid = ?2",
                params![budget_json, rid],
            )
            .map(|_| ())
            .at(&self.path)
        })
    }

    fn record_answers(&self, rid: i64, answers: &[(String, String)]) -> CoreResult<()> {
        let mut w = self.lock_writer();
        let ops = self.take_queue();
        let path = self.path.clone();
        self.apply(&mut w, ops, |tx| {
            record_answers_in(tx, rid, answers).at(&path)
        })
    }

    fn delete_run(&self, rid: i64) -> CoreResult<()> {
        let mut w = self.lock_writer();
        let ops = self.take_queue();
        let path = self.path.clone();
        self.inner.apply(&mut w, ops, |tx| {
            tx.execute_batch(&format!(
                "DELETE FROM spans WHERE rid = {rid} OR tid IN (-{rid}, (SELECT t.tid FROM runs r \
                 JOIN traces t ON t.trace_id = r.trace_id WHERE r.rid = {rid})); \
                 DELETE FROM traces WHERE trace_id = (SELECT trace_id FROM runs WHERE rid = {rid}); \
                 DELETE FROM journal WHERE rid = {rid}; \
                 DELETE FROM pending_interrupts WHERE rid = {rid}; \
                 DELETE FROM agent_state WHERE rid = {rid}; \
                 DELETE FROM run_recoveries WHERE rid = {rid}; \
                 DELETE FROM lease_takeovers WHERE rid = {rid}; \
                 DELETE FROM runs WHERE rid = {rid}; {}",
                crate::store::sqlite::durable_schema::delete_sql(rid)
            ))
            .at(&path)
        })?;
        // Trace ids cached by the writer may name the deleted trace.
        w.traces.clear();
        Ok(())
    }

    fn save_agent_state(&self, rid: i64, state: &AgentStateRow) -> CoreResult<()> {
        let mut w = self.lock_writer();
        let ops = self.take_queue();
        let path = self.path.clone();
        self.apply(&mut w, ops, |tx| {
            write_agent_state(tx, rid, state, now())
                .map(|_| ())
                .at(&path)
        })
    }

    fn load_agent_state(&self, rid: i64, scope_key: &str) -> CoreResult<Option<AgentStateRow>> {
        let w = self.lock_writer();
        w.conn
            .prepare_cached(
                "SELECT messages_json, partial_results_json, turn FROM agent_state \
                 WHERE rid = ?1 AND scope_key = ?2",
            )
            .and_then(|mut st| {
                st.query_row(params![rid, scope_key], |r| {
                    Ok(AgentStateRow {
                        scope_key: scope_key.to_string(),
                        messages_json: r.get::<_, Option<String>>(0)?.unwrap_or_default(),
                        partial_results_json: r.get(1)?,
                        turn: r.get::<_, Option<i64>>(2)?.unwrap_or(0),
                    })
                })
                .optional()
            })
            .at(&self.path)
    }

    fn prior_llm_usage(&self, rid: i64) -> CoreResult<PriorSpend> {
        let mut w = self.lock_writer();
        self.inner.drain(&mut w)?;
        let path = self.path.clone();
        let conn = &w.conn;
        struct Row {
            id: Option<String>,
            parent: Option<String>,
            kind: String,
            step_key: Option<String>,
            tokens: i64,
            usd: f64,
        }
        let mut st = conn
            .prepare_cached(
                "SELECT span_id, parent, kind, step_key, input_tokens, output_tokens, cost_usd \
                 FROM spans WHERE rid = ?1 AND tid IN (-?1, (SELECT t.tid FROM runs r \
                 JOIN traces t ON t.trace_id = r.trace_id WHERE r.rid = ?1))",
            )
            .at(&path)?;
        let rows: Vec<Row> = st
            .query_map([rid], |r| {
                Ok(Row {
                    id: crate::ids::read_id(r.get_ref(0)?),
                    parent: crate::ids::read_id(r.get_ref(1)?),
                    kind: r.get(2)?,
                    step_key: r.get(3)?,
                    tokens: r.get::<_, Option<i64>>(4)?.unwrap_or(0)
                        + r.get::<_, Option<i64>>(5)?.unwrap_or(0),
                    usd: r.get::<_, Option<f64>>(6)?.unwrap_or(0.0),
                })
            })
            .and_then(|it| it.collect())
            .at(&path)?;
        let by_id: HashMap<&str, &Row> = rows
            .iter()
            .filter_map(|r| r.id.as_deref().map(|id| (id, r)))
            .collect();
        let mut spend = PriorSpend::default();
        for r in rows.iter().filter(|r| r.kind == "llm") {
            spend.total = (spend.total.0 + r.tokens, spend.total.1 + r.usd);
            // Credit every journaled agent step above the call; bounded by
            // the number of spans, so a corrupt cycle cannot loop.
            let mut cursor = r.parent.as_deref();
            for _ in 0..rows.len() {
                let Some(parent) = cursor.and_then(|id| by_id.get(id)) else {
                    break;
                };
                if parent.kind == "agent" {
                    if let Some(key) = &parent.step_key {
                        let e = spend.by_step.entry(key.clone()).or_insert((0, 0.0));
                        *e = (e.0 + r.tokens, e.1 + r.usd);
                    }
                }
                cursor = parent.parent.as_deref();
            }
        }
        Ok(spend)
    }

    fn get_run(&self, run_id: &str) -> CoreResult<Option<RunRow>> {
        let mut w = self.lock_writer();
        if self.queue.lock().rows {
            // This process sees the runs it started at once.
            self.drain(&mut w)?;
        }
        Inner::run_row(&w.conn, run_id).at(&self.path)
    }

    fn pending(&self, rid: i64) -> CoreResult<Vec<InterruptRow>> {
        let w = self.lock_writer();
        read_pending(&w.conn, rid).at(&self.path)
    }

    fn commit_with(
        &self,
        rid: i64,
        entries: &[(String, String)],
        work: &mut GraphWork<'_>,
    ) -> CoreResult<()> {
        let mut w = self.lock_writer();
        let path = self.path.clone();
        self.apply(&mut w, Vec::new(), |tx| {
            for (k, v) in entries {
                insert_journal(tx, rid, k, v).at(&path)?;
            }
            work(&**tx)
        })
    }

    fn transact(&self, work: &mut GraphWork<'_>) -> CoreResult<()> {
        let mut w = self.lock_writer();
        let ops = self.take_queue();
        self.apply(&mut w, ops, |tx| work(&**tx))
    }

    fn read(&self, work: &mut GraphWork<'_>) -> CoreResult<()> {
        let w = self.lock_writer();
        work(&w.conn)
    }

    fn journal(&self, rid: i64) -> CoreResult<Vec<(String, String)>> {
        // Batched steps are part of the journal this process reads.
        let mut w = self.lock_writer();
        self.drain(&mut w)?;
        read_journal(&w.conn, rid).at(&self.path)
    }

    fn save_chat(&self, chat: &crate::store::ChatRow) -> CoreResult<()> {
        let path = self.path.clone();
        self.with_conn(|conn| crate::store::sqlite::chat::upsert(conn, chat).at(&path))
    }

    fn load_chat(&self, chat_id: &str) -> CoreResult<Option<crate::store::ChatRow>> {
        let w = self.lock_writer();
        crate::store::sqlite::chat::get(&w.conn, chat_id).at(&self.path)
    }

    fn cancel_request(&self, rid: i64) -> CoreResult<Option<Option<String>>> {
        let w = self.lock_writer();
        crate::store::sqlite::durable::cancel_request(&w.conn, rid).at(&self.path)
    }
}

/// The settlement's writes (see `Store::settle`) inside `tx`.
fn settle_tx(tx: &Connection, path: &str, rid: i64, owner: &str, s: &Settlement) -> CoreResult<()> {
    let t = now();
    let n = tx
        .prepare_cached(
            "UPDATE runs SET status = ?1, output_json = ?2, error_json = ?3, updated_at = ?4, \
         lease_owner = NULL, lease_until = NULL WHERE rid = ?5 AND lease_owner = ?6",
        )
        .and_then(|mut st| {
            st.execute(params![
                s.status,
                s.output_json,
                s.error_json,
                t,
                rid,
                owner
            ])
        })
        .at(path)?;
    if n == 0 {
        return Err(moved_rid(tx, rid));
    }
    tx.prepare_cached("DELETE FROM run_recoveries WHERE rid = ?1")
        .and_then(|mut st| st.execute([rid]))
        .at(path)?;
    for a in &s.agent_states {
        write_agent_state(tx, rid, a, t).at(path)?;
    }
    crate::store::sqlite::durable::on_settle(tx, rid, &s.status, s.wait.as_ref()).at(path)?;
    for p in &s.pending {
        tx.prepare_cached(
            "INSERT OR REPLACE INTO pending_interrupts(rid, interrupt_id, kind, question, \
             payload_json, created_at) VALUES(?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .and_then(|mut st| {
            st.execute(params![
                rid,
                p.interrupt_id,
                p.kind,
                p.question,
                p.payload_json,
                t
            ])
        })
        .at(path)?;
    }
    Ok(())
}

fn write_agent_state(
    tx: &Connection,
    rid: i64,
    a: &AgentStateRow,
    at: f64,
) -> rusqlite::Result<usize> {
    tx.prepare_cached(
        "INSERT OR REPLACE INTO agent_state(rid, scope_key, messages_json, \
         partial_results_json, turn, updated_at) VALUES(?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        rid,
        a.scope_key,
        a.messages_json,
        a.partial_results_json,
        a.turn,
        at
    ])
}

pub fn read_pending(conn: &Connection, rid: i64) -> rusqlite::Result<Vec<InterruptRow>> {
    let mut st = conn.prepare_cached(
        "SELECT interrupt_id, kind, question, payload_json FROM pending_interrupts \
         WHERE rid = ?1 ORDER BY interrupt_id",
    )?;
    let rows = st.query_map([rid], |r| {
        Ok(InterruptRow {
            interrupt_id: r.get(0)?,
            kind: r.get(1)?,
            question: r.get(2)?,
            payload_json: r.get(3)?,
        })
    })?;
    rows.collect()
}

impl SqliteStore {
    /// `acquire`, the journal read by `read` in the same transaction.
    fn acquire_reading<T>(
        &self,
        run_id: &str,
        owner: &str,
        lease_until: f64,
        live: LeaseCheck<'_>,
        takeover: crate::store::takeover::Takeover,
        read: impl FnOnce(&Connection, i64) -> rusqlite::Result<T>,
    ) -> CoreResult<(RunRow, T)> {
        let mut w = self.lock_writer();
        self.drain(&mut w)?;
        let path = self.path.clone();
        let tx = w
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .at(&path)?;
        let row = Inner::run_row(&tx, run_id)
            .at(&path)?
            .ok_or_else(|| CoreError::Config(format!("no run found with run_id '{run_id}'")))?;
        let (holder, until): (Option<String>, Option<f64>) = tx
            .query_row(
                "SELECT lease_owner, lease_until FROM runs WHERE rid = ?1",
                [row.rid],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .at(&path)?;
        if let Some(holder) = &holder {
            if holder != owner && live(holder, until.unwrap_or(0.0)) {
                return Err(CoreError::Config(format!(
                    "run '{run_id}' is already being executed by another process ({holder}) -- \
                     one process executes a run at a time; resume it after that process has \
                     finished or exited"
                )));
            }
        }
        let recovering = holder.as_deref().is_some_and(|h| h != owner);
        if let Some(h) = holder.as_deref().filter(|h| *h != owner) {
            tx.prepare_cached("INSERT OR IGNORE INTO lease_takeovers(rid, owner) VALUES(?1, ?2)")
                .and_then(|mut st| st.execute(params![row.rid, h]))
                .at(&path)?;
        }
        if let Some(max) = count_recovery(&tx, row.rid, takeover, recovering).at(&path)? {
            tx.execute(
                "UPDATE runs SET status = 'failed', error_json = ?1, updated_at = ?2, \
                 lease_owner = NULL, lease_until = NULL WHERE rid = ?3",
                params![
                    crate::store::takeover::exhausted_error_json(),
                    now(),
                    row.rid
                ],
            )
            .at(&path)?;
            crate::store::sqlite::durable::on_settle(&tx, row.rid, "failed", None).at(&path)?;
            tx.commit().at(&path)?;
            return Err(crate::store::takeover::exhausted(run_id, max));
        }
        tx.execute(
            "UPDATE runs SET lease_owner = ?1, lease_until = ?2 WHERE rid = ?3",
            params![owner, lease_until, row.rid],
        )
        .at(&path)?;
        crate::store::sqlite::durable::on_acquire(&tx, row.rid).at(&path)?;
        let journal = read(&tx, row.rid).at(&path)?;
        tx.commit().at(&path)?;
        Ok((row, journal))
    }
}

/// Journals `answers` of `rid` (first write wins) and clears their
/// pending interrupts.
fn record_answers_in(
    tx: &Connection,
    rid: i64,
    answers: &[(String, String)],
) -> rusqlite::Result<()> {
    for (id, value) in answers {
        insert_journal(tx, rid, &format!("__interrupt__:{id}"), value)?;
        tx.prepare_cached("DELETE FROM pending_interrupts WHERE rid = ?1 AND interrupt_id = ?2")?
            .execute(params![rid, id])?;
    }
    Ok(())
}

/// The journal of `rid` read straight into an attempt's `Journal`: one
/// allocation per value, none per key.
fn load_journal(conn: &Connection, rid: i64) -> rusqlite::Result<Journal> {
    let mut st = conn.prepare_cached("SELECT step_key, value_json FROM journal WHERE rid = ?1")?;
    let mut rows = st.query([rid])?;
    let mut loader = JournalLoader::default();
    while let Some(r) = rows.next()? {
        loader.push(r.get_ref(0)?.as_str()?, r.get_ref(1)?.as_str()?);
    }
    Ok(loader.finish())
}

fn read_journal(conn: &Connection, rid: i64) -> rusqlite::Result<Vec<(String, String)>> {
    let mut st = conn.prepare_cached("SELECT step_key, value_json FROM journal WHERE rid = ?1")?;
    let rows = st.query_map([rid], |r| Ok((r.get(0)?, r.get(1)?)))?;
    rows.collect()
}
