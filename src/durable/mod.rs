//! Durable primitives (EXT-1 … EXT-12): timers, signals, cancel requests
//! and the wait decision.
//!
//! A wait is a step. The driver asks the attempt to resolve it, and the
//! core answers from the journal and this module's tables: *ready* (with
//! the value), *block* (sleep in place until a deadline or a wake-up, then
//! decide again), or *park* (the attempt settles `paused` with a `waits`
//! row, which `due_runs` reads to know when the run should continue).

pub mod schema;
pub mod store;
mod wait;

pub use store::{
    due_runs, next_wake, parked_wait, request_cancel, send_signal, CancelOutcome, DueRun,
    DurableStore,
};
pub use wait::{Mode, Outcome, WaitSpec};

use crate::clock;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Instant;

/// How often a running attempt looks for a cancel request at its step
/// boundaries, and how often a blocked wait polls the store.
pub const POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// Wake times are journaled to the microsecond: a time within this of a
/// deadline has reached it.
pub const EPSILON: f64 = 1e-6;

/// What a parked run waits for, stored with its `paused` settlement.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WaitRow {
    pub step_key: String,
    /// Engine time at which the run is due.
    pub wake_at: Option<f64>,
    /// Due once signal `signal_seq` of `signal_name` exists.
    pub signal_name: Option<String>,
    pub signal_seq: Option<i64>,
    /// Due once any signal newer than this id exists.
    pub after_sid: Option<i64>,
    /// The module defining the run's flow, named when a worker lacks it.
    pub module: Option<String>,
}

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
