//! Run lifecycle: creating runs, leasing an attempt to one process, and
//! settling it.

use crate::error::{CoreError, CoreResult};
use crate::journal::{Fence, Journal, StepKey};
use crate::store::sqlite::now;
use crate::store::sqlite::Slot;
use crate::store::{
    AgentStateRow, InterruptRow, NewRun, PriorSpend, RowSlot, RunRow, Settlement, SpanRecord,
    SpanRow, Store,
};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// This process's identity in lease rows: `host:pid:start-time:nonce`
/// (STORE-10). The nonce tells apart processes that share host name, pid
/// and start time (containers started together).
pub fn owner_id() -> &'static str {
    static OWNER: OnceLock<String> = OnceLock::new();
    OWNER.get_or_init(|| {
        let pid = std::process::id();
        format!(
            "{}:{}:{}:{}",
            hostname(),
            pid,
            process_start(pid).unwrap_or(0),
            crate::ids::new_ulid()
        )
    })
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates
    // within it or truncates.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The start time of a running process in clock ticks since boot (field 22
/// of /proc/<pid>/stat), which tells a live process from a reused pid.
/// `None` when there is no such process, or it has exited and only awaits
/// reaping (state `Z` or `X`).
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces; fields resume after ')'.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Whether the lease held by `holder` until `until` is still live: not
/// expired, and, when the holder is on this host, its process still
/// running (a crashed run on this machine resumes without waiting).
pub fn lease_is_live(holder: &str, until: f64) -> bool {
    let parts: Vec<&str> = holder.rsplitn(4, ':').collect();
    // `host:pid:start:nonce`, or `host:pid:start` from an older release.
    let ids = match parts[..] {
        [_nonce, start, pid, host] => Some((host, pid, start)),
        [start, pid, host] => Some((host, pid, start)),
        _ => None,
    };
    if let Some((host, pid, start)) = ids {
        if host == hostname() {
            if let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) {
                match process_start(pid) {
                    Some(s) if start == 0 || s == start => {}
                    _ => return false,
                }
            }
        }
    }
    until > now()
}

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
use crate::graph::store::GraphWork as TxWork;

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
    pub(crate) durable: crate::durable::AttemptState,
    /// Renewed by the heartbeat until the attempt ends.
    lease: Mutex<Option<crate::lease::Lease>>,
    /// The run's trace id, shared by the replayed spans it queues, and
    /// the last task name and parent span id they had (consecutive ones
    /// share them).
    trace: Arc<str>,
    replay_names: Mutex<ReplayNames>,
    /// Where this attempt's spans begin in the store, when its claim read it.
    claimed_span_mark: Option<i64>,
}

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
        Attempt::take(store, run_id, crate::lease::Takeover::Manual, answers)
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
            crate::lease::Takeover::Recover { max },
            answers,
        )
    }

    fn take(
        store: Arc<dyn Store>,
        run_id: &str,
        takeover: crate::lease::Takeover,
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
        let durable = crate::durable::AttemptState::default();
        let trace = Arc::from(run.trace_id.as_deref().unwrap_or(""));
        if first {
            // The run row was created just now, with no cancel request: the
            // first poll is due one interval later, as after any check.
            durable.cancel_checked_now();
        }
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
            durable,
            lease: Mutex::new(Some(lease)),
            trace,
            replay_names: Mutex::new((None, None)),
            claimed_span_mark: None,
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
            return Err(crate::lease::moved(&self.run.run_id));
        }
        Ok(())
    }

    /// Allocates the next key for `name` in `scope` and returns it with the
    /// journaled value, if any.
    pub fn reserve(
        &self,
        scope: &str,
        name: &str,
        fence: Option<&Fence>,
    ) -> CoreResult<(String, Option<Arc<str>>)> {
        self.check(fence)?;
        self.check_cancel(false)?;
        let mut j = self.journal.lock();
        let key = j.next_key(scope, name);
        let hit = j.get(&key);
        Ok((key, hit))
    }

    /// `reserve` with the key as its parts: a replayed step (the value
    /// found) allocates no key.
    pub fn reserve_step(
        &self,
        scope: &str,
        name: &str,
        fence: Option<&Fence>,
    ) -> CoreResult<(StepKey, Option<Arc<str>>)> {
        self.check(fence)?;
        self.check_cancel(false)?;
        Ok(self.journal.lock().next_step(scope, name))
    }

    pub(crate) fn journal_get(&self, key: &str) -> Option<Arc<str>> {
        self.journal.lock().get(key)
    }

    pub(crate) fn journal_record(&self, key: &str, value: Arc<str>) -> Arc<str> {
        self.journal.lock().record(key, value)
    }

    /// The module defining the run's flow, stored with a parked wait.
    pub fn set_module(&self, module: Option<String>) {
        self.durable.set_module(module);
    }

    /// Allocates a key without looking it up (scopes of `map`, `aggregate`).
    pub fn next_key(&self, scope: &str, name: &str, fence: Option<&Fence>) -> CoreResult<String> {
        self.check(fence)?;
        Ok(self.journal.lock().next_key(scope, name))
    }

    pub fn lookup(&self, key: &str, fence: Option<&Fence>) -> CoreResult<Option<Arc<str>>> {
        self.check(fence)?;
        Ok(self.journal.lock().get(key))
    }

    /// Switches this attempt to batch durability (refused by a store
    /// without it).
    pub fn set_batch(&self) -> CoreResult<()> {
        if !self.store.supports_batch() {
            return Err(CoreError::Config(format!(
                "composeai store '{}': durability 'batch' is not supported by this store yet -- \
                 use durability 'step' (the default)",
                self.store.path()
            )));
        }
        self.batch.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Whether a commit under `fence` is batched: only the unfenced steps
    /// of the flow body itself; a fenced write (a stage's thread, which may
    /// be abandoned) commits synchronously.
    pub fn batches(&self, fence: Option<&Fence>) -> bool {
        fence.is_none() && self.batch.load(Ordering::Relaxed)
    }

    /// The first failure of a batched write, which ends the attempt.
    fn batch_failure(&self) -> CoreResult<()> {
        // Checked per step: the outcome is copied only once it failed.
        if !self.batch_slot.failed() {
            return Ok(());
        }
        match self.batch_slot.outcome() {
            Some(Err(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// Before a synchronous write under batch durability on a server-backed
    /// store: the batched steps commit first (the journal never holds a
    /// later write without the earlier steps), and a lost one fails the
    /// write. A local store orders them in its writer queue already.
    pub(crate) fn sync_point(&self) -> CoreResult<()> {
        if self.batch.load(Ordering::Relaxed) && self.store.remote() {
            self.store.flush()?;
            self.batch_failure()?;
        }
        Ok(())
    }

    /// Journals `value` under `key` with its span, durably, and returns the
    /// stored value (an earlier write wins). Under batch durability an
    /// unfenced step is queued instead and durable within the store's batch
    /// latency, in order with every other write.
    pub fn commit(
        &self,
        key: &str,
        value: &str,
        span: Option<SpanRow>,
        fence: Option<&Fence>,
    ) -> CoreResult<Arc<str>> {
        self.check(fence)?;
        self.tap(span.as_ref());
        self.commit_checked(key, value, span, fence)
    }

    /// `commit` once checked, its span handed to the tap.
    fn commit_checked(
        &self,
        key: &str,
        value: &str,
        span: Option<SpanRow>,
        fence: Option<&Fence>,
    ) -> CoreResult<Arc<str>> {
        if let Some(existing) = self.journal.lock().get(key) {
            if let Some(s) = span {
                self.queue_tapped_span(s);
            }
            return Ok(existing);
        }
        if self.batches(fence) {
            self.batch_failure()?;
            let rid = self.rid()?;
            let stored = self.journal.lock().record(key, Arc::from(value));
            self.store
                .commit_batched_step(rid, key, value, span, &self.trace, &self.batch_slot)?;
            return Ok(stored);
        }
        self.sync_point()?;
        let rid = self.rid()?;
        let record = span.map(|s| self.record(rid, s, Some(value)));
        let winner = self.store.commit_step(rid, key, value, record)?;
        let stored: Arc<str> = Arc::from(winner.as_deref().unwrap_or(value));
        Ok(self.journal.lock().record(key, stored))
    }

    /// `commit` of an unfenced step under batch durability (`batches(None)`),
    /// its span borrowed from the caller.
    pub fn commit_batched_view(
        &self,
        key: &str,
        value: &str,
        span: crate::store::batched::SpanView<'_>,
    ) -> CoreResult<Arc<str>> {
        self.check(None)?;
        if crate::span_tap::on() {
            self.tap(Some(&span.to_row(value)));
        }
        if let Some(existing) = self.journal.lock().get(key) {
            self.queue_tapped_span(span.to_row(value));
            return Ok(existing);
        }
        self.batch_failure()?;
        let rid = self.rid()?;
        let stored = self.journal.lock().record(key, Arc::from(value));
        self.store.commit_batched_view(
            rid,
            key,
            value,
            Some(span),
            &self.trace,
            &self.batch_slot,
        )?;
        Ok(stored)
    }

    /// `commit` for an async driver: the stored value at once (a journal
    /// hit), or the store's commit as a future to await off the event loop,
    /// whose outcome `end_commit` records.
    pub fn begin_commit(
        &self,
        key: &str,
        value: &str,
        span: Option<SpanRow>,
        fence: Option<&Fence>,
    ) -> CoreResult<Commit> {
        self.check(fence)?;
        self.tap(span.as_ref());
        if let Some(existing) = self.journal.lock().get(key) {
            if let Some(s) = span {
                self.queue_tapped_span(s);
            }
            return Ok(Commit::Stored(existing));
        }
        if self.batches(fence) {
            // Queued without I/O: nothing to await.
            return self
                .commit_checked(key, value, span, fence)
                .map(Commit::Stored);
        }
        self.sync_point()?;
        let rid = self.rid()?;
        let record = span.map(|s| self.record(rid, s, Some(value)));
        Ok(Commit::Pending(self.store.commit_step_future(
            rid,
            key.to_string(),
            value.to_string(),
            record,
        )))
    }

    /// Records the outcome of a `begin_commit` future; returns the stored
    /// value.
    pub fn end_commit(&self, key: &str, value: &str, winner: Option<String>) -> Arc<str> {
        let stored: Arc<str> = Arc::from(winner.as_deref().unwrap_or(value));
        self.journal.lock().record(key, stored)
    }

    /// Journals `entries` (first write wins) and runs `work`, in one
    /// durable transaction: a graph step's node updates and its checkpoint
    /// (EXT-30). Queued spans are left to a later commit.
    pub fn commit_with(
        &self,
        entries: &[(String, String)],
        work: &mut TxWork<'_>,
    ) -> CoreResult<()> {
        self.check(None)?;
        self.sync_point()?;
        self.store.commit_with(self.rid()?, entries, work)?;
        let mut j = self.journal.lock();
        for (k, v) in entries {
            j.record(k, Arc::from(v.as_str()));
        }
        Ok(())
    }

    /// Journals `value` under `key` like `commit`, but lets a background
    /// commit make it durable: for steps whose value the flow body only sees
    /// after `sync` (the items of a `map`). Returns the stored value.
    pub fn commit_deferred(
        &self,
        key: &str,
        value: &str,
        span: Option<SpanRow>,
        fence: Option<&Fence>,
    ) -> CoreResult<Arc<str>> {
        self.check(fence)?;
        self.tap(span.as_ref());
        let stored = {
            let mut j = self.journal.lock();
            if let Some(existing) = j.get(key) {
                drop(j);
                if let Some(s) = span {
                    self.queue_tapped_span(s);
                }
                return Ok(existing);
            }
            j.record(key, Arc::from(value))
        };
        self.sync_point()?;
        let rid = self.rid()?;
        let record = span.map(|s| self.record(rid, s, Some(value)));
        let slot = self.store.commit_deferred(rid, key, value, record);
        self.deferred.lock().push(slot);
        Ok(stored)
    }

    /// Waits until every deferred journal write of this attempt is durable.
    pub fn sync(&self) -> CoreResult<()> {
        let slots = std::mem::take(&mut *self.deferred.lock());
        if slots.is_empty() {
            return Ok(());
        }
        self.store.flush()?;
        for slot in slots {
            match slot.outcome() {
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e),
                None => {
                    return Err(CoreError::Store(
                        "a deferred journal write was not applied".into(),
                    ))
                }
            }
        }
        Ok(())
    }

    fn record(&self, rid: i64, span: SpanRow, journal_value: Option<&str>) -> SpanRecord {
        SpanRecord::of_step(self.trace_id(), rid, span, journal_value)
    }

    pub fn trace_id(&self) -> &str {
        self.run.trace_id.as_deref().unwrap_or("")
    }

    /// Hands a finished span of this run to the span tap, if one is set.
    fn tap(&self, span: Option<&SpanRow>) {
        if let (true, Some(span)) = (crate::span_tap::on(), span) {
            crate::span_tap::emit(self.trace_id(), Some(&self.run.run_id), span);
        }
    }

    /// Queues a finished span of this run (written with the next commit).
    pub fn queue_span(&self, span: SpanRow) {
        self.tap(Some(&span));
        self.queue_tapped_span(span);
    }

    /// `queue_span` of a span already handed to the tap.
    fn queue_tapped_span(&self, span: SpanRow) {
        let in_journal = span
            .step_key
            .as_deref()
            .and_then(|k| self.journal.lock().get(k));
        let record = self.record(0, span, in_journal.as_deref());
        self.queue_record(record);
    }

    /// Queues a span of this run under its rid or, while the row's insert
    /// is queued, to be written after the row.
    fn queue_record(&self, mut record: SpanRecord) {
        match self.row.committed() {
            Some(Ok(rid)) => {
                record.rid = Some(rid);
                self.store.queue_span(record);
            }
            // A lost row has nothing to attach spans to; the attempt fails
            // where it settles.
            Some(Err(_)) => {}
            None => self.store.queue_row_span(&self.row, record),
        }
    }

    /// Queues the span of a step replayed from the journal: finished at
    /// `at`, status `ok`, its output the journaled value (stored by
    /// reference) when `with_output`.
    #[allow(clippy::too_many_arguments)]
    pub fn queue_replayed_span(
        &self,
        span_id: String,
        parent_span_id: Option<String>,
        kind: String,
        name: String,
        at: f64,
        step_key: String,
        with_output: bool,
    ) {
        if crate::span_tap::on() {
            self.tap_replayed(
                &span_id,
                parent_span_id.as_deref(),
                &kind,
                &name,
                at,
                &step_key,
                with_output,
            );
        }
        match (crate::ids::encode_id(&span_id), StepKey::parse(&step_key)) {
            (crate::ids::StoredId::Bytes(id), Some(key)) => self.queue_replayed_untapped(
                id,
                parent_span_id.as_deref(),
                kind.into(),
                &name,
                at,
                key,
                with_output,
            ),
            _ => {
                let span = SpanRow {
                    span_id,
                    parent_span_id,
                    kind,
                    name,
                    started_at: at,
                    ended_at: Some(at),
                    status: "ok".into(),
                    replayed: true,
                    step_key: Some(step_key),
                    ..Default::default()
                };
                self.queue_record(SpanRecord {
                    trace_id: self.trace_id().to_string(),
                    rid: None,
                    span,
                    output_in_journal: with_output,
                });
            }
        }
    }

    /// `queue_replayed_span` of a span id in its stored form.
    #[allow(clippy::too_many_arguments)]
    pub fn queue_replayed(
        &self,
        span_id: [u8; 16],
        parent_span_id: Option<&str>,
        kind: std::borrow::Cow<'static, str>,
        name: &str,
        at: f64,
        step_key: StepKey,
        with_output: bool,
    ) {
        if crate::span_tap::on() {
            self.tap_replayed(
                &ulid::Ulid::from_bytes(span_id).to_string(),
                parent_span_id,
                &kind,
                name,
                at,
                &step_key.to_string(),
                with_output,
            );
        }
        self.queue_replayed_untapped(
            span_id,
            parent_span_id,
            kind,
            name,
            at,
            step_key,
            with_output,
        );
    }

    /// The span row of a replayed step, handed to the tap: its output is
    /// the journaled value.
    #[allow(clippy::too_many_arguments)]
    fn tap_replayed(
        &self,
        span_id: &str,
        parent_span_id: Option<&str>,
        kind: &str,
        name: &str,
        at: f64,
        step_key: &str,
        with_output: bool,
    ) {
        let output_json = if with_output {
            self.journal.lock().get(step_key).map(|v| v.to_string())
        } else {
            None
        };
        let span = SpanRow {
            span_id: span_id.to_string(),
            parent_span_id: parent_span_id.map(str::to_string),
            kind: kind.to_string(),
            name: name.to_string(),
            started_at: at,
            ended_at: Some(at),
            status: "ok".into(),
            replayed: true,
            step_key: Some(step_key.to_string()),
            output_json,
            ..Default::default()
        };
        self.tap(Some(&span));
    }

    /// `queue_replayed` of a span already handed to the tap.
    #[allow(clippy::too_many_arguments)]
    fn queue_replayed_untapped(
        &self,
        span_id: [u8; 16],
        parent_span_id: Option<&str>,
        kind: std::borrow::Cow<'static, str>,
        name: &str,
        at: f64,
        step_key: StepKey,
        with_output: bool,
    ) {
        fn shared(last: &mut Option<Arc<str>>, text: &str) -> Arc<str> {
            match last {
                Some(s) if **s == *text => s.clone(),
                _ => last.insert(Arc::from(text)).clone(),
            }
        }
        let (name, parent_span_id) = {
            let mut last = self.replay_names.lock();
            let (names, parents) = &mut *last;
            (
                shared(names, name),
                parent_span_id.map(|p| shared(parents, p)),
            )
        };
        let span = crate::store::replayed::ReplayedSpan {
            trace_id: self.trace.clone(),
            rid: 0,
            span_id,
            parent_span_id,
            kind,
            name,
            at,
            step_key,
            output_in_journal: with_output,
        };
        match self.row.committed() {
            Some(Ok(rid)) => self
                .store
                .queue_replayed(crate::store::replayed::ReplayedSpan { rid, ..span }),
            Some(Err(_)) => {}
            None => {
                let mut record = span.into_record();
                record.rid = None;
                self.store.queue_row_span(&self.row, record);
            }
        }
    }

    /// Stores the agent loop's snapshot for `state.scope_key` durably.
    pub fn save_agent_state(&self, state: &AgentStateRow, fence: Option<&Fence>) -> CoreResult<()> {
        self.check(fence)?;
        // An agent turn is a durable boundary for cancel requests (EXT-10).
        self.check_cancel(false)?;
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
        self.sync_point()?;
        self.store.set_budget(self.rid()?, budget_json)
    }

    pub fn record_answers(&self, answers: Vec<(String, String)>) -> CoreResult<()> {
        self.check(None)?;
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
        if self.closed.swap(true, Ordering::SeqCst) {
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
            return Err(crate::lease::moved(&self.run.run_id));
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

impl Drop for Attempt {
    fn drop(&mut self) {
        if !self.closed.load(Ordering::SeqCst) {
            active_runs().lock().remove(&self.run.run_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::SqliteStore;

    fn temp_store() -> (tempdir::Dir, Arc<dyn Store>) {
        let dir = tempdir::Dir::new();
        let store = SqliteStore::open(&dir.path("runs.db")).unwrap();
        (dir, Arc::new(store))
    }

    use crate::test_dir as tempdir;

    fn new_run(name: &str) -> NewRun {
        NewRun {
            run_id: crate::ids::new_ulid(),
            trace_id: crate::ids::new_ulid(),
            kind: "flow".into(),
            name: name.into(),
            fingerprint: Some("f".into()),
            args_json: Some("{}".into()),
            budget_json: None,
        }
    }

    fn span(key: &str, out: &str) -> SpanRow {
        SpanRow {
            span_id: crate::ids::new_ulid(),
            kind: "task".into(),
            name: "t".into(),
            status: "ok".into(),
            step_key: Some(key.into()),
            output_json: Some(out.into()),
            ..Default::default()
        }
    }

    fn completed() -> Settlement {
        Settlement {
            status: "completed".into(),
            output_json: Some("1".into()),
            ..Default::default()
        }
    }

    /// `(rid, status, lease_owner)` of `run_id`, read by another connection.
    fn stored_row(path: &str, run_id: &str) -> Option<(i64, String, Option<String>)> {
        use rusqlite::OptionalExtension;
        rusqlite::Connection::open(path)
            .unwrap()
            .query_row(
                "SELECT rid, status, lease_owner FROM runs WHERE run_id = ?1",
                [run_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
            .unwrap()
    }

    fn spans_of(path: &str, rid: i64) -> i64 {
        rusqlite::Connection::open(path)
            .unwrap()
            .query_row("SELECT count(*) FROM spans WHERE rid = ?1", [rid], |r| {
                r.get(0)
            })
            .unwrap()
    }

    #[test]
    fn a_queued_run_row_commits_with_the_settlement_and_its_spans_carry_its_rid() {
        let dir = tempdir::Dir::new();
        let path = dir.path("runs.db");
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
        let a = Attempt::start_queued(store.clone(), new_run("agent")).unwrap();
        a.queue_span(span("llm#1", "1"));
        a.settle(completed()).unwrap();
        let (rid, status, owner) = stored_row(&path, &a.run.run_id).unwrap();
        assert_eq!((status.as_str(), owner), ("completed", None));
        assert_eq!(spans_of(&path, rid), 1);
    }

    #[test]
    fn the_writer_stores_a_queued_run_row_while_the_run_executes() {
        let dir = tempdir::Dir::new();
        let path = dir.path("runs.db");
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
        let a = Attempt::start_queued(store.clone(), new_run("agent")).unwrap();
        // Another process sees the row running and leased to this one,
        // with no commit by the attempt.
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let (rid, status, owner) = loop {
            if let Some(row) = stored_row(&path, &a.run.run_id) {
                break row;
            }
            assert!(
                std::time::Instant::now() < give_up,
                "the row was never written"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        assert_eq!(status, "running");
        assert_eq!(owner.as_deref(), Some(owner_id()));
        assert_eq!(a.rid().unwrap(), rid);
        a.queue_span(span("llm#1", "1"));
        a.settle(completed()).unwrap();
        assert_eq!(stored_row(&path, &a.run.run_id).unwrap().1, "completed");
        assert_eq!(spans_of(&path, rid), 1);
    }

    #[test]
    fn a_journal_write_of_a_queued_run_stores_the_row_first_and_a_resume_sees_both() {
        let (_dir, store) = temp_store();
        let a = Attempt::start_queued(store.clone(), new_run("agent")).unwrap();
        a.commit("t#1", "7", Some(span("t#1", "7")), None).unwrap();
        let run_id = a.run.run_id.clone();
        drop(a); // a crash: never settled
        let b = Attempt::resume(store.clone(), &run_id).unwrap();
        assert_eq!(b.lookup("t#1", None).unwrap().as_deref(), Some("7"));
        b.settle(completed()).unwrap();
    }

    #[test]
    fn a_queued_run_whose_id_exists_fails_where_it_settles_and_stores_nothing() {
        let dir = tempdir::Dir::new();
        let path = dir.path("runs.db");
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
        let new = new_run("agent");
        let first = Attempt::start(store.clone(), new.clone()).unwrap();
        first.settle(completed()).unwrap();
        let other = Attempt::start(store.clone(), new_run("f")).unwrap();
        let again = Attempt::start_queued(store.clone(), new.clone()).unwrap();
        again.queue_span(span("llm#1", "1"));
        other.queue_span(span("t#1", "1"));
        let err = again.settle(completed()).unwrap_err().to_string();
        assert!(err.contains("already exists"), "{err}");
        // The other run's queued span was written all the same.
        assert_eq!(spans_of(&path, other.rid().unwrap()), 1);
        assert_eq!(spans_of(&path, first.rid().unwrap()), 0);
        other.settle(completed()).unwrap();
    }

    #[test]
    fn the_writer_remembers_a_bounded_number_of_trace_ids() {
        let dir = tempdir::Dir::new();
        let path = dir.path("runs.db");
        let store = Arc::new(SqliteStore::open(&path).unwrap());
        let runs = 3000;
        for _ in 0..runs {
            let a = Attempt::start_queued(store.clone(), new_run("agent")).unwrap();
            a.queue_span(span("llm#1", "1"));
            a.settle(completed()).unwrap();
            assert!(store.cached_traces() <= 1024);
        }
        // Every span is still stored under its own run's trace, including
        // those of runs the writer no longer remembered.
        let stray: (i64, i64) = rusqlite::Connection::open(&path)
            .unwrap()
            .query_row(
                "SELECT (SELECT count(*) FROM spans WHERE rid IS NULL OR tid != -rid), \
                 (SELECT count(*) FROM traces)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(stray, (0, 0));
        let spans: i64 = rusqlite::Connection::open(&path)
            .unwrap()
            .query_row("SELECT count(*) FROM spans", [], |r| r.get(0))
            .unwrap();
        assert_eq!(spans, runs);
    }

    /// Queues the span of task step `t#1` replayed.
    fn queue_replayed_t1(a: &Attempt) {
        a.queue_replayed_span(
            crate::ids::new_ulid(),
            None,
            "task".into(),
            "t".into(),
            1.0,
            "t#1".into(),
            true,
        );
    }

    /// `(spans of run rid, those stored under -rid, rows of traces)`.
    fn own_trace(path: &str, rid: i64) -> (i64, i64, i64) {
        rusqlite::Connection::open(path)
            .unwrap()
            .query_row(
                "SELECT (SELECT count(*) FROM spans WHERE rid = ?1), \
                 (SELECT count(*) FROM spans WHERE rid = ?1 AND tid = -?1), \
                 (SELECT count(*) FROM traces)",
                [rid],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap()
    }

    #[test]
    fn a_run_stores_its_spans_under_minus_its_rid_on_every_write_path() {
        let dir = tempdir::Dir::new();
        let path = dir.path("runs.db");
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
        // A row with a commit of its own: a step's span, a queued span, a
        // replayed step's span, a batched step's span.
        let a = Attempt::start(store.clone(), new_run("f")).unwrap();
        a.commit("t#1", "1", Some(span("t#1", "1")), None).unwrap();
        a.queue_span(span("t#1", "1"));
        queue_replayed_t1(&a);
        a.set_batch().unwrap();
        a.commit("t#2", "2", Some(span("t#2", "2")), None).unwrap();
        a.settle(completed()).unwrap();
        // A queued row, its span in the same commit.
        let q = Attempt::start_queued(store.clone(), new_run("agent")).unwrap();
        q.queue_span(span("llm#1", "1"));
        q.settle(completed()).unwrap();
        // A run resumed by another process, whose writer never saw it created.
        let c = Attempt::start(store.clone(), new_run("f")).unwrap();
        c.commit("t#1", "1", Some(span("t#1", "1")), None).unwrap();
        let run_id = c.run.run_id.clone();
        drop(c);
        let later: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
        let c = Attempt::resume(later.clone(), &run_id).unwrap();
        c.commit("t#2", "2", Some(span("t#2", "2")), None).unwrap();
        c.settle(completed()).unwrap();
        store.flush().unwrap();
        later.flush().unwrap();
        assert_eq!(own_trace(&path, a.rid().unwrap()), (4, 4, 0));
        assert_eq!(own_trace(&path, q.rid().unwrap()), (1, 1, 0));
        assert_eq!(own_trace(&path, c.rid().unwrap()), (2, 2, 0));
    }

    #[test]
    fn runs_given_one_trace_id_each_keep_their_spans_under_their_own_rid() {
        let dir = tempdir::Dir::new();
        let path = dir.path("runs.db");
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
        let first = new_run("f");
        let second = NewRun {
            trace_id: first.trace_id.clone(),
            ..new_run("g")
        };
        let a = Attempt::start(store.clone(), first).unwrap();
        let b = Attempt::start(store.clone(), second).unwrap();
        for i in 1..=3 {
            let key = format!("t#{i}");
            a.commit(&key, "1", Some(span(&key, "1")), None).unwrap();
            b.commit(&key, "2", Some(span(&key, "2")), None).unwrap();
        }
        // Replayed spans of both, queued side by side: one batch of inserts.
        for attempt in [&a, &b, &a, &b] {
            queue_replayed_t1(attempt);
        }
        a.settle(completed()).unwrap();
        b.settle(completed()).unwrap();
        store.flush().unwrap();
        assert_eq!(own_trace(&path, a.rid().unwrap()), (5, 5, 0));
        assert_eq!(own_trace(&path, b.rid().unwrap()), (5, 5, 0));
    }

    #[test]
    fn queued_spans_never_outgrow_the_backlog_bound() {
        let dir = tempdir::Dir::new();
        let store = Arc::new(SqliteStore::open(&dir.path("runs.db")).unwrap());
        let a = Attempt::start(store.clone(), new_run("f")).unwrap();
        let limit = crate::store::sqlite::MAX_BACKLOG;
        for i in 0..3 * limit {
            a.queue_span(span(&format!("t#{i}"), "1"));
            assert!(store.queued() < limit);
        }
        store.flush().unwrap();
        let n: i64 = rusqlite::Connection::open(dir.path("runs.db"))
            .unwrap()
            .query_row("SELECT count(*) FROM spans", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 3 * limit as i64);
    }

    #[test]
    fn steps_replay_in_a_later_attempt() {
        let (_d, store) = temp_store();
        let a = Attempt::start(store.clone(), new_run("f")).unwrap();
        let run_id = a.run.run_id.clone();
        let (k1, hit) = a.reserve("", "t", None).unwrap();
        assert_eq!((k1.as_str(), hit), ("t#1", None));
        assert_eq!(
            &*a.commit(&k1, "10", Some(span(&k1, "10")), None).unwrap(),
            "10"
        );
        let (k2, _) = a.reserve("", "t", None).unwrap();
        a.commit(&k2, "20", None, None).unwrap();
        a.settle(Settlement {
            status: "paused".into(),
            output_json: None,
            error_json: None,
            ..Default::default()
        })
        .unwrap();

        let b = Attempt::resume(store.clone(), &run_id).unwrap();
        assert_eq!(b.reserve("", "t", None).unwrap().1.as_deref(), Some("10"));
        assert_eq!(b.reserve("", "t", None).unwrap().1.as_deref(), Some("20"));
        assert_eq!(b.reserve("", "t", None).unwrap().1, None);
    }

    #[test]
    fn a_resume_journals_its_answers_and_reads_its_span_mark_with_the_claim() {
        let dir = tempdir::Dir::new();
        let path = dir.path("runs.db");
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
        let a = Attempt::start(store.clone(), new_run("f")).unwrap();
        let run_id = a.run.run_id.clone();
        let rid = a.rid().unwrap();
        a.commit("t#1", "1", Some(span("t#1", "1")), None).unwrap();
        let pending = |id: &str| InterruptRow {
            interrupt_id: id.into(),
            kind: "approve".into(),
            question: None,
            payload_json: None,
        };
        a.settle(Settlement {
            status: "paused".into(),
            pending: vec![pending("go"), pending("later")],
            ..Default::default()
        })
        .unwrap();
        let mark: i64 = rusqlite::Connection::open(&path)
            .unwrap()
            .query_row("SELECT max(sid) FROM spans", [], |r| r.get(0))
            .unwrap();

        let answers = [("go".to_string(), "true".to_string())];
        let b = Attempt::resume_answering(store.clone(), &run_id, &answers).unwrap();
        // In the attempt's journal and in the store, committed by the claim.
        assert_eq!(
            b.lookup("__interrupt__:go", None).unwrap().as_deref(),
            Some("true")
        );
        let db = rusqlite::Connection::open(&path).unwrap();
        let stored: String = db
            .query_row(
                "SELECT value_json FROM journal WHERE rid = ?1 AND step_key = '__interrupt__:go'",
                [rid],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(stored, "true");
        let left: Vec<String> = db
            .prepare("SELECT interrupt_id FROM pending_interrupts WHERE rid = ?1")
            .unwrap()
            .query_map([rid], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(left, ["later"]);
        assert_eq!(b.span_mark().unwrap(), Some(mark));
        // A later answer to the same interrupt does not replace it.
        b.settle(Settlement {
            status: "paused".into(),
            ..Default::default()
        })
        .unwrap();
        let again = [("go".to_string(), "false".to_string())];
        let c = Attempt::resume_answering(store.clone(), &run_id, &again).unwrap();
        assert_eq!(
            c.lookup("__interrupt__:go", None).unwrap().as_deref(),
            Some("true")
        );
        c.settle(completed()).unwrap();
    }

    #[test]
    fn first_write_wins_in_the_store() {
        let (_d, store) = temp_store();
        let a = Attempt::start(store.clone(), new_run("f")).unwrap();
        a.commit("k#1", "1", None, None).unwrap();
        assert_eq!(&*a.commit("k#1", "2", None, None).unwrap(), "1");
        assert_eq!(
            store.journal(a.run.rid).unwrap(),
            vec![("k#1".into(), "1".into())]
        );
    }

    #[test]
    fn a_second_attempt_in_the_same_process_is_refused() {
        let (_d, store) = temp_store();
        let a = Attempt::start(store.clone(), new_run("f")).unwrap();
        let err = Attempt::resume(store.clone(), &a.run.run_id).err().unwrap();
        assert!(err.to_string().contains("already being executed"), "{err}");
    }

    #[test]
    fn a_live_lease_of_another_process_is_refused_and_a_dead_one_taken_over() {
        let (_d, store) = temp_store();
        let a = Attempt::start(store.clone(), new_run("f")).unwrap();
        let run_id = a.run.run_id.clone();
        drop(a);
        let live = |_: &str, _: f64| true;
        let dead = |_: &str, _: f64| false;
        let manual = crate::lease::Takeover::Manual;
        store
            .acquire(&run_id, "otherhost:1:1:n", now() + 60.0, &dead, manual)
            .unwrap();
        let err = store
            .acquire(&run_id, owner_id(), now() + 60.0, &live, manual)
            .err()
            .unwrap();
        assert!(err.to_string().contains("otherhost:1:1:n"), "{err}");
        store
            .acquire(&run_id, owner_id(), now() + 60.0, &dead, manual)
            .unwrap();
    }

    #[test]
    fn settled_attempts_refuse_writes_and_revoked_fences_too() {
        let (_d, store) = temp_store();
        let a = Attempt::start(store.clone(), new_run("f")).unwrap();
        let f = a.root_fence().child();
        f.revoke();
        assert!(matches!(
            a.reserve("", "t", Some(&f)),
            Err(CoreError::Revoked(_))
        ));
        assert!(a.reserve("", "t", None).is_ok());
        a.settle(Settlement {
            status: "completed".into(),
            output_json: Some("1".into()),
            error_json: None,
            ..Default::default()
        })
        .unwrap();
        assert!(matches!(
            a.commit("t#9", "1", None, None),
            Err(CoreError::Revoked(_))
        ));
    }

    /// STORE-10: a lease is dead once expired, or at once when its holder
    /// is a process of this host that is gone.
    #[test]
    fn leases_die_by_expiry_or_with_their_process_on_this_host() {
        assert_eq!(owner_id().split(':').count(), 4);
        assert!(lease_is_live(owner_id(), now() + 100.0));
        assert!(!lease_is_live(owner_id(), now() - 1.0));
        let host = hostname();
        assert!(!lease_is_live(
            &format!("{host}:4000000000:5:n"),
            now() + 100.0
        ));
        assert!(lease_is_live("elsewhere:1:1:n", now() + 100.0));
        assert!(!lease_is_live("elsewhere:1:1:n", now() - 1.0));
    }

    /// STORE-12: worker takeovers from a dead holder count; past the limit
    /// the run is failed instead, and a manual resume still works.
    #[test]
    fn recoveries_past_the_limit_fail_the_run_and_a_manual_resume_works() {
        use crate::lease::Takeover;
        let (_d, store) = temp_store();
        let a = Attempt::start(store.clone(), new_run("f")).unwrap();
        let run_id = a.run.run_id.clone();
        drop(a);
        let dead = |_: &str, _: f64| false;
        let recover = Takeover::Recover { max: 2 };
        for i in 0..2 {
            let holder = format!("gone:{i}:1:n");
            store
                .acquire(&run_id, &holder, now() + 60.0, &dead, recover)
                .unwrap();
        }
        let err = store
            .acquire(&run_id, owner_id(), now() + 60.0, &dead, recover)
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("recovery attempts exhausted"),
            "{err}"
        );
        let row = store.get_run(&run_id).unwrap().unwrap();
        assert_eq!(row.status, "failed");
        assert!(row
            .error_json
            .unwrap()
            .contains("recovery attempts exhausted"));
        let b = Attempt::resume(store.clone(), &run_id).unwrap();
        b.settle(Settlement {
            status: "completed".into(),
            output_json: Some("1".into()),
            ..Default::default()
        })
        .unwrap();
        // Settling starts the count again.
        store
            .acquire(&run_id, "gone:9:1:n", now() + 60.0, &dead, recover)
            .unwrap();
        store
            .acquire(&run_id, owner_id(), now() + 60.0, &dead, recover)
            .unwrap();
    }

    /// STORE-11: the heartbeat renews only leases this process holds; a run
    /// taken over is reported lost and its attempt stops with the error.
    #[test]
    fn a_taken_over_attempt_is_lost_at_its_next_renewal() {
        let (_d, store) = temp_store();
        let a = Attempt::start(store.clone(), new_run("f")).unwrap();
        assert_eq!(
            store
                .renew_leases(owner_id(), now() + 60.0, &[a.run.rid, 999])
                .unwrap(),
            vec![a.run.rid]
        );
        let dead = |_: &str, _: f64| false;
        store
            .acquire(
                &a.run.run_id,
                "other:1:1:n",
                now() + 60.0,
                &dead,
                crate::lease::Takeover::Manual,
            )
            .unwrap();
        assert!(store
            .renew_leases(owner_id(), now() + 60.0, &[a.run.rid])
            .unwrap()
            .is_empty());
        let err = a.commit("t#1", "1", None, None).unwrap_err();
        assert!(err.to_string().contains("moved to another owner"), "{err}");
        assert!(store.journal(a.run.rid).unwrap().is_empty());
    }

    /// STORE-11: once the run moved on (and even after the new owner
    /// settled it), the old attempt journals, settles and traces nothing.
    #[test]
    fn an_attempt_taken_over_stores_nothing_even_after_the_run_settled() {
        let dir = tempdir::Dir::new();
        let path = dir.path("runs.db");
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
        let a = Attempt::start(store.clone(), new_run("f")).unwrap();
        let dead = |_: &str, _: f64| false;
        let other = "other:1:1:n";
        store
            .acquire(
                &a.run.run_id,
                other,
                now() + 60.0,
                &dead,
                crate::lease::Takeover::Manual,
            )
            .unwrap();
        let done = Settlement {
            status: "completed".into(),
            output_json: Some("1".into()),
            ..Default::default()
        };
        store.settle(a.run.rid, other, &done).unwrap();
        a.queue_span(span("t#1", "2"));
        store.flush().unwrap();
        assert_eq!(span_count(&path), 0);
        let err = a.commit("t#1", "2", None, None).unwrap_err();
        assert!(err.to_string().contains("moved to another owner"), "{err}");
        let err = a
            .settle(Settlement {
                status: "failed".into(),
                ..Default::default()
            })
            .unwrap_err();
        assert!(err.to_string().contains("moved to another owner"), "{err}");
        let row = store.get_run(&a.run.run_id).unwrap().unwrap();
        assert_eq!(
            (row.status.as_str(), row.output_json.as_deref()),
            ("completed", Some("1"))
        );
        assert!(store.journal(a.run.rid).unwrap().is_empty());
    }

    #[test]
    fn deferred_commits_are_durable_after_sync() {
        let (_d, store) = temp_store();
        let a = Attempt::start(store.clone(), new_run("f")).unwrap();
        for i in 0..500 {
            let key = format!("map#1[{i}]/t#1");
            let stored = a.commit_deferred(&key, &i.to_string(), Some(span(&key, "x")), None);
            assert_eq!(&*stored.unwrap(), i.to_string());
        }
        assert_eq!(
            &*a.commit_deferred("map#1[0]/t#1", "9", None, None).unwrap(),
            "0"
        );
        a.sync().unwrap();
        assert_eq!(store.journal(a.run.rid).unwrap().len(), 500);
    }

    fn span_count(path: &str) -> i64 {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.query_row("SELECT count(*) FROM spans", [], |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn queued_spans_reach_the_store_without_a_commit() {
        let dir = tempdir::Dir::new();
        let path = dir.path("runs.db");
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
        let a = Attempt::start(store.clone(), new_run("f")).unwrap();
        a.queue_span(span("x#1", "1"));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while span_count(&path) == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(span_count(&path), 1);
    }

    #[test]
    fn discard_deletes_the_run_and_everything_it_stored() {
        let dir = tempdir::Dir::new();
        let path = dir.path("runs.db");
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
        let a = Attempt::start(store.clone(), new_run("p")).unwrap();
        a.commit("t#1", "1", Some(span("t#1", "1")), None).unwrap();
        a.save_agent_state(
            &AgentStateRow {
                scope_key: String::new(),
                messages_json: "[]".into(),
                partial_results_json: None,
                turn: 1,
            },
            None,
        )
        .unwrap();
        let run_id = a.run.run_id.clone();
        a.discard().unwrap();
        assert!(store.get_run(&run_id).unwrap().is_none());
        assert_eq!(span_count(&path), 0);
        assert!(store.journal(a.run.rid).unwrap().is_empty());
        assert!(store.load_agent_state(a.run.rid, "").unwrap().is_none());
    }

    /// AGENT-53: a first attempt reads only snapshots it stored itself
    /// (none exist before it), a later attempt reads the store.
    #[test]
    fn agent_snapshots_load_in_the_attempt_that_saved_them_and_after_resume() {
        let (_d, store) = temp_store();
        let a = Attempt::start(store.clone(), new_run("agent")).unwrap();
        assert!(a.load_agent_state("").unwrap().is_none());
        let row = AgentStateRow {
            scope_key: String::new(),
            messages_json: "[1]".into(),
            partial_results_json: None,
            turn: 2,
        };
        a.save_agent_state(&row, None).unwrap();
        assert_eq!(a.load_agent_state("").unwrap().unwrap().turn, 2);
        let run_id = a.run.run_id.clone();
        a.settle(Settlement {
            status: "paused".into(),
            ..Default::default()
        })
        .unwrap();
        drop(a);
        let b = Attempt::resume(store, &run_id).unwrap();
        let loaded = b.load_agent_state("").unwrap().unwrap();
        assert_eq!((loaded.messages_json.as_str(), loaded.turn), ("[1]", 2));
    }

    #[test]
    fn prior_llm_usage_sums_the_run_or_one_steps_agent_spans() {
        use crate::store::UsageRow;
        let (_d, store) = temp_store();
        let a = Attempt::start(store.clone(), new_run("f")).unwrap();
        let agent = |key: &str| SpanRow {
            span_id: crate::ids::new_ulid(),
            kind: "agent".into(),
            name: "writer".into(),
            status: "ok".into(),
            step_key: Some(key.into()),
            ..Default::default()
        };
        let llm = |parent: &SpanRow, tokens: i64, usd: f64| SpanRow {
            span_id: crate::ids::new_ulid(),
            parent_span_id: Some(parent.span_id.clone()),
            kind: "llm".into(),
            name: "m".into(),
            status: "ok".into(),
            usage: Some(UsageRow {
                input_tokens: tokens,
                output_tokens: 0,
                cost_usd: Some(usd),
                cost_complete: true,
                ..Default::default()
            }),
            ..Default::default()
        };
        let (w1, w2) = (agent("writer#1"), agent("writer#2"));
        a.queue_span(llm(&w1, 10, 0.5));
        a.queue_span(llm(&w2, 7, 0.25));
        a.queue_span(w1);
        a.queue_span(w2);
        assert_eq!(
            a.prior_llm_usage(None).unwrap(),
            (0, 0.0),
            "a first attempt has no past"
        );
        a.settle(Settlement {
            status: "paused".into(),
            ..Default::default()
        })
        .unwrap();
        let b = Attempt::resume(store.clone(), &a.run.run_id).unwrap();
        assert_eq!(b.prior_llm_usage(None).unwrap(), (17, 0.75));
        assert_eq!(b.prior_llm_usage(Some("writer#2")).unwrap(), (7, 0.25));
        assert_eq!(b.prior_llm_usage(Some("writer#9")).unwrap(), (0, 0.0));
    }

    #[test]
    fn batched_steps_are_handed_back_at_once_and_committed_by_the_writer_in_order() {
        let (_d, store) = temp_store();
        let a = Attempt::start(store.clone(), new_run("f")).unwrap();
        a.set_batch().unwrap();
        assert!(a.batches(None) && !a.batches(Some(&a.root_fence().child())));
        for i in 1..=300 {
            let key = format!("t#{i}");
            let stored = a.commit(&key, &i.to_string(), Some(span(&key, "x")), None);
            assert_eq!(&*stored.unwrap(), i.to_string());
        }
        // The writer commits on its own, within its latency; a read of the
        // journal by this process commits whatever is still pending first.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut count = 0;
        while std::time::Instant::now() < deadline {
            let conn = rusqlite::Connection::open(store.path()).unwrap();
            count = conn
                .query_row("SELECT count(*) FROM journal", [], |r| r.get::<_, i64>(0))
                .unwrap();
            if count == 300 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(count, 300);
        let journal = store.journal(a.run.rid).unwrap();
        assert_eq!(journal.len(), 300);
    }

    #[test]
    fn a_lost_batch_poisons_later_steps_and_the_settlement() {
        let dir = tempdir::Dir::new();
        let path = dir.path("runs.db");
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
        let a = Attempt::start(store.clone(), new_run("f")).unwrap();
        a.set_batch().unwrap();
        a.commit("t#1", "1", None, None).unwrap();
        store.flush().unwrap();
        // Another connection renames the table the journal goes to.
        let other = rusqlite::Connection::open(&path).unwrap();
        other
            .execute_batch("ALTER TABLE journal RENAME TO journal_away")
            .unwrap();
        a.commit("t#2", "2", None, None).unwrap();
        // Fails here or in the background writer: either way the slot
        // holds the failure once the flush returns.
        let _ = store.flush();
        other
            .execute_batch("ALTER TABLE journal_away RENAME TO journal")
            .unwrap();
        assert!(a.commit("t#3", "3", None, None).is_err());
        let settled = a.settle(Settlement {
            status: "completed".into(),
            ..Default::default()
        });
        assert!(settled.is_err(), "a run with a lost step is not settled");
        store.flush().unwrap();
        assert_eq!(
            store.journal(a.run.rid).unwrap(),
            vec![("t#1".into(), "1".into())],
            "nothing after the lost step was stored"
        );
    }

    #[test]
    fn a_failed_span_write_is_recorded_once_for_a_warning() {
        let dir = tempdir::Dir::new();
        let path = dir.path("runs.db");
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
        let a = Attempt::start(store.clone(), new_run("f")).unwrap();
        crate::store::sqlite::take_span_write_error();
        // Another connection drops the table the span goes to.
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch("DROP TABLE spans")
            .unwrap();
        a.queue_span(span("t#1", "1"));
        assert!(store.flush().is_err());
        let recorded = crate::store::sqlite::take_span_write_error();
        assert!(recorded.is_some_and(|m| m.contains("spans")));
        assert!(crate::store::sqlite::take_span_write_error().is_none());
    }
}
