//! Durable primitives (EXT-1 … EXT-12): timers, signals, cancel requests
//! and the wait decision.
//!
//! A wait is a step. The driver asks the attempt to resolve it, and the
//! core answers from the journal and this module's tables: *ready* (with
//! the value), *block* (sleep in place until a deadline or a wake-up, then
//! decide again), or *park* (the attempt settles `paused` with a `waits`
//! row, which `due_runs` reads to know when the run should continue).

mod wait;

pub use crate::store::durable::{CancelOutcome, DueRun, DurableStore, WaitRow, EPSILON, POLL};
pub use wait::{Mode, Outcome, WaitSpec};

use crate::clock;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Instant;

/// The durable state of one attempt.
#[derive(Default)]
pub struct AttemptState {
    /// Signals consumed so far per name (in send order).
    cursors: Mutex<HashMap<String, i64>>,
    module: Mutex<Option<String>>,
    /// The wait this attempt parks on, written by its settlement.
    parked: Mutex<Option<WaitRow>>,
    /// When cancel requests were last read, and the clock epoch then.
    last_cancel_check: Mutex<Option<(Instant, u64)>>,
}

impl AttemptState {
    /// Records a cancel-request check as done now.
    pub(crate) fn cancel_checked_now(&self) {
        *self.last_cancel_check.lock() = Some((Instant::now(), clock::epoch()));
    }

    pub fn set_module(&self, module: Option<String>) {
        *self.module.lock() = module;
    }

    pub fn take_parked(&self) -> Option<WaitRow> {
        self.parked.lock().take()
    }
}
