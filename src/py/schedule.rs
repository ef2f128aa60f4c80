//! Bindings of the schedules (OPS-11): the core parses patterns, decides
//! which ticks fire and when a schedule fires next; Python declares
//! schedules and starts the fired runs.

use super::errors::IntoPy;
use super::store::PyStore;
use crate::clock;
use crate::owner::owner_id;
use crate::schedule;
use crate::store::schedule::ScheduleRow;
use pyo3::prelude::*;
use pyo3::types::PyDict;

fn row_dict<'py>(py: Python<'py>, r: &ScheduleRow) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", &r.name)?;
    d.set_item("flow", &r.flow)?;
    d.set_item("cron", &r.cron)?;
    d.set_item("timezone", &r.timezone)?;
    d.set_item("catchup", &r.catchup)?;
    d.set_item("queue", &r.queue)?;
    d.set_item("args_json", &r.args_json)?;
    d.set_item("paused", r.paused)?;
    d.set_item("next_fire", r.next_fire)?;
    d.set_item("last_fire", r.last_fire)?;
    d.set_item("last_run_id", &r.last_run_id)?;
    Ok(d)
}

/// Creates or updates a schedule; returns its stored row.
#[pyfunction]
#[pyo3(signature = (store, name, flow, cron, timezone, catchup, queue, args_json))]
#[allow(clippy::too_many_arguments)]
pub fn schedule_declare<'py>(
    py: Python<'py>,
    store: &PyStore,
    name: String,
    flow: String,
    cron: String,
    timezone: String,
    catchup: String,
    queue: Option<String>,
    args_json: String,
) -> PyResult<Bound<'py, PyDict>> {
    let row = ScheduleRow {
        name,
        flow,
        cron,
        timezone,
        catchup,
        queue,
        args_json,
        ..Default::default()
    };
    let saved = py
        .allow_threads(|| schedule::declare(&*store.inner, &row))
        .py_err()?;
    row_dict(py, &saved)
}

/// Every schedule (or `name`'s) as dicts, by name.
#[pyfunction]
#[pyo3(signature = (store, name=None))]
pub fn schedules_list<'py>(
    py: Python<'py>,
    store: &PyStore,
    name: Option<String>,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let rows = py
        .allow_threads(|| store.inner.schedules(name.as_deref()))
        .py_err()?;
    rows.iter().map(|r| row_dict(py, r)).collect()
}

/// Pauses or resumes a schedule (`ConfigError` for an unknown name).
#[pyfunction]
pub fn schedule_set_paused(
    py: Python<'_>,
    store: &PyStore,
    name: String,
    paused: bool,
) -> PyResult<()> {
    py.allow_threads(|| schedule::set_paused(&*store.inner, &name, paused))
        .py_err()
}

/// Deletes a schedule (`ConfigError` for an unknown name).
#[pyfunction]
pub fn schedule_delete(py: Python<'_>, store: &PyStore, name: String) -> PyResult<()> {
    py.allow_threads(|| {
        if store.inner.delete_schedule(&name)? {
            Ok(())
        } else {
            Err(schedule::unknown(&name))
        }
    })
    .py_err()
}

/// `(row, run_ids, ticks, next_fire)` of each due schedule of `flows` at
/// engine time `now` (default: the engine clock): the runs to start, oldest
/// first, and where the schedule moves after them.
type Firing<'py> = (Bound<'py, PyDict>, Vec<String>, Vec<f64>, Option<f64>);

#[pyfunction]
#[pyo3(signature = (store, flows, now=None))]
pub fn schedules_due<'py>(
    py: Python<'py>,
    store: &PyStore,
    flows: Vec<String>,
    now: Option<f64>,
) -> PyResult<Vec<Firing<'py>>> {
    let at = now.unwrap_or_else(clock::now);
    let firings = py
        .allow_threads(|| {
            let mut out = Vec::new();
            for row in store.inner.schedules(None)? {
                if !flows.contains(&row.flow) {
                    continue;
                }
                if let Some(f) = schedule::firing(&row, at)? {
                    out.push(f);
                }
            }
            Ok::<_, crate::error::CoreError>(out)
        })
        .py_err()?;
    firings
        .into_iter()
        .map(|f| {
            let ids = f
                .ticks
                .iter()
                .map(|t| schedule::tick_run_id(&f.row.name, *t))
                .collect();
            Ok((row_dict(py, &f.row)?, ids, f.ticks, f.next_fire))
        })
        .collect()
}

