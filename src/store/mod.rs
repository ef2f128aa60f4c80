//! The durable store: runs, journal, spans, interrupts, agent state, chats.
//!
//! `Store` is the seam callers use, implemented by `sqlite::SqliteStore`
//! and `postgres::PgStore`. The durable primitives' tables are reached
//! through `durable::store::DurableStore` and the graph tables through
//! `graph::store::GraphTx`, so no caller depends on one backend.

pub mod answer;
pub mod durable;
pub mod graph;
pub mod postgres;
pub mod published;
pub mod query;
pub mod queue;
pub mod rows;
pub mod schedule;
pub mod slot;
pub mod spans;
pub mod sqlite;
pub mod takeover;
pub mod upgrade;
pub mod url;

use crate::error::CoreResult;
use graph::GraphWork;

pub use rows::{
    AgentStateRow, ChatRow, Claim, InterruptRow, KeyedRow, NewRun, PriorSpend, RowSlot, RunRow,
    Settlement, SpanRecord, SpanRow, UsageRow,
};
pub use takeover::LeaseCheck;

/// The store: runs and their attempts here, the durable primitives'
/// tables through `DurableStore`.
/// A run's journal rows as stored: key, value and step identity.
pub type JournalRows = Vec<(String, String, Option<String>)>;

pub trait Store:
    Send + Sync + durable::DurableStore + published::PublishStore + schedule::ScheduleStore
{
    fn path(&self) -> &str;

    /// Creates a run row leased to `owner`, in one commit.
    fn create_run(&self, new: &NewRun, owner: &str, lease_until: f64) -> CoreResult<RunRow> {
        self.create_run_with(new, owner, lease_until, &mut |_| Ok(()), true)
    }

    /// `create_run` without a commit of its own: the insert joins the queue
    /// of writes, so the next commit carries it (a standalone agent run's
    /// settlement), or the background writer within `sqlite::BATCH_LATENCY`.
    /// The returned row's `rid` is 0 until the slot holds it. By default
    /// (a store without a writer queue) the row is created at once.
    fn create_run_queued(
        &self,
        new: &NewRun,
        owner: &str,
        lease_until: f64,
    ) -> CoreResult<(RunRow, std::sync::Arc<RowSlot>)> {
        let run = self.create_run(new, owner, lease_until)?;
        let slot = RowSlot::stored(run.rid);
        Ok((run, slot))
    }

    /// Queues a span of the run whose row `row` is still queued; it is
    /// written after the row, with its rid.
    fn queue_row_span(&self, row: &std::sync::Arc<RowSlot>, mut span: SpanRecord) {
        if row.committed().is_none() {
            // Failures reach the attempt through the row's slot.
            let _ = self.flush();
        }
        if let Some(Ok(rid)) = row.committed() {
            span.rid = Some(rid);
            self.queue_span(span);
        }
    }

    /// `settle` of the run whose row `row` may still be queued: the insert
    /// and the settlement commit together.
    fn settle_row(
        &self,
        row: &std::sync::Arc<RowSlot>,
        owner: &str,
        settlement: &Settlement,
    ) -> CoreResult<()> {
        self.flush()?;
        let rid = row.committed().unwrap_or_else(|| {
            Err(crate::error::CoreError::Store(
                "the run row was not written".into(),
            ))
        })?;
        self.settle(rid, owner, settlement)
    }

    /// `create_run` under a caller's run id (OPS-10): when a run already
    /// holds the id nothing is written and that run is returned with its
    /// lease. The store's unique key on run ids decides between racing
    /// callers.
    fn create_run_keyed(&self, new: &NewRun, owner: &str, lease_until: f64)
        -> CoreResult<KeyedRow>;

    /// `create_run` with `work` in the same transaction (a graph thread
    /// claimed together with its new run); without `drain` the queued spans
    /// are left to the background writer.
    fn create_run_with(
        &self,
        new: &NewRun,
        owner: &str,
        lease_until: f64,
        work: &mut GraphWork<'_>,
        drain: bool,
    ) -> CoreResult<RunRow>;

    /// Takes the lease on an existing run (refused while `live` says the
    /// current holder is alive) and loads its whole journal. `takeover`
    /// says whether taking it from a dead holder counts as a recovery
    /// (STORE-12): past the limit the run is failed in the same
    /// transaction and the lease is not taken.
    fn acquire(
        &self,
        run_id: &str,
        owner: &str,
        lease_until: f64,
        live: LeaseCheck<'_>,
        takeover: crate::store::takeover::Takeover,
    ) -> CoreResult<(RunRow, JournalRows)>;

    /// `acquire` with the journal in the attempt's form, after journaling
    /// `answers` (`(interrupt id, value)`, FLOW-43) and clearing their
    /// pending interrupts. A store may do all of it in the claim's own
    /// transaction, and say there where the attempt's spans begin.
    fn acquire_journal(
        &self,
        run_id: &str,
        owner: &str,
        lease_until: f64,
        live: LeaseCheck<'_>,
        takeover: crate::store::takeover::Takeover,
        answers: &[(String, String)],
    ) -> CoreResult<Claim> {
        let (row, entries) = self.acquire(run_id, owner, lease_until, live, takeover)?;
        let mut journal = crate::journal::Journal::from_rows(&entries);
        if !answers.is_empty() {
            self.record_answers(row.rid, answers)?;
            // First write wins, in memory as in the store.
            for (id, value) in answers {
                journal.record(
                    &format!("__interrupt__:{id}"),
                    std::sync::Arc::from(value.as_str()),
                );
            }
        }
        Ok(Claim {
            row,
            journal,
            span_mark: None,
        })
    }

    /// Extends to `until` the leases `owner` still holds among `rids`, in
    /// one statement; returns the runs renewed (the others moved on).
    fn renew_leases(&self, owner: &str, until: f64, rids: &[i64]) -> CoreResult<Vec<i64>>;

    /// Journals `value` under `key` (first write wins) together with the
    /// step's span, durably, before returning. Returns the stored value when
    /// an earlier write won.
    fn commit_step(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        ident: Option<&str>,
        span: Option<SpanRecord>,
    ) -> CoreResult<Option<String>>;

    /// Whether a step commit waits on a server: an async driver then awaits
    /// `commit_step_future` instead of blocking its event loop.
    fn remote(&self) -> bool {
        false
    }

    /// `commit_step` as a future the core's runtime drives (a server-backed
    /// store); by default it commits in place and is ready at once.
    fn commit_step_future(
        &self,
        rid: i64,
        key: String,
        value: String,
        ident: Option<String>,
        span: Option<SpanRecord>,
    ) -> futures_util::future::BoxFuture<'static, CoreResult<Option<String>>> {
        Box::pin(std::future::ready(self.commit_step(
            rid,
            &key,
            &value,
            ident.as_deref(),
            span,
        )))
    }

    /// Queues a span; it is written with the next commit or `flush`, or in
    /// the background once enough are waiting.
    fn queue_span(&self, span: SpanRecord);

    /// Queues the span of a replayed step of a run whose row is stored.
    fn queue_replayed(&self, span: spans::ReplayedSpan) {
        self.queue_span(span.into_record());
    }

    /// Journals `value` under `key` with its span without waiting: a
    /// background commit makes it durable soon, and `flush` waits for it.
    /// The slot holds the outcome once applied.
    fn commit_deferred(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        ident: Option<&str>,
        span: Option<SpanRecord>,
    ) -> std::sync::Arc<slot::Slot>;

    /// Whether `commit_batched` is available (batch durability).
    fn supports_batch(&self) -> bool {
        false
    }

    /// Queues `value` under `key` with its span for the background writer,
    /// which commits it within `sqlite::BATCH_LATENCY`, in queue order with
    /// every other queued write (batch durability). `slot` is shared by all
    /// batched writes of one attempt: it keeps the first failure, and once
    /// it holds one, later writes through it are dropped rather than stored
    /// after a lost one.
    fn commit_batched(
        &self,
        _rid: i64,
        _key: &str,
        _value: &str,
        _ident: Option<&str>,
        _span: Option<SpanRecord>,
        _slot: &std::sync::Arc<slot::Slot>,
    ) -> CoreResult<()> {
        Err(crate::error::CoreError::Config(format!(
            "composeai store '{}': durability 'batch' is not supported by this store yet -- \
             use durability 'step' (the default)",
            self.path()
        )))
    }

    /// `commit_batched` of a step and its span as the attempt made it, in
    /// trace `trace` (a store may queue it in a compact form).
    #[allow(clippy::too_many_arguments)]
    fn commit_batched_step(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        ident: Option<&str>,
        span: Option<SpanRow>,
        trace: &std::sync::Arc<str>,
        slot: &std::sync::Arc<slot::Slot>,
    ) -> CoreResult<()> {
        let record = span.map(|s| SpanRecord::of_step(trace, rid, s, Some(value)));
        self.commit_batched(rid, key, value, ident, record, slot)
    }

    /// `commit_batched_step` of a span borrowed from its maker.
    #[allow(clippy::too_many_arguments)]
    fn commit_batched_view(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        ident: Option<&str>,
        span: Option<spans::SpanView<'_>>,
        trace: &std::sync::Arc<str>,
        slot: &std::sync::Arc<slot::Slot>,
    ) -> CoreResult<()> {
        let span = span.map(|s| s.to_row(value));
        self.commit_batched_step(rid, key, value, ident, span, trace, slot)
    }

    /// Writes everything queued.
    fn flush(&self) -> CoreResult<()>;

    /// Writes everything queued and lets go of the database, as the process
    /// exits: later calls fail. A store with nothing to let go of only
    /// flushes.
    fn close(&self) -> CoreResult<()> {
        self.flush()
    }

    /// Whether `span_mark`/`step_spans` read spans back.
    fn reads_spans(&self) -> bool {
        false
    }

    /// A position in the store's span rows, after writing everything
    /// queued (see `step_spans`); `None` when the store cannot read spans
    /// back for a run's trace.
    fn span_mark(&self) -> CoreResult<Option<i64>> {
        Ok(None)
    }

    /// The `ok` task-step spans of `rid` written after `mark`, after
    /// writing everything queued.
    fn step_spans(&self, _rid: i64, _mark: i64) -> CoreResult<Vec<spans::StepSpanRow>> {
        Ok(Vec::new())
    }

    /// Settles an attempt: status, output or error, pending interrupts, lease
    /// released, queued spans written, all in one transaction.
    fn settle(&self, rid: i64, owner: &str, settlement: &Settlement) -> CoreResult<()> {
        self.settle_with(rid, owner, settlement, &mut |_| Ok(()))
    }

    /// `settle` with `work` in the same transaction (a graph run's last
    /// checkpoint).
    fn settle_with(
        &self,
        rid: i64,
        owner: &str,
        settlement: &Settlement,
        work: &mut GraphWork<'_>,
    ) -> CoreResult<()>;

    /// Replaces the stored budget (last write wins).
    fn set_budget(&self, rid: i64, budget_json: &str) -> CoreResult<()>;

    /// Journals answers (first write wins) and deletes their pending rows.
    fn record_answers(&self, rid: i64, answers: &[(String, String)]) -> CoreResult<()>;

    fn get_run(&self, run_id: &str) -> CoreResult<Option<RunRow>>;

    /// Journals answers to a run's pending interrupts from outside any
    /// attempt (`compose answer`), in one transaction (`answer::answer_in`):
    /// `answers` are `(interrupt id, value JSON)`, `at` the checkpoint a
    /// graph interrupt was seen at.
    fn answer_interrupts(
        &self,
        run_id: &str,
        answers: &[(String, String)],
        at: Option<&str>,
    ) -> CoreResult<answer::AnswerOutcome>;

    /// Deletes a run and everything stored for it (journal, spans of its
    /// trace, pending interrupts, agent state), in one transaction.
    fn delete_run(&self, rid: i64) -> CoreResult<()>;

    /// Stores an agent snapshot durably (last write wins).
    fn save_agent_state(&self, rid: i64, state: &AgentStateRow) -> CoreResult<()>;

    fn load_agent_state(&self, rid: i64, scope_key: &str) -> CoreResult<Option<AgentStateRow>>;

    /// Tokens (input + output) and USD of the run's persisted `llm` spans, in
    /// all and per step key of the agent spans above them, in one pass.
    fn prior_llm_usage(&self, rid: i64) -> CoreResult<PriorSpend>;

    fn pending(&self, rid: i64) -> CoreResult<Vec<InterruptRow>>;

    /// The journal of a run, as stored.
    fn journal(&self, rid: i64) -> CoreResult<Vec<(String, String)>>;

    /// A run's row and its journal in the attempt's form, step identities
    /// included, read without a lease (a replay-only attempt, a fork's
    /// source); `None` when there is no such run.
    fn read_journal(&self, run_id: &str) -> CoreResult<Option<(RunRow, crate::journal::Journal)>>;

    /// Upserts a chat row (CHAT-4); `updated_at` is set to now.
    fn save_chat(&self, chat: &ChatRow) -> CoreResult<()>;

    fn load_chat(&self, chat_id: &str) -> CoreResult<Option<ChatRow>>;

    /// The run's stored cancel request (EXT-10): `Some(reason)` when one
    /// is stored.
    fn cancel_request(&self, rid: i64) -> CoreResult<Option<Option<String>>>;

    /// Journals `entries` (first write wins) and runs `work` in one
    /// transaction fenced on this attempt owning the run, leaving queued
    /// spans to a later commit (a graph step's checkpoint: its spans are
    /// observability and ride with a later commit).
    fn commit_with(
        &self,
        rid: i64,
        entries: &[(String, String)],
        work: &mut GraphWork<'_>,
    ) -> CoreResult<()>;

    /// Writes everything queued, then `work` on the graph tables, in one
    /// transaction.
    fn transact(&self, work: &mut GraphWork<'_>) -> CoreResult<()>;

    /// Runs `work` on the graph tables; queued writes stay queued (graph
    /// tables are never written through the queue).
    fn read(&self, work: &mut GraphWork<'_>) -> CoreResult<()>;

    /// OPS-1: per flow and fingerprint, the flow runs not settled yet.
    fn code_versions(&self) -> CoreResult<Vec<upgrade::VersionRow>>;

    /// OPS-3: the runs of the flows in `flows` (`(name, fingerprint of the
    /// imported code)`) an upgrade to that code considers (see
    /// `upgrade::upgradable`, with another fingerprint unless failed),
    /// created at or after `since`, oldest first.
    fn upgrade_candidates(
        &self,
        flows: &[(String, String)],
        since: Option<f64>,
    ) -> CoreResult<Vec<upgrade::Candidate>>;

    /// OPS-3: re-stamps a run whose journal replayed cleanly under new
    /// code, in one transaction fenced on the run being what the replay
    /// checked and no live attempt holding it (`upgrade::upgrade_in`).
    fn upgrade_run(
        &self,
        req: &upgrade::UpgradeRequest<'_>,
        live: LeaseCheck<'_>,
    ) -> CoreResult<upgrade::UpgradeOutcome>;

    /// The longest a blocked wait sleeps before reading the store again
    /// (STORE-22): a store that sends wake-up hints starts listening here
    /// and polls less often.
    fn wait_slice(&self) -> std::time::Duration {
        crate::store::durable::POLL
    }
}
