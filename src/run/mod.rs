//! Run lifecycle: creating runs, leasing an attempt to one process, and
//! settling it.

mod commit;
pub mod deadline;
pub mod keyed;
mod spans;
mod waits;

use crate::error::{CoreError, CoreResult};
use crate::journal::{Fence, Journal};
use crate::owner::{lease_is_live, owner_id};
use crate::store::slot::Slot;
use crate::store::{
    AgentStateRow, InterruptRow, NewRun, PriorSpend, RowSlot, RunRow, Settlement, Store,
};
use crate::time::now;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
pub use waits::AttemptState;

/// Runs currently executed by this process.
fn active_runs() -> &'static Mutex<HashSet<String>> {
    static ACTIVE: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    ACTIVE.get_or_init(|| Mutex::new(HashSet::new()))
}

fn claim_in_process(run_id: &str) -> CoreResult<()> {
    if !active_runs().lock().insert(run_id.to_string()) {
        return Err(CoreError::Config(format!(
            "run '{run_id}' is already being executed in this process -- one attempt of a run \
             executes at a time; resume it after the current attempt returns"
        )));
    }
    Ok(())
}

/// What `Attempt::begin_commit` hands an async driver.
pub enum Commit {
    Stored(Arc<str>),
    Pending(futures_util::future::BoxFuture<'static, CoreResult<Option<String>>>),
}

/// Work on the graph tables inside a store transaction.
use crate::store::graph::GraphWork as TxWork;

/// One attempt at executing a run, holding its lease.
/// The last task name and parent span id of a replayed span.
type ReplayNames = (Option<Arc<str>>, Option<Arc<str>>);

pub struct Attempt {
    store: Arc<dyn Store>,
    /// The run row as created or loaded; its `rid` is 0 while a queued
    /// insert (`start_queued`) is not committed: use `rid()`.
    pub run: RunRow,
    /// Where the run's rid lands once its row is stored.
    row: Arc<RowSlot>,
    journal: Mutex<Journal>,
    /// Set once settled: every later journal access is refused.
    closed: AtomicBool,
    root_fence: Fence,
    /// Journal writes committed in the background, not yet confirmed.
    deferred: Mutex<Vec<Arc<Slot>>>,
    /// Batch durability: unfenced steps are handed back before they are
    /// durable and group-committed by the store's writer.
    batch: AtomicBool,
    /// Shared by every batched write: keeps the first failure.
    batch_slot: Arc<Slot>,
    /// The run's first attempt: there is no earlier spend to read.
    first: bool,
    /// Earlier attempts' spend, read on first need.
    prior: Mutex<Option<Arc<PriorSpend>>>,
    /// This attempt stored an agent snapshot: a first attempt has none
    /// to load otherwise.
    saved_state: AtomicBool,
    /// Signal cursors, the parked wait and cancel polling (EXT-1 … EXT-10).
    pub(crate) durable: AttemptState,
    /// Renewed by the heartbeat until the attempt ends.
    lease: Mutex<Option<crate::lease::Lease>>,
    /// The run's trace id, shared by the replayed spans it queues, and
    /// the last task name and parent span id they had (consecutive ones
    /// share them).
    trace: Arc<str>,
    replay_names: Mutex<ReplayNames>,
    /// Where this attempt's spans begin in the store, when its claim read it.
    claimed_span_mark: Option<i64>,
    /// How a divergence from the journal is met (issue 27): `CHECK_*`.
    divergence: AtomicU8,
    /// The divergence that ended this attempt's journal access, once raised.
    diverged: Mutex<Option<CoreError>>,
    poisoned: AtomicBool,
    /// Divergences met under `CHECK_WARN`, not yet handed to Python.
    warnings: Mutex<Vec<CoreError>>,
    warned: AtomicBool,
    /// A replay-only attempt (`composeai.testing.replay`): it reads the
    /// run's journal and writes nothing; a step the journal lacks ends it.
    replay_only: bool,
    /// Steps a replay-only attempt replayed.
    replayed_steps: std::sync::atomic::AtomicU64,
    /// A fork's source (issue 27): the journal steps are borrowed from
    /// until its `at` key is reserved.
    source: Mutex<Option<crate::journal::ForkSource>>,
    /// Whether `source` is set (read without its lock on every step).
    forking: AtomicBool,
}

/// A divergence raises `NondeterminismError` and ends the attempt's
/// journal access.
pub const CHECK_RAISE: u8 = 0;
/// A divergence is reported as a warning, once; the attempt goes on
/// unchecked.
pub const CHECK_WARN: u8 = 1;
pub const CHECK_OFF: u8 = 2;

impl Attempt {
    /// Creates a run and its first attempt.
    pub fn start(store: Arc<dyn Store>, new: NewRun) -> CoreResult<Attempt> {
        let seconds = crate::lease::lease_seconds()?;
        claim_in_process(&new.run_id)?;
        match store.create_run(&new, owner_id(), now() + seconds) {
            Ok(run) => Ok(Attempt::new(store, run, Journal::default(), true, seconds)),
            Err(e) => {
                active_runs().lock().remove(&new.run_id);
                Err(e)
            }
        }
    }

