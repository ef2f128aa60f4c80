//! The durable state of one attempt (EXT-1 … EXT-10): the signals it
//! consumed, the wait it parks on, and when it last looked for a cancel
//! request.

use crate::clock;
use crate::store::durable::WaitRow;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Instant;

/// The durable state of one attempt.
#[derive(Default)]
pub struct AttemptState {
    /// Signals consumed so far per name (in send order).
    pub(crate) cursors: Mutex<HashMap<String, i64>>,
    pub(crate) module: Mutex<Option<String>>,
    /// The wait this attempt parks on, written by its settlement.
    pub(crate) parked: Mutex<Option<WaitRow>>,
    /// When cancel requests were last read, and the clock epoch then.
    pub(crate) last_cancel_check: Mutex<Option<(Instant, u64)>>,
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
