//! What every backend shares about queued writes: the slot a queued
//! journal write's outcome lands in, the `spans.flags` bits, and the first
//! span-persistence failure of the process.

use crate::error::CoreResult;
use parking_lot::Mutex;
use std::sync::Arc;

/// `spans.flags` bits.
pub const FLAG_REPLAYED: i64 = 1;
pub const FLAG_OUTPUT_IN_JOURNAL: i64 = 2;

pub(crate) type StepResult = CoreResult<Option<String>>;

/// Where the outcome of a queued journal write lands once it is applied.
#[derive(Default)]
pub struct Slot(pub(crate) Mutex<Option<StepResult>>);

impl Slot {
    /// A write sharing this slot failed: the slot keeps the error, and
    /// later writes sharing it are not applied (so a batch-durability run
    /// never has a later step stored without an earlier one).
    pub fn failed(&self) -> bool {
        matches!(&*self.0.lock(), Some(Err(_)))
    }

    /// The write's outcome, once a commit has applied it.
    pub fn outcome(&self) -> Option<StepResult> {
        self.0.lock().clone()
    }

    /// Records a write's outcome; a failure already held is kept.
    pub(crate) fn fill(&self, outcome: StepResult) {
        let mut held = self.0.lock();
        if !matches!(&*held, Some(Err(_))) {
            *held = Some(outcome);
        }
    }

    /// A slot for a write that was applied before it was handed out.
    pub fn filled(outcome: StepResult) -> Arc<Slot> {
        Arc::new(Slot(Mutex::new(Some(outcome))))
    }
}

/// The first span-persistence failure of this process, for one warning.
static SPAN_WRITE_ERROR: Mutex<Option<String>> = Mutex::new(None);

/// Records a span-persistence failure (the first one is kept).
pub fn record_span_write_error(message: String) {
    SPAN_WRITE_ERROR.lock().get_or_insert(message);
}

/// Takes the recorded span-persistence failure, if any.
pub fn take_span_write_error() -> Option<String> {
    SPAN_WRITE_ERROR.lock().take()
}
