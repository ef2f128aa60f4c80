//! `compose answer` (and the web UI's Approve / Deny): answers to a run's
//! interrupts journaled outside any attempt (see `store::answer`).

use super::errors::IntoPy;
use super::store::PyStore;
use crate::clock;
use crate::store::answer::Answered;
use pyo3::prelude::*;

/// Journals `answers` (`(interrupt id, journal key, value JSON)`, ids
/// already resolved) for run `run_id` in one transaction, first write wins,
/// under `__interrupt__:<journal key>`, and deletes their pending rows. Returns `None` when there is no such run, else
/// `([(id, stored, value_json)], due)`: `due` when the run is now due for
/// a worker.
#[pyfunction]
pub fn answer_interrupts(
    py: Python<'_>,
    store: &PyStore,
    run_id: &str,
    answers: Vec<(String, String, String)>,
) -> PyResult<Option<Answered>> {
    let found = py
        .allow_threads(|| match (&store.sqlite, &store.pg) {
            (Some(s), _) => crate::store::sqlite::answer::answer_interrupts(s, run_id, &answers),
            (None, Some(pg)) => pg.answer_interrupts(run_id, &answers),
            (None, None) => Ok(None),
        })
        .py_err()?;
    if found.as_ref().is_some_and(|f| f.1) {
        // A worker of this process blocked in `wait_for_work` looks again.
        clock::poke();
    }
    Ok(found)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(answer_interrupts, m)?)
}
