//! The queues' storage (STORE-20 … STORE-23): a queue's limits, where a
//! run waits, what a claim hands back, and the `QueueStore` operations each
//! backend implements in one transaction of its own.

use crate::error::{CoreError, CoreResult};
use crate::store::{NewRun, RunRow};

/// A queue's limits, as declared by `compose.Queue`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Limits {
    /// Runs of the queue executing at once, across every worker.
    pub concurrency: Option<i64>,
    /// At most `n` claims per `seconds`, across every worker.
    pub rate_limit: Option<(i64, f64)>,
    /// Claim lower `priority` values first (then FIFO), else FIFO only.
    pub priority: bool,
}

impl Limits {
    /// Whether claims must be counted under the queue's lock.
    pub fn counted(&self) -> bool {
        self.concurrency.is_some() || self.rate_limit.is_some()
    }
}

/// Where a new run waits.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    pub queue: String,
    pub priority: i64,
    pub dedup_id: Option<String>,
}

/// A run a worker claimed: it is `running` and leased to the claimer.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    pub run_id: String,
    pub kind: String,
    pub name: String,
}

/// One line of `compose queues` (STORE-23).
#[derive(Debug, Clone, PartialEq)]
pub struct QueueStats {
    pub queue: String,
    pub queued: i64,
    pub running: i64,
    pub completed_last_hour: i64,
    /// When the oldest queued run was enqueued.
    pub oldest_queued_at: Option<f64>,
}

/// A process holding leases on runs (a worker, or any process executing
/// runs): its owner id, how many runs it holds, and the latest expiry of
/// those leases (renewed with each heartbeat).
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseHolder {
    pub owner: String,
    pub runs: i64,
    pub lease_until: f64,
}

/// How many runs a claim may start now: what the worker has room for,
/// bounded by the queue's free global slots and its rate-limit window.
pub fn allowance(limits: &Limits, room: i64, running: i64, started_in_window: i64) -> i64 {
    let mut n = room.max(0);
    if let Some(c) = limits.concurrency {
        n = n.min((c - running).max(0));
    }
    if let Some((per, _)) = limits.rate_limit {
        n = n.min((per - started_in_window).max(0));
    }
    n
}

/// The SQL `ORDER BY` of a queue's claims.
pub fn claim_order(limits: &Limits) -> &'static str {
    if limits.priority {
        "q.priority, q.rid"
    } else {
        "q.rid"
    }
}

/// STORE-20: a `dedup_id` already taken by a queued or running run.
pub fn dedup_taken(dedup_id: &str, queue: &str, run_id: &str, status: &str) -> CoreError {
    CoreError::Config(format!(
        "dedup_id '{dedup_id}' is already used by run '{run_id}' ({status}) on queue '{queue}' -- \
         a run with the same dedup_id is enqueued again only after that run has finished"
    ))
}

/// Seconds of the rate-limit window, or 0 without one.
pub fn window(limits: &Limits) -> f64 {
    limits.rate_limit.map_or(0.0, |(_, s)| s)
}

/// What a worker claims for: its owner id, its lease, and the flows it
/// can execute (it never claims a run of a flow it has not imported).
pub struct Claimer<'a> {
    pub owner: &'a str,
    pub lease_until: f64,
    pub flows: &'a [String],
}

/// The queue operations of a store.
pub trait QueueStore {
    /// Creates the run `queued` in `p.queue`, refusing a `dedup_id` held
    /// by a queued or running run of that queue.
    fn enqueue(&self, new: &NewRun, p: &Placement) -> CoreResult<RunRow>;
    /// Claims up to `room` queued runs of `queue` for `by`, within the
    /// queue's limits.
    fn claim(
        &self,
        queue: &str,
        limits: &Limits,
        room: i64,
        by: &Claimer<'_>,
    ) -> CoreResult<Vec<Claimed>>;
    /// Per queue, by name, at time `now`.
    fn stats(&self, now: f64) -> CoreResult<Vec<QueueStats>>;
    /// The start times of the queue's runs since `since`, oldest first, at
    /// most `limit`.
    fn recent_starts(&self, queue: &str, since: f64, limit: i64) -> CoreResult<Vec<f64>>;
    /// Every process holding a lease on a run, latest expiry first.
    fn lease_holders(&self) -> CoreResult<Vec<LeaseHolder>>;
}
