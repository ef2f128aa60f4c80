//! An attempt's journal: step keys, replay lookups, and the writes that
//! make a step's value durable (in place, deferred, batched, or as a
//! future an async driver awaits).

use super::{Attempt, Commit, TxWork};
use crate::error::{CoreError, CoreResult};
use crate::journal::{Call, Fence, ForkSource, Journal, Patch, StepKey};

/// The journal key a fork keeps its origin under (issue 27).
pub use crate::store::published::FORK_KEY;

/// The start of the journal keys an upgrade to other code keeps (OPS-3).
const UPGRADE_KEY: &str = "__upgrade__";
use crate::store::SpanRow;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Attempt {
    /// Allocates the next key for `name` in `scope` and returns it with the
    /// journaled value, if any. With `call`, the step is a journaled call
    /// of the body: it takes its scope's next position and its identity is
    /// checked against the journal's (issue 27).
    pub fn reserve(
        &self,
        scope: &str,
        name: &str,
        call: Option<Call<'_>>,
        fence: Option<&Fence>,
    ) -> CoreResult<(String, Option<Arc<str>>)> {
        let (key, hit) = self.reserve_step(scope, name, call, fence)?;
        Ok((key.to_string(), hit))
    }

    /// `reserve` with the key as its parts: a replayed step (the value
    /// found) allocates no key.
    pub fn reserve_step(
        &self,
        scope: &str,
        name: &str,
        call: Option<Call<'_>>,
        fence: Option<&Fence>,
    ) -> CoreResult<(StepKey, Option<Arc<str>>)> {
        self.check(fence)?;
        self.check_cancel(false)?;
        let (key, hit, diverged) = self
            .journal
            .lock()
            .next_call(scope, name, call, self.checks());
        if let Some(d) = diverged {
            self.diverge(d)?;
        }
        if hit.is_some() {
            if self.replay_only {
                self.replayed_steps.fetch_add(1, Ordering::Relaxed);
            }
            if self.forking.load(Ordering::Relaxed) {
                // Journaled by an earlier attempt of the fork: nothing to
                // borrow, but it may be the fork key.
                self.borrow_source(&key.to_string());
            }
            return Ok((key, hit));
        }
        let borrowed = self.borrow(&key, fence)?;
        if borrowed.is_none() && self.replay_only && call.is_some() {
            return Err(CoreError::ReplayEnd(key.to_string()));
        }
        Ok((key, borrowed))
    }

    /// Allocates the key of a `map` or `aggregate` (`call`: its kind, and
    /// its number of items or a hash of its branches' names), a call that
    /// takes its scope's next position and journals no row of its own: its
    /// items' and branches' rows name it. Checked against the journal like
    /// any call, so a body that now maps over other items or aggregates
    /// other branches stops here, before any of them runs.
    pub fn open_scope(
        &self,
        scope: &str,
        name: &str,
        call: Call<'_>,
        fence: Option<&Fence>,
    ) -> CoreResult<String> {
        self.check(fence)?;
        let (key, _, diverged) =
            self.journal
                .lock()
                .next_call(scope, name, Some(call), self.checks());
        if let Some(d) = diverged {
            self.diverge(d)?;
        }
        Ok(key.to_string())
    }

    /// `compose.patched(patch_id)` (or, with `deprecate`,
    /// `compose.deprecate_patch`) in `scope` (OPS-2): whether the body
    /// takes the patched branch. A marker journaled at this position by an
    /// earlier attempt answers true; another row there, or a journal that
    /// ends before it in a run started on other code (`new_code` false),
    /// answers false and journals nothing. Past the journal of a run
    /// started on this code (`same_code`: its fingerprint is the code's, and
    /// it was not upgraded to it), the marker is journaled (a fork borrows its
    /// source's marker, or answers false before its `at` key without one).
    pub fn patched(
        &self,
        scope: &str,
        patch_id: &str,
        same_code: bool,
        deprecate: bool,
        fence: Option<&Fence>,
    ) -> CoreResult<bool> {
        self.check(fence)?;
        self.check_cancel(false)?;
        let forking = self.forking.load(Ordering::Relaxed);
        let digest = crate::journal::digest(patch_id);
        let outcome = {
            let mut journal = self.journal.lock();
            // A run upgraded to this code (OPS-3) was started on other code.
            let new_code = same_code && !journal.has_key_prefix(UPGRADE_KEY);
            journal.patch(scope, digest, new_code || forking, deprecate)
        };
        let key = match outcome {
            Patch::Marked => {
                if self.replay_only {
                    self.replayed_steps.fetch_add(1, Ordering::Relaxed);
                }
                return Ok(true);
            }
            Patch::Absent => return Ok(false),
            Patch::New(key) => key.to_string(),
        };
        let value = serde_json::Value::from(patch_id).to_string();
        if forking {
            match self.borrow_source(&key) {
                Some(v) if *v == *value => {}
                _ if self.forking.load(Ordering::Relaxed) => {
                    // Before the fork's `at`: the source took the old branch.
                    self.journal.lock().unpatch(scope);
                    return Ok(false);
                }
                _ if !same_code => {
                    self.journal.lock().unpatch(scope);
                    return Ok(false);
                }
                _ => {}
            }
        }
        if self.replay_only {
            return Ok(true);
        }
        self.commit_checked(&key, &value, None, fence)?;
        Ok(true)
    }

    /// A fork's step before its `at` key: the source run's value, journaled
    /// in the fork as its own (with this call's identity) and replayed.
    fn borrow(&self, key: &StepKey, fence: Option<&Fence>) -> CoreResult<Option<Arc<str>>> {
        if !self.forking.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let text = key.to_string();
        let Some(value) = self.borrow_source(&text) else {
            return Ok(None);
        };
        self.commit_checked(&text, &value, None, fence).map(Some)
    }

    /// The source's value for step `key` of a fork, when the fork borrows
    /// it; reaching the fork key ends the borrowing.
    fn borrow_source(&self, key: &str) -> Option<Arc<str>> {
        let mut source = self.source.lock();
        let s = source.as_mut()?;
        if key == s.at {
            // Reached (executed now, or journaled by an earlier attempt):
            // everything from here on is the fork's own.
            *source = None;
            self.forking.store(false, Ordering::Relaxed);
            return None;
        }
        // A step enclosing `at` (a nested flow) executes, so `at` is reached.
        if s.at.len() > key.len() && s.at.starts_with(key) && s.at.as_bytes()[key.len()] == b'/' {
            return None;
        }
        s.journal.get(key)
    }

    /// Makes this run a fork of run `from` (its journal `journal`) that
    /// executes from `at` on. The fork's origin is journaled first (under
    /// `FORK_KEY`), so an attempt that resumes the fork after a crash
    /// borrows the steps not yet borrowed (`reattach_fork`).
    pub fn set_source(&self, from: &str, journal: Journal, at: String) -> CoreResult<()> {
        self.check(None)?;
        let origin = serde_json::json!({"run_id": from, "at": at}).to_string();
        self.commit_checked(FORK_KEY, &origin, None, None)?;
        *self.source.lock() = Some(ForkSource { journal, at });
        self.forking.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// On a resumed attempt of a fork whose key `at` is not journaled yet:
    /// its source again, to borrow from.
    pub(super) fn reattach_fork(&self) -> CoreResult<()> {
        let Some(origin) = self.journal_get(FORK_KEY) else {
            return Ok(());
        };
        let origin: serde_json::Value = serde_json::from_str(&origin)
            .map_err(|e| CoreError::Serialization(format!("journal key '{FORK_KEY}': {e}")))?;
        let (Some(from), Some(at)) = (origin["run_id"].as_str(), origin["at"].as_str()) else {
            return Err(CoreError::Serialization(format!(
                "journal key '{FORK_KEY}' does not name the run forked and its key"
            )));
        };
        if self.journal_get(at).is_some() {
            return Ok(());
        }
        let Some((_, journal)) = self.store.read_journal(from)? else {
            return Err(CoreError::Config(format!(
                "run '{}' is a fork of run '{from}', which is gone: its steps before '{at}' \
                 can no longer be borrowed",
                self.run.run_id
            )));
        };
        *self.source.lock() = Some(ForkSource {
            journal,
            at: at.to_string(),
        });
        self.forking.store(true, Ordering::Relaxed);
        Ok(())
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
        if let Some(hit) = self.journal.lock().get(key) {
            return Ok(Some(hit));
        }
        // A fork keeps the answers its source was given before `at`.
        let borrowed = match self.source.lock().as_ref() {
            Some(s) => s.journal.get(key),
            None => None,
        };
        match borrowed {
            Some(v) => self.commit_checked(key, &v, None, fence).map(Some),
            None => Ok(None),
        }
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
    pub(super) fn batch_failure(&self) -> CoreResult<()> {
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
        if self.replay_only {
            return Err(CoreError::ReplayEnd(key.to_string()));
        }
        let ident = match self.unjournaled(key) {
            Ok(ident) => ident,
            Err(existing) => {
                if let Some(s) = span {
                    self.queue_tapped_span(s);
                }
                return Ok(existing);
            }
        };
        if self.batches(fence) {
            self.batch_failure()?;
            let rid = self.rid()?;
            let stored = self.journal.lock().record(key, Arc::from(value));
            self.store.commit_batched_step(
                rid,
                key,
                value,
                ident.as_deref(),
                span,
                &self.trace,
                &self.batch_slot,
            )?;
            return Ok(stored);
        }
        self.sync_point()?;
        let rid = self.rid()?;
        let record = span.map(|s| self.record(rid, s, Some(value)));
        let winner = self
            .store
            .commit_step(rid, key, value, ident.as_deref(), record)?;
        let stored: Arc<str> = Arc::from(winner.as_deref().unwrap_or(value));
        Ok(self.journal.lock().record(key, stored))
    }

    /// Journals `value` under `key` and writes `item` in the same
    /// transaction (an event, a stream value or end: OPS-21, OPS-22);
    /// a key journaled already writes nothing and returns its value.
    pub fn commit_published(
        &self,
        key: &str,
        value: &str,
        item: &crate::store::published::Published<'_>,
        fence: Option<&Fence>,
    ) -> CoreResult<Arc<str>> {
        self.check(fence)?;
        if self.replay_only {
            return Err(CoreError::ReplayEnd(key.to_string()));
        }
        let ident = match self.unjournaled(key) {
            Ok(ident) => ident,
            Err(existing) => return Ok(existing),
        };
        // Batched steps before it are committed first (SQLite's writer
        // drains its queue ahead of the transaction; a server store
        // flushes here).
        self.sync_point()?;
        self.batch_failure()?;
        let rid = self.rid()?;
        let winner = self
            .store
            .commit_published(rid, key, value, ident.as_deref(), item)?;
        let stored: Arc<str> = Arc::from(winner.as_deref().unwrap_or(value));
        Ok(self.journal.lock().record(key, stored))
    }

    /// Appends `values` to stream `key` of the run, unjournaled (an
    /// agent's text deltas): a replay-only attempt appends nothing.
    pub fn append_stream(&self, key: &str, values: &[String]) -> CoreResult<()> {
        self.check(None)?;
        if self.replay_only || values.is_empty() {
            return Ok(());
        }
        self.store.append_stream(self.rid()?, key, values)
    }

    /// `commit` of an unfenced step under batch durability (`batches(None)`),
    /// its span borrowed from the caller.
    pub fn commit_batched_view(
        &self,
        key: &str,
        value: &str,
        span: crate::store::spans::SpanView<'_>,
    ) -> CoreResult<Arc<str>> {
        self.check(None)?;
        if crate::span_tap::on() {
            self.tap(Some(&span.to_row(value)));
        }
        let ident = match self.unjournaled(key) {
            Ok(ident) => ident,
            Err(existing) => {
                self.queue_tapped_span(span.to_row(value));
                return Ok(existing);
            }
        };
        self.batch_failure()?;
        let rid = self.rid()?;
        let stored = self.journal.lock().record(key, Arc::from(value));
        self.store.commit_batched_view(
            rid,
            key,
            value,
            ident.as_deref(),
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
        if self.replay_only {
            return Err(CoreError::ReplayEnd(key.to_string()));
        }
        let ident = match self.unjournaled(key) {
            Ok(ident) => ident,
            Err(existing) => {
                if let Some(s) = span {
                    self.queue_tapped_span(s);
                }
                return Ok(Commit::Stored(existing));
            }
        };
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
            ident,
            record,
        )))
    }

    /// The identity to journal `key` with (`Ok`), or the value it already
    /// holds (`Err`: an earlier write won).
    fn unjournaled(&self, key: &str) -> Result<Option<String>, Arc<str>> {
        let mut j = self.journal.lock();
        match j.get(key) {
            Some(existing) => Err(existing),
            None => Ok(j.pending_ident(key)),
        }
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
        if self.replay_only {
            return Err(CoreError::ReplayEnd(key.to_string()));
        }
        let (stored, ident) = {
            let mut j = self.journal.lock();
            if let Some(existing) = j.get(key) {
                drop(j);
                if let Some(s) = span {
                    self.queue_tapped_span(s);
                }
                return Ok(existing);
            }
            let ident = j.pending_ident(key);
            (j.record(key, Arc::from(value)), ident)
        };
        self.sync_point()?;
        let rid = self.rid()?;
        let record = span.map(|s| self.record(rid, s, Some(value)));
        let slot = self
            .store
            .commit_deferred(rid, key, value, ident.as_deref(), record);
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
}