    /// `start` without a commit of its own: the run row is inserted by the
    /// next commit (the settlement of a short run) or by the store's
    /// writer within its batch latency, whichever comes first. Nothing is
    /// lost by a crash before then: the run has journaled nothing yet, and
    /// every journal write, snapshot or settlement commits the row first.
    pub fn start_queued(store: Arc<dyn Store>, new: NewRun) -> CoreResult<Attempt> {
        let seconds = crate::lease::lease_seconds()?;
        claim_in_process(&new.run_id)?;
        match store.create_run_queued(&new, owner_id(), now() + seconds) {
            Ok((run, row)) => Ok(Attempt::with_row(
                store,
                run,
                row,
                Journal::default(),
                true,
                seconds,
            )),
            Err(e) => {
                active_runs().lock().remove(&new.run_id);
                Err(e)
            }
        }
    }

    /// `start` with `work` in the run's creating transaction, leaving queued
    /// spans to the background writer (a graph thread's run).
    pub fn start_with(
        store: Arc<dyn Store>,
        new: NewRun,
        work: &mut TxWork<'_>,
    ) -> CoreResult<Attempt> {
        let seconds = crate::lease::lease_seconds()?;
        claim_in_process(&new.run_id)?;
        match store.create_run_with(&new, owner_id(), now() + seconds, work, false) {
            Ok(run) => Ok(Attempt::new(store, run, Journal::default(), true, seconds)),
            Err(e) => {
                active_runs().lock().remove(&new.run_id);
                Err(e)
            }
        }
    }

    /// Takes the lease of an existing run and loads its journal once.
    pub fn resume(store: Arc<dyn Store>, run_id: &str) -> CoreResult<Attempt> {
        Attempt::resume_answering(store, run_id, &[])
    }

    /// `resume` journaling `answers` (`(interrupt id, value)`, FLOW-43)
    /// with the claim.
    pub fn resume_answering(
        store: Arc<dyn Store>,
        run_id: &str,
        answers: &[(String, String)],
    ) -> CoreResult<Attempt> {
        Attempt::take(
            store,
            run_id,
            crate::store::takeover::Takeover::Manual,
            answers,
        )
    }

    /// `resume` for a worker continuing a due run: taking it from a dead
    /// holder counts against `COMPOSE_MAX_RECOVERY_ATTEMPTS` (STORE-12).
    pub fn recover(
        store: Arc<dyn Store>,
        run_id: &str,
        answers: &[(String, String)],
    ) -> CoreResult<Attempt> {
        let max = crate::lease::max_recovery_attempts()?;
        Attempt::take(
            store,
            run_id,
            crate::store::takeover::Takeover::Recover { max },
            answers,
        )
    }

