//! The durable primitives' storage (EXT-1 … EXT-12): what a parked run
//! waits for, what the worker is handed, and the `DurableStore` operations
//! each backend implements.

use crate::error::CoreResult;
use crate::store::takeover::LeaseCheck;

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

#[derive(Debug, PartialEq)]
pub enum CancelOutcome {
    /// Nobody executes the run: it is `cancelled` now.
    Cancelled,
    /// The executing attempt observes the request at its next boundary.
    Requested,
    AlreadyCancelled,
}

/// A run the worker should continue now.
#[derive(Debug, Clone, PartialEq)]
pub struct DueRun {
    pub run_id: String,
    pub kind: String,
    pub name: String,
    /// `timer`, `answered` (an answer given from outside the run),
    /// `signal` or `recovered` (a `running` run whose lease holder is dead).
    pub reason: &'static str,
    pub module: Option<String>,
}

/// The step key prefix of the wait row an answer given from outside the run
/// (`compose answer`, the web UI) leaves to make the run due.
pub const ANSWERED_WAIT: &str = "__interrupt__:";

/// Why a run whose wait row's `wake_at` passed is due: an outside answer
/// made it due, or its durable timer fired.
pub fn wake_reason(step_key: &str) -> &'static str {
    if step_key.starts_with(ANSWERED_WAIT) {
        "answered"
    } else {
        "timer"
    }
}

/// The durable primitives' operations on a store (EXT-1 … EXT-12). Every
/// write an attempt makes is fenced on it owning the run where the store
/// shares runs between machines.
pub trait DurableStore {
    /// Journals a wait's `value` under `key` (first write wins) with, when
    /// `timer` is given, the timer `(step_key, wake_at)`, in one commit;
    /// returns the stored value when an earlier write won.
    fn commit_wait(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        timer: Option<(&str, Option<f64>)>,
    ) -> CoreResult<Option<String>>;
    /// Records that a wait began (and, with `wake_at`, its timer).
    fn insert_timer(&self, rid: i64, key: &str, wake_at: Option<f64>) -> CoreResult<()>;
    /// Removes a satisfied wait's timer; returns when the wait began.
    fn take_timer(&self, rid: i64, key: &str) -> CoreResult<Option<f64>>;
    fn signal_at(&self, rid: i64, name: &str, seq: i64) -> CoreResult<Option<String>>;
    /// Signals of `name` after sequence number `seq`, in send order.
    fn signals_after(&self, rid: i64, name: &str, seq: i64) -> CoreResult<Vec<(i64, String)>>;
    fn last_signal_id(&self, rid: i64) -> CoreResult<i64>;
    /// EXT-3: appends a signal in one commit; returns its sequence number.
    fn send_signal(&self, run_id: &str, name: &str, value_json: &str) -> CoreResult<i64>;
    /// EXT-10: cancels a parked (or orphaned) run at once, else records the
    /// request for the attempt executing it.
    fn request_cancel(
        &self,
        run_id: &str,
        reason: Option<&str>,
        live: LeaseCheck<'_>,
    ) -> CoreResult<CancelOutcome>;
    /// EXT-2: the runs a worker should continue now, at most `limit`.
    fn due_runs(&self, now: f64, limit: usize, live: LeaseCheck<'_>) -> CoreResult<Vec<DueRun>>;
    /// The earliest wake time of a parked run after `after`.
    fn next_wake(&self, after: f64) -> CoreResult<Option<f64>>;
    /// What a parked run waits for.
    fn parked_wait(&self, run_id: &str) -> CoreResult<Option<WaitRow>>;
    /// A value that changes when another connection commits to the store.
    fn change_marker(&self) -> CoreResult<i64>;
    /// Gives up `owner`'s leases: each run is left `running` with no
    /// holder, which `due_runs` recovers.
    fn release_leases(&self, owner: &str) -> CoreResult<usize>;
}
