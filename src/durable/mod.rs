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
