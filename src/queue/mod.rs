//! Queues and workers (STORE-20 … STORE-23).
//!
//! `Flow.start(queue=…)` creates a run with status `queued` (and its
//! `queue_runs` row) in one transaction; a worker claims queued runs in one
//! transaction that also enforces the queue's limits: on SQLite a single
//! `IMMEDIATE` transaction (one writer at a time), on PostgreSQL `FOR UPDATE
//! SKIP LOCKED` so that workers never wait on each other's rows, under a
//! per-queue advisory lock when a global concurrency or a rate limit must
//! be counted. A claimed run is `running` and leased to the claiming
//! process, which continues it through the ordinary resume path.

mod pg;
pub mod schema;
mod sqlite;

use crate::error::{CoreError, CoreResult};
use crate::store::postgres::PgStore;
use crate::store::sqlite::SqliteStore;
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
fn claim_order(limits: &Limits) -> &'static str {
    if limits.priority {
        "q.priority, q.rid"
    } else {
        "q.rid"
    }
}

/// STORE-20: a `dedup_id` already taken by a queued or running run.
fn dedup_taken(dedup_id: &str, queue: &str, run_id: &str, status: &str) -> CoreError {
    CoreError::Config(format!(
        "dedup_id '{dedup_id}' is already used by run '{run_id}' ({status}) on queue '{queue}' -- \
         a run with the same dedup_id is enqueued again only after that run has finished"
    ))
}

fn check_placement(p: &Placement) -> CoreResult<()> {
    if p.queue.is_empty() {
        return Err(CoreError::Config(
            "queue name must be a non-empty string".into(),
        ));
    }
    if p.dedup_id.as_deref() == Some("") {
        return Err(CoreError::Config(
            "dedup_id must be a non-empty string".into(),
        ));
    }
    Ok(())
}

/// Seconds of the rate-limit window, or 0 without one.
fn window(limits: &Limits) -> f64 {
    limits.rate_limit.map_or(0.0, |(_, s)| s)
}

/// The store a queue operation runs on.
#[derive(Clone, Copy)]
pub enum Backend<'a> {
    Sqlite(&'a SqliteStore),
    Postgres(&'a PgStore),
}

/// STORE-20: creates the run `queued` in `p.queue`, refusing a `dedup_id`
/// held by a queued or running run of that queue; one transaction.
pub fn enqueue(b: Backend<'_>, new: &NewRun, p: &Placement) -> CoreResult<RunRow> {
    check_placement(p)?;
    match b {
        Backend::Sqlite(s) => sqlite::enqueue(s, new, p),
        Backend::Postgres(s) => pg::enqueue(s, new, p),
    }
}

/// What a worker claims for: its owner id, its lease, and the flows it
/// can execute (it never claims a run of a flow it has not imported).
pub struct Claimer<'a> {
    pub owner: &'a str,
    pub lease_until: f64,
    pub flows: &'a [String],
}

/// STORE-21: claims up to `room` queued runs of `queue` for `by`, within
/// the queue's limits; the claimed runs are `running`, leased to it.
pub fn claim(
    b: Backend<'_>,
    queue: &str,
    limits: &Limits,
    room: i64,
    by: &Claimer<'_>,
) -> CoreResult<Vec<Claimed>> {
    if room <= 0 || by.flows.is_empty() {
        return Ok(Vec::new());
    }
    match b {
        Backend::Sqlite(s) => sqlite::claim(s, queue, limits, room, by),
        Backend::Postgres(s) => pg::claim(s, queue, limits, room, by),
    }
}

/// STORE-23: per queue, by name.
pub fn stats(b: Backend<'_>, now: f64) -> CoreResult<Vec<QueueStats>> {
    match b {
        Backend::Sqlite(s) => sqlite::stats(s, now),
        Backend::Postgres(s) => pg::stats(s, now),
    }
}

/// When a rate-limited queue next has room: the oldest start in the
/// current window plus the window (`None` when not rate limited or when
/// the window is not full).
pub fn next_slot(
    b: Backend<'_>,
    queue: &str,
    limits: &Limits,
    now: f64,
) -> CoreResult<Option<f64>> {
    let Some((per, seconds)) = limits.rate_limit else {
        return Ok(None);
    };
    let starts = match b {
        Backend::Sqlite(s) => sqlite::recent_starts(s, queue, now - seconds, per)?,
        Backend::Postgres(s) => pg::recent_starts(s, queue, now - seconds, per)?,
    };
    Ok((starts.len() as i64 >= per).then(|| starts[0] + seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowance_is_bounded_by_room_global_slots_and_the_rate_window() {
        let free = Limits::default();
        assert_eq!(allowance(&free, 5, 100, 100), 5);
        let capped = Limits {
            concurrency: Some(3),
            ..Limits::default()
        };
        assert_eq!(allowance(&capped, 5, 1, 0), 2);
        assert_eq!(allowance(&capped, 5, 4, 0), 0);
        let rated = Limits {
            rate_limit: Some((2, 1.0)),
            ..Limits::default()
        };
        assert_eq!(allowance(&rated, 5, 0, 1), 1);
        assert_eq!(allowance(&rated, 5, 0, 7), 0);
        assert_eq!(allowance(&rated, -1, 0, 0), 0);
        assert!(rated.counted() && capped.counted() && !free.counted());
        assert_eq!(window(&rated), 1.0);
    }
}
