//! Bindings of the durable primitives: wait decisions on an attempt,
//! signals, cancel requests, due runs, and the engine clock.

use super::attempt::{PyAttempt, PyFence};
use super::errors::IntoPy;
use super::store::PyStore;
use crate::clock;
use crate::durable::{self, DurableStore, Mode, Outcome, WaitSpec};
use crate::error::{AtPath, CoreError, CoreResult};
use crate::owner::{lease_is_live, owner_id};
use crate::run::Attempt;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `(interrupt_id, kind, payload_json)` of a park.
type ParkTuple = (String, String, Option<String>);
/// `(outcome, value_json, seconds, park)`: `("ready", value, since, None)`,
/// `("block", None, seconds, None)` or `("park", None, None, interrupt)`.
type OutcomeTuple = (&'static str, Option<String>, Option<f64>, Option<ParkTuple>);

/// `(run_id, kind, name, reason, module)` of a due run.
type DueTuple = (String, String, String, &'static str, Option<String>);
/// `(step_key, wake_at, signal_name)` of a parked wait.
type ParkedTuple = (String, Option<f64>, Option<String>);

/// A reached wait of an attempt (see `Attempt::resolve`).
#[pyclass(name = "Wait", module = "composeai._core", frozen)]
pub struct PyWait {
    attempt: Arc<Attempt>,
    spec: WaitSpec,
}

fn mode(name: &str) -> PyResult<Mode> {
    match name {
        "block" => Ok(Mode::Block),
        "poll" => Ok(Mode::Poll),
        "park" => Ok(Mode::Park),
        other => Err(super::errors::value_error(format!(
            "unknown wait mode {other:?}"
        ))),
    }
}

#[pymethods]
impl PyWait {
    #[getter]
    fn key(&self) -> &str {
        &self.spec.key
    }

    /// The journal held the key when it was reached (a replay).
    #[getter]
    fn journaled(&self) -> bool {
        self.spec.journaled
    }

    /// Parks on the wait even if it is already satisfied; returns the
    /// interrupt `(id, kind, payload_json)`.
    fn park(&self) -> ParkTuple {
        let i = self.attempt.force_park(&self.spec);
        (i.interrupt_id, i.kind, i.payload_json)
    }

    /// The journaled signal watermark of `await_until` evaluation `k`.
    fn watermark(&self, py: Python<'_>, k: u32) -> PyResult<i64> {
        py.allow_threads(|| self.attempt.await_watermark(&self.spec, k))
            .py_err()
    }

    /// Decides the wait; in `"block"` mode sleeps (GIL released) until it
    /// is ready or a cancel request arrives. `after`: an `await_until`
    /// evaluation's watermark.
    #[pyo3(signature = (mode_name, after=None))]
    fn resolve(
        &self,
        py: Python<'_>,
        mode_name: &str,
        after: Option<i64>,
    ) -> PyResult<OutcomeTuple> {
        let m = mode(mode_name)?;
        // Blocking polls here rather than in the core, so that signal
        // handlers (Ctrl-C) run between naps.
        let step = if m == Mode::Block { Mode::Poll } else { m };
        let outcome = loop {
            let outcome = py
                .allow_threads(|| self.attempt.resolve_after(&self.spec, after, step))
                .py_err()?;
            match outcome {
                Outcome::Block { seconds } if m == Mode::Block => {
                    let wake = self.spec.wake_at();
                    py.allow_threads(|| clock::nap(wake, Duration::from_secs_f64(seconds)));
                    py.check_signals()?;
                }
                other => break other,
            }
        };
        Ok(match outcome {
            Outcome::Ready { value, since } => ("ready", value, since, None),
            Outcome::Block { seconds } => ("block", None, Some(seconds), None),
            Outcome::Park { interrupt } => (
                "park",
                None,
                None,
                Some((
                    interrupt.interrupt_id,
                    interrupt.kind,
                    interrupt.payload_json,
                )),
            ),
        })
    }
}

#[pyfunction]
#[pyo3(signature = (attempt, scope, seconds, fence=None))]
pub fn begin_sleep(
    py: Python<'_>,
    attempt: &PyAttempt,
    scope: &str,
    seconds: f64,
    fence: Option<&PyFence>,
) -> PyResult<PyWait> {
    let a = attempt.inner.clone();
    let fence = fence.map(|f| f.inner.clone());
    let spec = py
        .allow_threads(|| a.begin_sleep(scope, seconds, fence.as_ref()))
        .py_err()?;
    Ok(PyWait { attempt: a, spec })
}

#[pyfunction]
#[pyo3(signature = (attempt, scope, name, timeout, default_json, fence=None))]
pub fn begin_receive(
    py: Python<'_>,
    attempt: &PyAttempt,
    scope: &str,
    name: &str,
    timeout: Option<f64>,
    default_json: String,
    fence: Option<&PyFence>,
) -> PyResult<PyWait> {
    let a = attempt.inner.clone();
    let fence = fence.map(|f| f.inner.clone());
    let spec = py
        .allow_threads(|| a.begin_receive(scope, name, timeout, default_json, fence.as_ref()))
        .py_err()?;
    Ok(PyWait { attempt: a, spec })
}

#[pyfunction]
#[pyo3(signature = (attempt, scope, timeout, fence=None))]
pub fn begin_await(
    py: Python<'_>,
    attempt: &PyAttempt,
    scope: &str,
    timeout: Option<f64>,
    fence: Option<&PyFence>,
) -> PyResult<PyWait> {
    let a = attempt.inner.clone();
    let fence = fence.map(|f| f.inner.clone());
    let spec = py
        .allow_threads(|| a.begin_await(scope, timeout, fence.as_ref()))
        .py_err()?;
    Ok(PyWait { attempt: a, spec })
}

/// Every unconsumed signal of `name`, consumed and journaled; the list's JSON.
#[pyfunction]
#[pyo3(signature = (attempt, scope, name, fence=None))]
pub fn receive_all(
    py: Python<'_>,
    attempt: &PyAttempt,
    scope: &str,
    name: &str,
    fence: Option<&PyFence>,
) -> PyResult<String> {
    let a = attempt.inner.clone();
    let fence = fence.map(|f| f.inner.clone());
    py.allow_threads(|| a.receive_all(scope, name, fence.as_ref()))
        .py_err()
}

/// Raises the internal cancel signal when a cancel request is stored;
/// unforced, reads the store at most once per poll interval.
#[pyfunction]
#[pyo3(signature = (attempt, force=true))]
pub fn check_cancel(py: Python<'_>, attempt: &PyAttempt, force: bool) -> PyResult<()> {
    let a = attempt.inner.clone();
    py.allow_threads(|| a.check_cancel(force)).py_err()
}

#[pyfunction]
#[pyo3(signature = (attempt, module=None))]
pub fn set_module(attempt: &PyAttempt, module: Option<String>) {
    attempt.inner.set_module(module);
}

/// EXT-3: appends a signal in one commit; returns its sequence number.
#[pyfunction]
pub fn send_signal(
    py: Python<'_>,
    store: &PyStore,
    run_id: &str,
    name: &str,
    value_json: &str,
) -> PyResult<i64> {
    py.allow_threads(|| store.inner.send_signal(run_id, name, value_json))
        .py_err()
}

/// EXT-10: `"cancelled"` (parked or orphaned, done now), `"requested"`
/// (the executing attempt will observe it) or `"already"`.
#[pyfunction]
#[pyo3(signature = (store, run_id, reason=None))]
pub fn request_cancel(
    py: Python<'_>,
    store: &PyStore,
    run_id: &str,
    reason: Option<&str>,
) -> PyResult<&'static str> {
    let outcome = py
        .allow_threads(|| store.inner.request_cancel(run_id, reason, &lease_is_live))
        .py_err()?;
    Ok(match outcome {
        durable::CancelOutcome::Cancelled => "cancelled",
        durable::CancelOutcome::Requested => "requested",
        durable::CancelOutcome::AlreadyCancelled => "already",
    })
}

/// `(run_id, kind, name, reason, module)` of runs due at engine time `now`
/// (default: the engine clock). With `versions` (`(flow name,
/// fingerprint)` pairs, OPS-1), a run of one of those flows is listed only
/// when stored with that fingerprint, or with `mismatched` only when
/// stored with another one (and runs of other flows are not listed).
#[pyfunction]
#[pyo3(signature = (store, now=None, limit=1000, versions=None, mismatched=false))]
pub fn due_runs(
    py: Python<'_>,
    store: &PyStore,
    now: Option<f64>,
    limit: usize,
    versions: Option<Vec<(String, String)>>,
    mismatched: bool,
) -> PyResult<Vec<DueTuple>> {
    let at = now.unwrap_or_else(clock::now);
    let filter = match &versions {
        None => crate::store::durable::Versions::Any,
        Some(v) if mismatched => crate::store::durable::Versions::Mismatched(v),
        Some(v) => crate::store::durable::Versions::Matching(v),
    };
    let rows = py
        .allow_threads(|| store.inner.due_runs(at, limit, &lease_is_live, filter))
        .py_err()?;
    Ok(rows
        .into_iter()
        .map(|r| (r.run_id, r.kind, r.name, r.reason, r.module))
        .collect())
}

/// OPS-12: fails the paused and queued runs whose deadline passed (at
/// engine time `now`, default the engine clock) with `FlowTimeoutError`;
/// returns their run ids.
#[pyfunction]
#[pyo3(signature = (store, now=None))]
pub fn expire_runs(py: Python<'_>, store: &PyStore, now: Option<f64>) -> PyResult<Vec<String>> {
    let at = now.unwrap_or_else(clock::now);
    py.allow_threads(|| {
        store
            .inner
            .expire_runs(at, &crate::run::deadline::deadline_error_json)
    })
    .py_err()
}

/// The earliest wake time of a parked run later than `after` (on
/// PostgreSQL: the next expiry of another process's lease, STORE-12).
#[pyfunction]
pub fn next_wake(py: Python<'_>, store: &PyStore, after: f64) -> PyResult<Option<f64>> {
    py.allow_threads(|| {
        let timers = store.inner.next_wake(after)?;
        let Some(pg) = &store.pg else {
            return Ok(timers);
        };
        // When another process's lease lapses (wall time, as engine time),
        // its run may be due for recovery (STORE-12).
        let wall = crate::time::now();
        let expiry = pg
            .next_lease_expiry(owner_id(), wall)?
            .map(|t| after.max(clock::now() + (t - wall)) + durable::EPSILON);
        Ok(match (timers, expiry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    })
    .py_err()
}

/// `(step_key, wake_at, signal_name)` of a parked run's wait, or `None`.
#[pyfunction]
pub fn parked_wait(py: Python<'_>, store: &PyStore, run_id: &str) -> PyResult<Option<ParkedTuple>> {
    let row = py
        .allow_threads(|| store.inner.parked_wait(run_id))
        .py_err()?;
    Ok(row.map(|w| (w.step_key, w.wake_at, w.signal_name)))
}

/// Parked waits of the given runs, for `compose runs`: run id ->
/// `(step_key, wake_at, signal_name)`. Empty when there is no store.
/// `db_path` is a SQLite file or a PostgreSQL URL.
#[pyfunction]
pub fn parked_waits<'py>(
    py: Python<'py>,
    db_path: &str,
    run_ids: Vec<String>,
) -> PyResult<Bound<'py, PyDict>> {
    let rows = py
        .allow_threads(|| -> CoreResult<Vec<(String, durable::WaitRow)>> {
            if db_path.starts_with("postgresql://") || db_path.starts_with("postgres://") {
                let crate::store::url::StoreUrl::Postgres(url) =
                    crate::store::url::parse(db_path, "")?
                else {
                    return Ok(vec![]);
                };
                let pg = crate::store::postgres::PgStore::connect(url)?;
                if !pg.cli_has_store()? {
                    return Ok(vec![]);
                }
                let mut out = Vec::new();
                for id in run_ids {
                    if let Some(w) = pg.parked_wait(&id)? {
                        out.push((id, w));
                    }
                }
                return Ok(out);
            }
            if !std::path::Path::new(db_path).exists() {
                return Ok(vec![]);
            }
            let conn = crate::store::sqlite::open_connection(db_path, false)?;
            let mut out = Vec::new();
            for id in run_ids {
                if let Some(w) =
                    crate::store::sqlite::durable::parked_wait(&conn, &id).at(db_path)?
                {
                    out.push((id, w));
                }
            }
            Ok(out)
        })
        .py_err()?;
    let d = PyDict::new(py);
    for (id, w) in rows {
        d.set_item(id, (w.step_key, w.wake_at, w.signal_name))?;
    }
    Ok(d)
}

/// Sleeps (GIL released) until engine time `until`, another process's
/// commit to the store, a signal or cancel request from this process, or
/// `max_seconds`; returns `True` unless only `max_seconds` passed.
#[pyfunction]
#[pyo3(signature = (store, until, max_seconds))]
pub fn wait_for_work(
    py: Python<'_>,
    store: &PyStore,
    until: Option<f64>,
    max_seconds: f64,
) -> PyResult<bool> {
    if let Some(pg) = &store.pg {
        // STORE-22: LISTEN/NOTIFY hints, the caller's timeout the polling
        // fallback.
        return Ok(py.allow_threads(|| super::queue::wait_for_hint(pg, until, max_seconds)));
    }
    py.allow_threads(|| -> CoreResult<bool> {
        let start = Instant::now();
        let limit = Duration::from_secs_f64(max_seconds.max(0.0));
        let before = store.inner.change_marker()?;
        loop {
            if until.is_some_and(|u| clock::now() >= u) {
                return Ok(true);
            }
            let left = limit.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Ok(false);
            }
            let poked = clock::nap(until, left.min(durable::POLL));
            if poked || store.inner.change_marker()? != before {
                return Ok(true);
            }
        }
    })
    .py_err()
}