    fn take(
        store: Arc<dyn Store>,
        run_id: &str,
        takeover: crate::store::takeover::Takeover,
        answers: &[(String, String)],
    ) -> CoreResult<Attempt> {
        let seconds = crate::lease::lease_seconds()?;
        claim_in_process(run_id)?;
        match store.acquire_journal(
            run_id,
            owner_id(),
            now() + seconds,
            &lease_is_live,
            takeover,
            answers,
        ) {
            Ok(claim) => {
                let mut attempt = Attempt::new(store, claim.row, claim.journal, false, seconds);
                attempt.claimed_span_mark = claim.span_mark;
                attempt.reattach_fork()?;
                Ok(attempt)
            }
            Err(e) => {
                active_runs().lock().remove(run_id);
                Err(e)
            }
        }
    }

    fn new(
        store: Arc<dyn Store>,
        run: RunRow,
        journal: Journal,
        first: bool,
        seconds: f64,
    ) -> Attempt {
        let row = RowSlot::stored(run.rid);
        Attempt::with_row(store, run, row, journal, first, seconds)
    }

    fn with_row(
        store: Arc<dyn Store>,
        run: RunRow,
        row: Arc<RowSlot>,
        journal: Journal,
        first: bool,
        seconds: f64,
    ) -> Attempt {
        let lease = crate::lease::register(store.clone(), row.clone(), seconds);
        let attempt = Attempt::assemble(store, run, row, journal, first, Some(lease), false);
        if first {
            // The run row was created just now, with no cancel request: the
            // first poll is due one interval later, as after any check.
            attempt.durable.cancel_checked_now();
        }
        attempt
    }

    /// An attempt's fields, holding `lease` (none: a replay-only attempt).
    fn assemble(
        store: Arc<dyn Store>,
        run: RunRow,
        row: Arc<RowSlot>,
        journal: Journal,
        first: bool,
        lease: Option<crate::lease::Lease>,
        replay_only: bool,
    ) -> Attempt {
        let trace = Arc::from(run.trace_id.as_deref().unwrap_or(""));
        Attempt {
            store,
            run,
            row,
            journal: Mutex::new(journal),
            closed: AtomicBool::new(false),
            root_fence: Fence::root(),
            deferred: Mutex::new(Vec::new()),
            batch: AtomicBool::new(false),
            batch_slot: Arc::new(Slot::default()),
            first,
            prior: Mutex::new(None),
            saved_state: AtomicBool::new(false),
            durable: AttemptState::default(),
            lease: Mutex::new(lease),
            trace,
            replay_names: Mutex::new((None, None)),
            claimed_span_mark: None,
            divergence: AtomicU8::new(CHECK_RAISE),
            diverged: Mutex::new(None),
            poisoned: AtomicBool::new(false),
            warnings: Mutex::new(Vec::new()),
            warned: AtomicBool::new(false),
            replay_only,
            replayed_steps: Default::default(),
            source: Mutex::new(None),
            forking: AtomicBool::new(false),
        }
    }

    /// A replay-only attempt at `run_id` (`composeai.testing.replay`): the
    /// run's row and journal as stored, no lease, and nothing it does is
    /// written. Divergences always raise.
    pub fn replay_only(store: Arc<dyn Store>, run_id: &str) -> CoreResult<Attempt> {
        let (run, journal) = store
            .read_journal(run_id)?
            .ok_or_else(|| CoreError::Config(format!("no run found with run_id '{run_id}'")))?;
        let row = RowSlot::stored(run.rid);
        Ok(Attempt::assemble(
            store, run, row, journal, false, None, true,
        ))
    }

    fn refuse_replay_only(&self) -> CoreResult<()> {
        if self.replay_only {
            return Err(CoreError::Config(format!(
                "run '{}' is being replayed: nothing can be written through a replay",
                self.run.run_id
            )));
        }
        Ok(())
    }

    /// The divergence that ended journal access, read without a lock
    /// while there is none (every journal access asks).
    fn poison(&self) -> Option<CoreError> {
        if !self.poisoned.load(Ordering::Relaxed) {
            return None;
        }
        self.diverged.lock().clone()
    }

