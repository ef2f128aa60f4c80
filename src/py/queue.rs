//! Bindings of the queues (STORE-20 … STORE-23): the core enqueues,
//! claims within the queue's limits and counts; Python declares queues and
//! executes the claimed runs.

use super::errors::IntoPy;
use super::store::PyStore;
use crate::clock;
use crate::error::{CoreError, CoreResult};
use crate::queue::{self, Backend, Claimer, Limits, Placement};
use crate::store::NewRun;
use pyo3::prelude::*;
use std::time::{Duration, Instant};

fn backend(store: &PyStore) -> CoreResult<Backend<'_>> {
    match (&store.sqlite, &store.pg) {
        (Some(s), _) => Ok(&**s),
        (None, Some(p)) => Ok(&**p),
        (None, None) => Err(CoreError::Config("the store has no queue support".into())),
    }
}

fn limits(concurrency: Option<i64>, rate_limit: Option<(i64, f64)>, priority: bool) -> Limits {
    Limits {
        concurrency,
        rate_limit,
        priority,
    }
}

/// STORE-20: creates a `queued` run; returns its run id.
#[pyfunction]
#[pyo3(signature = (store, kind, name, queue, fingerprint=None, args_json=None, budget_json=None, priority=0, dedup_id=None, module=None))]
#[allow(clippy::too_many_arguments)]
pub fn queue_enqueue(
    py: Python<'_>,
    store: &PyStore,
    kind: String,
    name: String,
    queue: String,
    fingerprint: Option<String>,
    args_json: Option<String>,
    budget_json: Option<String>,
    priority: i64,
    dedup_id: Option<String>,
    module: Option<String>,
) -> PyResult<String> {
    let new = NewRun {
        run_id: crate::ids::new_ulid(),
        trace_id: crate::ids::new_ulid(),
        kind,
        name,
        fingerprint,
        args_json,
        budget_json,
        module,
    };
    let placement = Placement {
        queue,
        priority,
        dedup_id,
    };
    py.allow_threads(|| queue::enqueue(backend(store)?, &new, &placement))
        .py_err()
        .map(|r| r.run_id)
}

/// STORE-21: claims up to `room` queued runs of `queue` (of the flows
/// named in `flows`) for this process within the queue's limits;
/// `(run_id, kind, name)` in claim order.
#[pyfunction]
#[pyo3(signature = (store, queue, room, flows, concurrency=None, rate_limit=None, priority=false))]
#[allow(clippy::too_many_arguments)]
pub fn queue_claim(
    py: Python<'_>,
    store: &PyStore,
    queue: &str,
    room: i64,
    flows: Vec<String>,
    concurrency: Option<i64>,
    rate_limit: Option<(i64, f64)>,
    priority: bool,
) -> PyResult<Vec<(String, String, String)>> {
    let l = limits(concurrency, rate_limit, priority);
    let by = Claimer {
        owner: crate::owner::owner_id(),
        lease_until: crate::time::now() + crate::lease::lease_seconds().py_err()?,
        flows: &flows,
    };
    py.allow_threads(|| queue::claim(backend(store)?, queue, &l, room, &by))
        .py_err()
        .map(|rows| {
            rows.into_iter()
                .map(|c| (c.run_id, c.kind, c.name))
                .collect()
        })
}

/// When a rate-limited queue whose window is full next has room.
#[pyfunction]
pub fn queue_next_slot(
    py: Python<'_>,
    store: &PyStore,
    queue: &str,
    rate_limit: Option<(i64, f64)>,
) -> PyResult<Option<f64>> {
    let l = limits(None, rate_limit, false);
    py.allow_threads(|| queue::next_slot(backend(store)?, queue, &l, crate::time::now()))
        .py_err()
}

/// `(queue, queued, running, completed in the last hour, oldest queued
/// enqueue time)` per queue, by name (STORE-23).
pub type StatsTuple = (String, i64, i64, i64, Option<f64>);

#[pyfunction]
pub fn queue_stats(py: Python<'_>, store: &PyStore) -> PyResult<Vec<StatsTuple>> {
    py.allow_threads(|| queue::stats(backend(store)?, crate::time::now()))
        .py_err()
        .map(|rows| {
            rows.into_iter()
                .map(|s| {
                    (
                        s.queue,
                        s.queued,
                        s.running,
                        s.completed_last_hour,
                        s.oldest_queued_at,
                    )
                })
                .collect()
        })
}

/// `(owner, runs held, latest lease expiry)` per process holding leases,
/// latest expiry first (the web UI's worker liveness).
#[pyfunction]
pub fn lease_holders(py: Python<'_>, store: &PyStore) -> PyResult<Vec<(String, i64, f64)>> {
    py.allow_threads(|| queue::lease_holders(backend(store)?))
        .py_err()
        .map(|rows| {
            rows.into_iter()
                .map(|h| (h.owner, h.runs, h.lease_until))
                .collect()
        })
}

/// STORE-22 on PostgreSQL: sleeps until a wake-up hint (a notification
/// the listener turned into a clock poke), engine time `until`, or
/// `max_seconds`, polling at least every second; whether it was woken.
pub fn wait_for_hint(
    store: &crate::store::postgres::PgStore,
    until: Option<f64>,
    max_seconds: f64,
) -> bool {
    let slice = crate::store::Store::wait_slice(store);
    let start = Instant::now();
    let limit = Duration::from_secs_f64(max_seconds.max(0.0));
    loop {
        if until.is_some_and(|u| clock::now() >= u) {
            return true;
        }
        let left = limit.saturating_sub(start.elapsed());
        if left.is_zero() {
            return false;
        }
        if clock::nap(until, left.min(slice)) {
            return true;
        }
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    for f in [
        wrap_pyfunction!(queue_enqueue, m)?,
        wrap_pyfunction!(queue_claim, m)?,
        wrap_pyfunction!(queue_next_slot, m)?,
        wrap_pyfunction!(queue_stats, m)?,
        wrap_pyfunction!(lease_holders, m)?,
    ] {
        m.add_function(f)?;
    }
    Ok(())
}
