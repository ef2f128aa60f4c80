//! `SqliteStore`: the `Store` operations over the writer.

use crate::error::{AtPath, CoreError, CoreResult};
use crate::store::durable::{CancelOutcome, DueRun, DurableStore, WaitRow};
use crate::store::graph::GraphWork;
use crate::store::slot::Slot;
use crate::store::spans::ReplayedSpan;
use crate::store::spans::SpanView;
use crate::store::sqlite::checkpointer::Checkpointer;
use crate::store::sqlite::durable;
use crate::store::sqlite::open::open_connection;
use crate::store::sqlite::rows::{
    count_recovery, insert_journal, load_journal, read_journal, read_pending, record_answers_in,
    remember_trace, settle_tx, write_agent_state, QueuedRun,
};
use crate::store::sqlite::statements::Statements;
use crate::store::sqlite::writer::{
    Inner, Op, Queue, Writer, BACKGROUND_BATCH, BATCH_LATENCY, BATCH_STEPS, MAX_BACKLOG,
};
use crate::store::{
    AgentStateRow, Claim, InterruptRow, LeaseCheck, NewRun, PriorSpend, RowSlot, RunRow,
    Settlement, SpanRecord, SpanRow, Store,
};
use crate::time::now;
use parking_lot::{Condvar, Mutex};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::collections::HashMap;
use std::sync::Arc;