    /// The divergence that ended this attempt's journal access, if any.
    pub fn divergence(&self) -> Option<CoreError> {
        self.diverged.lock().clone()
    }

    /// How many steps a replay-only attempt replayed.
    pub fn replayed_steps(&self) -> u64 {
        self.replayed_steps.load(Ordering::Relaxed)
    }

    /// How many journal rows the attempt holds (as loaded, for a
    /// replay-only attempt).
    pub fn journal_len(&self) -> usize {
        self.journal.lock().len()
    }

    /// Whether this attempt only replays (writes nothing).
    pub fn is_replay_only(&self) -> bool {
        self.replay_only
    }

    /// How a divergence is met: `"raise"` (the default) or `"warn"`.
    pub fn set_divergence(&self, mode: &str) -> CoreResult<()> {
        let mode = match mode {
            "raise" => CHECK_RAISE,
            "warn" => CHECK_WARN,
            other => {
                return Err(CoreError::Config(format!(
                    "on_divergence must be \"raise\" or \"warn\", got {other:?}"
                )))
            }
        };
        if !self.replay_only {
            self.divergence.store(mode, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Divergences met under `"warn"` since the last call.
    pub fn take_warnings(&self) -> Vec<CoreError> {
        if !self.warned.swap(false, Ordering::Relaxed) {
            return Vec::new();
        }
        std::mem::take(&mut *self.warnings.lock())
    }

    /// Whether there are warnings for `take_warnings`.
    pub fn has_warnings(&self) -> bool {
        self.warned.load(Ordering::Relaxed)
    }

    fn checks(&self) -> bool {
        self.divergence.load(Ordering::Relaxed) != CHECK_OFF
    }

    /// Meets a divergence as the attempt's mode says.
    fn diverge(&self, d: crate::journal::Divergence) -> CoreResult<()> {
        let err = CoreError::Nondeterminism {
            run_id: self.run.run_id.clone(),
            key: d.key,
            recorded: d.recorded,
            called: d.called,
        };
        if self.divergence.load(Ordering::Relaxed) == CHECK_WARN {
            self.divergence.store(CHECK_OFF, Ordering::Relaxed);
            self.warnings.lock().push(err);
            self.warned.store(true, Ordering::Relaxed);
            return Ok(());
        }
        let mut diverged = self.diverged.lock();
        let first = diverged.get_or_insert(err).clone();
        self.poisoned.store(true, Ordering::SeqCst);
        Err(first)
    }

    /// The body is done (it returned): a journaled call of the run's own
    /// scope that it no longer made is a divergence too.
    pub fn check_complete(&self) -> CoreResult<()> {
        if let Some(err) = self.poison() {
            return Err(err);
        }
        // A body that caught its deadline's error still fails (OPS-12).
        self.check_deadline(None)?;
        if !self.checks() || self.first || self.run.kind != "flow" {
            return Ok(());
        }
        let unreached = self.journal.lock().unreached();
        match unreached {
            Some(d) => self.diverge(d),
            None => Ok(()),
        }
    }

    /// The run's first attempt (a fresh run row).
    pub fn is_first(&self) -> bool {
        self.first
    }

    /// Where this attempt's spans begin in the store (see
    /// `Store::span_mark`): 0 for a first attempt, read with the claim of a
    /// resumed one where the store could, else now.
    pub fn span_mark(&self) -> CoreResult<Option<i64>> {
        if self.first {
            return Ok(self.store.reads_spans().then_some(0));
        }
        match self.claimed_span_mark {
            Some(mark) => Ok(Some(mark)),
            None => self.store.span_mark(),
        }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The run's rid. A queued row insert is committed first (with
    /// everything else queued) when the store's writer has not yet.
    pub fn rid(&self) -> CoreResult<i64> {
        if let Some(rid) = self.row.committed() {
            return rid;
        }
        self.store.flush()?;
        self.row.committed().unwrap_or_else(|| {
            Err(CoreError::Store(format!(
                "the row of run '{}' was not written",
                self.run.run_id
            )))
        })
    }

    pub fn root_fence(&self) -> &Fence {
        &self.root_fence
    }

    pub(crate) fn check(&self, fence: Option<&Fence>) -> CoreResult<()> {
        if let Some(err) = self.poison() {
            // Nothing more is journaled once the body diverged (issue 27).
            return Err(err);
        }
        if self.closed.load(Ordering::SeqCst) {
            return Err(CoreError::Revoked(format!(
                "the attempt of run '{}' has ended",
                self.run.run_id
            )));
        }
        if fence.is_some_and(|f| f.is_revoked()) {
            return Err(CoreError::Revoked("the stage was abandoned".into()));
        }
        if self.lease.lock().as_ref().is_some_and(|l| l.is_lost()) {
            return Err(crate::store::takeover::moved(&self.run.run_id));
        }
        Ok(())
    }

    /// Stores the agent loop's snapshot for `state.scope_key` durably.
    pub fn save_agent_state(&self, state: &AgentStateRow, fence: Option<&Fence>) -> CoreResult<()> {
        self.check(fence)?;
        if self.replay_only {
            return Err(CoreError::ReplayEnd(state.scope_key.clone()));
        }
        // An agent turn is a durable boundary for cancel requests (EXT-10)
        // and deadlines (OPS-12).
        self.check_cancel(false)?;
        self.check_deadline(fence)?;
        self.saved_state.store(true, Ordering::SeqCst);
        self.sync_point()?;
        self.store.save_agent_state(self.rid()?, state)
    }

    pub fn load_agent_state(&self, scope_key: &str) -> CoreResult<Option<AgentStateRow>> {
        if self.first && !self.saved_state.load(Ordering::SeqCst) {
            return Ok(None);
        }
        self.store.load_agent_state(self.rid()?, scope_key)
    }

    /// Spend of earlier attempts (all of them, or one step's), the baseline
    /// of a budget re-applied on resume (BUDGET-7).
    pub fn prior_llm_usage(&self, step_key: Option<&str>) -> CoreResult<(i64, f64)> {
        if self.first {
            return Ok((0, 0.0));
        }
        let spend = {
            let mut cached = self.prior.lock();
            match &*cached {
                Some(spend) => spend.clone(),
                None => {
                    // Read once per attempt: every budgeted step of a long
                    // run asks, and each answer needs the whole run.
                    let spend = Arc::new(self.store.prior_llm_usage(self.rid()?)?);
                    *cached = Some(spend.clone());
                    spend
                }
            }
        };
        Ok(match step_key {
            None => spend.total,
            Some(key) => spend.by_step.get(key).copied().unwrap_or((0, 0.0)),
        })
    }

    pub fn set_budget(&self, budget_json: &str) -> CoreResult<()> {
        self.check(None)?;
        self.refuse_replay_only()?;
        self.sync_point()?;
        self.store.set_budget(self.rid()?, budget_json)
    }

    pub fn record_answers(&self, answers: Vec<(String, String)>) -> CoreResult<()> {
        self.check(None)?;
        self.refuse_replay_only()?;
        self.sync_point()?;
        self.store.record_answers(self.rid()?, &answers)?;
        let mut j = self.journal.lock();
        for (id, value) in answers {
            j.record(&format!("__interrupt__:{id}"), Arc::from(value));
        }
        Ok(())
    }

    pub fn pending(&self) -> CoreResult<Vec<InterruptRow>> {
        self.store.pending(self.rid()?)
    }

    /// Ends the attempt by deleting the run and all it stored (a bare
    /// pipe/aggregate that paused: nothing could ever resume it).
    pub fn discard(&self) -> CoreResult<()> {
        if self.closed.swap(true, Ordering::SeqCst) || self.replay_only {
            return Ok(());
        }
        self.root_fence.revoke();
        self.lease.lock().take();
        active_runs().lock().remove(&self.run.run_id);
        self.store.flush()?;
        self.store.delete_run(self.rid()?)
    }

    /// Ends the attempt: persists the outcome and releases the lease. Every
    /// later journal access through this attempt is refused.
    pub fn settle(&self, settlement: Settlement) -> CoreResult<()> {
        self.finish(settlement, None)
    }

    /// `settle` with `work` in the same transaction (a graph run's last
    /// checkpoint).
    pub fn settle_with(&self, settlement: Settlement, work: &mut TxWork<'_>) -> CoreResult<()> {
        self.finish(settlement, Some(work))
    }

    /// Stores without extra work settle through `Store::settle`, which every
    /// store implements on its own.
    fn finish(&self, mut settlement: Settlement, work: Option<&mut TxWork<'_>>) -> CoreResult<()> {
        if self.closed.load(Ordering::SeqCst) {
            return Ok(());
        }
        if self.replay_only {
            self.closed.store(true, Ordering::SeqCst);
            return Ok(());
        }
        let diverged = self.diverged.lock().clone();
        if let Some(err) = &diverged {
            // A body that caught the divergence settles as failed by it
            // all the same: its run stays resumable once the code is back.
            if settlement.status != "failed" {
                let failed = Settlement {
                    status: "failed".into(),
                    output_json: None,
                    error_json: Some(error_json(err)),
                    pending: Vec::new(),
                    agent_states: Vec::new(),
                    wait: None,
                };
                self.finish(failed, work)?;
                return Err(err.clone());
            }
        }
        if settlement.status == "failed" && failed_by_store(settlement.error_json.as_deref()) {
            // The body stopped because the store failed under it (a step
            // could not be journaled): the run is left `running`, its lease
            // to lapse (or, in this process, to be resumed at once), so a
            // resume or a worker continues it once the store is back,
            // re-running at most the step in flight.
            self.closed.store(true, Ordering::SeqCst);
            self.root_fence.revoke();
            self.lease.lock().take();
            active_runs().lock().remove(&self.run.run_id);
            return Ok(());
        }
        // A lost batched step must not be settled over: the attempt fails
        // with the store's error and the run stays resumable.
        self.sync_point()?;
        self.batch_failure()?;
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        if settlement.status == "paused" && settlement.wait.is_none() {
            settlement.wait = self.durable.take_parked();
        }
        self.root_fence.revoke();
        let lost = self.lease.lock().take().is_some_and(|l| l.is_lost());
        active_runs().lock().remove(&self.run.run_id);
        if lost {
            return Err(crate::store::takeover::moved(&self.run.run_id));
        }
        match (work, self.row.committed()) {
            (_, Some(Err(e))) => Err(e),
            (Some(work), Some(Ok(rid))) => {
                self.store.settle_with(rid, owner_id(), &settlement, work)
            }
            (None, Some(Ok(rid))) => self.store.settle(rid, owner_id(), &settlement),
            // The row's insert commits together with the settlement.
            (None, None) => self.store.settle_row(&self.row, owner_id(), &settlement),
            (Some(work), None) => {
                let rid = self.rid()?;
                self.store.settle_with(rid, owner_id(), &settlement, work)
            }
        }
    }
}

/// Whether a failed settlement's error is the store's own failure
/// (`StoreError` or its `StoreUnavailableError`), as Python's `error_json`
/// records the exception type.
fn failed_by_store(error_json: Option<&str>) -> bool {
    let Some(json) = error_json else {
        return false;
    };
    serde_json::from_str::<serde_json::Value>(json).is_ok_and(|v| {
        matches!(
            v.get("type").and_then(|t| t.as_str()),
            Some("StoreError" | "StoreUnavailableError")
        )
    })
}

/// The stored error record of a core error, as Python's `error_json`
/// writes one.
fn error_json(err: &CoreError) -> String {
    let kind = match err {
        CoreError::Nondeterminism { .. } => "NondeterminismError",
        _ => "ComposeError",
    };
    serde_json::json!({"type": kind, "message": err.to_string()}).to_string()
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if !self.closed.load(Ordering::SeqCst) {
            active_runs().lock().remove(&self.run.run_id);
        }
    }
}

#[cfg(test)]
mod tests;
