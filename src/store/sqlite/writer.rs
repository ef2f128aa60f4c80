//! The group commit: queued writes and the connection they are written
//! on, by whichever caller takes the lock first or by the background
//! writer.

use crate::error::{AtPath, CoreError, CoreResult};
use crate::store::slot::{record_span_write_error, Slot};
use crate::store::spans::ReplayedSpan;
use crate::store::sqlite::batched::BatchedSteps;
use crate::store::sqlite::checkpointer::Checkpointer;
use crate::store::sqlite::rows::{
    insert_run, insert_span_under, journal_winner, read_run_row, remember_trace, Leases, QueuedRun,
    JOURNAL_STEP_INSERT,
};
use crate::store::sqlite::statements::Statements;
use crate::store::sqlite::write_tx::WriteTx;
use crate::store::{RowSlot, RunRow, SpanRecord};
use parking_lot::{Condvar, Mutex};
use rusqlite::{Connection, OptionalExtension};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Queued spans are written in the background once this many are waiting
/// (replayed steps queue one each): a replay's settlement, which must write
/// what is still queued (OBS-5), finds at most about this many rows left,
/// while each background commit still carries enough rows to keep pace.
pub(crate) const BACKGROUND_BATCH: usize = 64;

/// Queued writes past which the queuing thread writes them itself.
pub(crate) const MAX_BACKLOG: usize = 4096;

/// How long a finished span may wait in the queue before the background
/// writer commits it on its own.
pub(crate) const SPAN_LATENCY: std::time::Duration = std::time::Duration::from_millis(50);

/// How long a batch-durability step may wait in the queue before the
/// background writer group-commits it: half the 10 ms promised, leaving the
/// rest for the commit itself.
pub const BATCH_LATENCY: std::time::Duration = std::time::Duration::from_millis(5);

/// Batch-durability steps past which the background writer commits them
/// without waiting for `BATCH_LATENCY`: bounds a commit's length, and the
/// rows a settlement (or any synchronous write) has to write first.
pub(crate) const BATCH_STEPS: usize = 256;

#[derive(Default)]
pub(crate) struct Queue {
    pub(crate) ops: Vec<Op>,
    /// A deferred journal write is waiting: commit without waiting for a
    /// full batch.
    pub(crate) urgent: bool,
    /// When the oldest queued batch-durability step must be committed.
    pub(crate) due: Option<std::time::Instant>,
    /// A run row's insert is queued: reads of run rows write it first.
    pub(crate) rows: bool,
    /// Steps queued in `Op::Batched` since the last take.
    pub(crate) batched: usize,
    /// Emptied batches, their buffers kept for the next ones (boxed as in
    /// `Op::Batched`, so they move back without a new allocation).
    #[allow(clippy::vec_box)]
    pub(crate) spare: Vec<Box<BatchedSteps>>,
    /// Until when the background writer sleeps: `None` while it works,
    /// `Some(None)` until woken.
    pub(crate) writer_sleeps: Option<Option<std::time::Instant>>,
    pub(crate) shutdown: bool,
    pub(crate) background_started: bool,
}

pub(crate) enum Op {
    Span(Box<SpanRecord>),
    Step {
        rid: i64,
        key: String,
        value: String,
        ident: Option<String>,
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

pub(crate) struct Writer {
    /// Before `conn`: finalized before it closes.
    pub(crate) statements: Statements,
    pub(crate) conn: Connection,
    pub(crate) traces: HashMap<String, i64>,
    /// After `conn`, which calls into it on every commit.
    pub(crate) checkpointer: Option<Checkpointer>,
}

/// The store's state, shared with its background writer thread.
pub struct Inner {
    pub(crate) path: String,
    pub(crate) writer: Mutex<Writer>,
    pub(crate) queue: Mutex<Queue>,
    pub(crate) wake: Condvar,
}

impl Inner {
    pub(crate) fn lock_writer(&self) -> parking_lot::MutexGuard<'_, Writer> {
        self.writer.lock()
    }

    pub(crate) fn background_writer(&self) {
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

    pub(crate) fn take_queue(&self) -> Vec<Op> {
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

    pub(crate) fn drain(&self, w: &mut Writer) -> CoreResult<()> {
        let ops = self.take_queue();
        if ops.is_empty() {
            return Ok(());
        }
        self.apply(w, ops, |_| Ok(()))
    }

    /// Applies `ops` and then `extra` in one transaction, filling step slots.
    pub(crate) fn apply(
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
    pub(crate) fn recycle(&self, ops: Vec<Op>) {
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

    pub(crate) fn run_row(conn: &Connection, run_id: &str) -> rusqlite::Result<Option<RunRow>> {
        conn.prepare_cached(
            "SELECT rid, run_id, kind, name, status, created_at, updated_at, trace_id, \
             fingerprint, args_json, output_json, error_json, budget_json, module \
             FROM runs WHERE run_id = ?1",
        )?
        .query_row([run_id], read_run_row)
        .optional()
    }
}

/// Applies queued journal writes and spans inside `tx`, those of runs
/// another process took over refused.
pub(crate) fn write_ops(
    tx: &Connection,
    traces: &mut HashMap<String, i64>,
    statements: &mut Statements,
    ops: &[Op],
    results: &mut Vec<(Arc<Slot>, CoreResult<Option<String>>)>,
    path: &str,
) -> CoreResult<()> {
    write_ops_tx(tx, traces, statements, ops, results).at(path)
}

pub(crate) fn write_ops_tx(
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
                ident,
                slot,
            } => {
                if slot.failed() {
                    continue;
                }
                if let Some(run_id) = leases.moved(*rid)? {
                    results.push((slot.clone(), Err(crate::store::takeover::moved(&run_id))));
                    continue;
                }
                let inserted = statements.execute(tx, JOURNAL_STEP_INSERT, |p| {
                    p.set(1, *rid)?;
                    p.set(2, key.as_str())?;
                    p.set(3, value.as_str())?;
                    p.set(4, ident.as_deref())
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
pub(crate) fn write_batched(
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