pub struct SqliteStore {
    pub(crate) inner: Arc<Inner>,
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
    pub(crate) fn enqueue(&self, op: Op, urgent: bool) {
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
    pub(crate) fn batch_queued(&self, mut q: parking_lot::MutexGuard<'_, Queue>) -> CoreResult<()> {
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
    pub(crate) fn start_writer(&self, q: &mut Queue) -> bool {
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
                 fingerprint, args_json, budget_json, lease_owner, lease_until, module) \
                 VALUES(?1, ?2, ?3, 'running', ?4, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
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
                    lease_until,
                    new.module
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
    ) -> CoreResult<(RunRow, crate::store::JournalRows)> {
        self.acquire_reading(
            run_id,
            owner,
            lease_until,
            live,
            takeover,
            crate::store::sqlite::rows::read_journal_rows,
        )
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
        ident: Option<&str>,
        span: Option<SpanRecord>,
    ) -> CoreResult<Option<String>> {
        let slot = Arc::new(Slot::default());
        {
            let mut q = self.queue.lock();
            q.ops.push(Op::Step {
                rid,
                key: key.to_string(),
                value: value.to_string(),
                ident: ident.map(str::to_string),
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
        ident: Option<&str>,
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
                ident: ident.map(str::to_string),
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
        ident: Option<&str>,
        span: Option<SpanRecord>,
        slot: &Arc<Slot>,
    ) -> CoreResult<()> {
        let mut q = self.queue.lock();
        q.ops.push(Op::Step {
            rid,
            key: key.to_string(),
            value: value.to_string(),
            ident: ident.map(str::to_string),
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
        ident: Option<&str>,
        span: Option<SpanRow>,
        trace: &Arc<str>,
        slot: &Arc<Slot>,
    ) -> CoreResult<()> {
        let view = match &span {
            Some(s) => match SpanView::of(s, value) {
                Some(view) => Some(view),
                None => {
                    let record = span.map(|s| SpanRecord::of_step(trace, rid, s, Some(value)));
                    return self.commit_batched(rid, key, value, ident, record, slot);
                }
            },
            None => None,
        };
        self.commit_batched_view(rid, key, value, ident, view, trace, slot)
    }

    fn commit_batched_view(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        ident: Option<&str>,
        span: Option<SpanView<'_>>,
        trace: &Arc<str>,
        slot: &Arc<Slot>,
    ) -> CoreResult<()> {
        let mut guard = self.queue.lock();
        let q = &mut *guard;
        let span = span.map(|s| (trace, s));
        match q.ops.last_mut() {
            Some(Op::Batched(batch)) => batch.push(rid, key, value, ident, span, slot),
            _ => {
                let mut batch = q.spare.pop().unwrap_or_default();
                batch.push(rid, key, value, ident, span, slot);
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
        // The run's queued spans commit with its settlement, so they are
        // stored when run()/resume() returns (OBS-5).
        let ops = self.take_queue();
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

    fn answer_interrupts(
        &self,
        run_id: &str,
        answers: &[(String, String)],
        at: Option<&str>,
    ) -> CoreResult<crate::store::answer::AnswerOutcome> {
        self.with_conn(|c| {
            crate::store::sqlite::answer::answer_interrupts(c, &self.path, run_id, answers, at)
        })
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

    fn read_journal(&self, run_id: &str) -> CoreResult<Option<(RunRow, crate::journal::Journal)>> {
        let mut w = self.lock_writer();
        if self.queue.lock().rows {
            self.drain(&mut w)?;
        }
        let Some(row) = Inner::run_row(&w.conn, run_id).at(&self.path)? else {
            return Ok(None);
        };
        let journal = load_journal(&w.conn, row.rid).at(&self.path)?;
        Ok(Some((row, journal)))
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

impl SqliteStore {
    /// `acquire`, the journal read by `read` in the same transaction.
    pub(crate) fn acquire_reading<T>(
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

impl DurableStore for SqliteStore {
    fn commit_wait(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        timer: Option<(&str, Option<f64>)>,
    ) -> CoreResult<Option<String>> {
        let path = crate::store::Store::path(self).to_string();
        self.with_conn(|c| {
            let tx = c
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .at(&path)?;
            // Fenced (STORE-11): nothing is written once the run moved on.
            if let Some(run_id) = crate::store::sqlite::rows::moved_away(&tx, rid).at(&path)? {
                return Err(crate::store::takeover::moved(&run_id));
            }
            let winner =
                crate::store::sqlite::rows::insert_journal(&tx, rid, key, value).at(&path)?;
            if let Some((k, wake)) = timer {
                durable::insert_timer(&tx, rid, k, wake).at(&path)?;
            }
            tx.commit().at(&path)?;
            Ok(winner)
        })
    }

    fn insert_timer(&self, rid: i64, key: &str, wake_at: Option<f64>) -> CoreResult<()> {
        let path = crate::store::Store::path(self);
        self.with_conn(|c| durable::insert_timer(c, rid, key, wake_at).at(path))
    }

    fn take_timer(&self, rid: i64, key: &str) -> CoreResult<Option<f64>> {
        let path = crate::store::Store::path(self);
        self.with_conn(|c| durable::take_timer(c, rid, key).at(path))
    }

    fn signal_at(&self, rid: i64, name: &str, seq: i64) -> CoreResult<Option<String>> {
        let path = crate::store::Store::path(self);
        self.with_conn(|c| durable::signal_at(c, rid, name, seq).at(path))
    }

    fn signals_after(&self, rid: i64, name: &str, seq: i64) -> CoreResult<Vec<(i64, String)>> {
        let path = crate::store::Store::path(self);
        self.with_conn(|c| durable::signals_after(c, rid, name, seq).at(path))
    }

    fn last_signal_id(&self, rid: i64) -> CoreResult<i64> {
        let path = crate::store::Store::path(self);
        self.with_conn(|c| durable::last_signal_id(c, rid).at(path))
    }

    fn send_signal(&self, run_id: &str, name: &str, value_json: &str) -> CoreResult<i64> {
        let path = crate::store::Store::path(self);
        self.with_conn(|c| durable::send_signal(c, path, run_id, name, value_json))
    }

    fn request_cancel(
        &self,
        run_id: &str,
        reason: Option<&str>,
        live: crate::store::LeaseCheck<'_>,
    ) -> CoreResult<CancelOutcome> {
        let path = crate::store::Store::path(self);
        self.with_conn(|c| durable::request_cancel(c, path, run_id, reason, live))
    }

    fn due_runs(
        &self,
        now: f64,
        limit: usize,
        live: crate::store::LeaseCheck<'_>,
    ) -> CoreResult<Vec<DueRun>> {
        let path = crate::store::Store::path(self);
        self.with_conn(|c| durable::due_runs(c, now, limit, live).at(path))
    }

    fn next_wake(&self, after: f64) -> CoreResult<Option<f64>> {
        let path = crate::store::Store::path(self);
        self.with_conn(|c| durable::next_wake(c, after).at(path))
    }

    fn parked_wait(&self, run_id: &str) -> CoreResult<Option<WaitRow>> {
        let path = crate::store::Store::path(self);
        self.with_conn(|c| durable::parked_wait(c, run_id).at(path))
    }

    fn change_marker(&self) -> CoreResult<i64> {
        let path = crate::store::Store::path(self);
        self.with_conn(|c| {
            c.query_row("PRAGMA data_version", [], |r| r.get::<_, i64>(0))
                .at(path)
        })
    }

    fn release_leases(&self, owner: &str) -> CoreResult<usize> {
        let path = crate::store::Store::path(self);
        self.with_conn(|c| {
            c.execute(
                "UPDATE runs SET status = 'running', lease_owner = NULL, lease_until = NULL \
                 WHERE lease_owner = ?1",
                [owner],
            )
            .at(path)
        })
    }
}