/// Gives up this process's leases (a worker stopping mid-run), so that any
/// process may continue those runs at once: each is left `running` with no
/// lease holder, which `due_runs` recovers.
#[pyfunction]
pub fn release_leases(py: Python<'_>, store: &PyStore) -> PyResult<usize> {
    py.allow_threads(|| store.inner.release_leases(owner_id()))
        .py_err()
}

#[pyfunction]
pub fn clock_now() -> f64 {
    clock::now()
}

#[pyfunction]
pub fn clock_is_fake() -> bool {
    clock::is_fake()
}

#[pyfunction]
#[pyo3(signature = (at=None))]
pub fn clock_set_fake(at: Option<f64>) {
    clock::set_fake(at);
}

#[pyfunction]
pub fn clock_advance(seconds: f64) -> PyResult<()> {
    if clock::advance(seconds) {
        Ok(())
    } else {
        Err(CoreError::Config("no fake clock is installed".into())).py_err()
    }
}

/// Wakes every blocked wait of this process to look again.
#[pyfunction]
pub fn clock_poke() {
    clock::poke();
}

#[pyfunction]
pub fn clock_iso(t: f64) -> String {
    clock::iso(t)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyWait>()?;
    for f in [
        wrap_pyfunction!(begin_sleep, m)?,
        wrap_pyfunction!(begin_receive, m)?,
        wrap_pyfunction!(receive_all, m)?,
        wrap_pyfunction!(begin_await, m)?,
        wrap_pyfunction!(check_cancel, m)?,
        wrap_pyfunction!(set_module, m)?,
        wrap_pyfunction!(send_signal, m)?,
        wrap_pyfunction!(request_cancel, m)?,
        wrap_pyfunction!(due_runs, m)?,
        wrap_pyfunction!(next_wake, m)?,
        wrap_pyfunction!(expire_runs, m)?,
        wrap_pyfunction!(parked_wait, m)?,
        wrap_pyfunction!(parked_waits, m)?,
        wrap_pyfunction!(wait_for_work, m)?,
        wrap_pyfunction!(release_leases, m)?,
        wrap_pyfunction!(clock_now, m)?,
        wrap_pyfunction!(clock_is_fake, m)?,
        wrap_pyfunction!(clock_set_fake, m)?,
        wrap_pyfunction!(clock_advance, m)?,
        wrap_pyfunction!(clock_iso, m)?,
        wrap_pyfunction!(clock_poke, m)?,
    ] {
        m.add_function(f)?;
    }
    Ok(())
}