/// Moves a schedule's next fire from `from` (as read) to `next_fire`,
/// recording its last fired tick; false when another worker moved it first.
#[pyfunction]
#[pyo3(signature = (store, name, from, next_fire, tick=None, run_id=None))]
pub fn schedule_advance(
    py: Python<'_>,
    store: &PyStore,
    name: String,
    from: f64,
    next_fire: Option<f64>,
    tick: Option<f64>,
    run_id: Option<String>,
) -> PyResult<bool> {
    py.allow_threads(|| {
        let fired = tick.zip(run_id.as_deref());
        store.inner.advance_schedule(&name, from, next_fire, fired)
    })
    .py_err()
}

/// The earliest next fire of an active schedule of `flows`.
#[pyfunction]
pub fn schedules_next_fire(
    py: Python<'_>,
    store: &PyStore,
    flows: Vec<String>,
) -> PyResult<Option<f64>> {
    py.allow_threads(|| {
        let rows = store.inner.schedules(None)?;
        Ok::<_, crate::error::CoreError>(
            rows.iter()
                .filter(|r| !r.paused && flows.contains(&r.flow))
                .filter_map(|r| r.next_fire)
                .reduce(f64::min),
        )
    })
    .py_err()
}

/// Records that this process (a worker) serves `flows` now; with none,
/// forgets it.
#[pyfunction]
pub fn serve_flows(py: Python<'_>, store: &PyStore, flows: Vec<String>) -> PyResult<()> {
    py.allow_threads(|| {
        store
            .inner
            .serve_flows(owner_id(), &flows, crate::time::now())
    })
    .py_err()
}

/// The flows a worker reported serving within the last `within` seconds.
#[pyfunction]
pub fn served_flows(py: Python<'_>, store: &PyStore, within: f64) -> PyResult<Vec<String>> {
    py.allow_threads(|| store.inner.served_flows(crate::time::now() - within))
        .py_err()
}

/// The run id of a schedule's tick.
#[pyfunction]
pub fn schedule_run_id(name: &str, tick: f64) -> String {
    schedule::tick_run_id(name, tick)
}

/// The tick a schedule's run was started for, read from its id
/// (`sched:<name>:<tick>`, or the trigger time of `sched:<name>:manual:<ULID>`).
#[pyfunction]
pub fn scheduled_time_of(run_id: &str) -> Option<f64> {
    schedule::scheduled_time_of(run_id)
}

/// Checks a schedule's name, cron pattern and time zone without storing
/// anything (`ConfigError` naming what is wrong).
#[pyfunction]
pub fn schedule_check(name: &str, cron: &str, timezone: &str) -> PyResult<()> {
    schedule::check_name(name).py_err()?;
    schedule::parse(cron, timezone).map(|_| ()).py_err()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    for f in [
        wrap_pyfunction!(schedule_declare, m)?,
        wrap_pyfunction!(schedules_list, m)?,
        wrap_pyfunction!(schedule_set_paused, m)?,
        wrap_pyfunction!(schedule_delete, m)?,
        wrap_pyfunction!(schedules_due, m)?,
        wrap_pyfunction!(schedule_advance, m)?,
        wrap_pyfunction!(schedules_next_fire, m)?,
        wrap_pyfunction!(serve_flows, m)?,
        wrap_pyfunction!(served_flows, m)?,
        wrap_pyfunction!(schedule_run_id, m)?,
        wrap_pyfunction!(schedule_check, m)?,
        wrap_pyfunction!(scheduled_time_of, m)?,
    ] {
        m.add_function(f)?;
    }
    Ok(())
}
