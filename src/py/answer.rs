//! `compose answer` (and the web UI's Approve / Deny): answers to a run's
//! interrupts journaled outside any attempt (see `store::answer`).

use super::errors::IntoPy;
use super::store::PyStore;
use crate::clock;
use crate::store::answer::{suspension_head, AnswerOutcome};
use crate::store::Store;
use pyo3::prelude::*;
use pyo3::IntoPyObjectExt;
use std::sync::Arc;

/// Journals `answers` (`(interrupt id, value JSON)`, ids already resolved)
/// for run `run_id` in one transaction, first write wins, and deletes their
/// pending rows; a graph answer is keyed by the suspension the run is
/// paused at, read in that transaction, and refused unless it is `at` (when
/// given). Returns `(outcome, value)`: `("answered", ([(id, stored,
/// value_json)], due))` (`due`: the run is now due for a worker),
/// `("no_run", None)`, `("superseded", head or None)` or
/// `("not_pending", id)`; only `answered` stored anything.
#[pyfunction]
#[pyo3(signature = (store, run_id, answers, at=None))]
pub fn answer_interrupts(
    py: Python<'_>,
    store: &PyStore,
    run_id: &str,
    answers: Vec<(String, String)>,
    at: Option<String>,
) -> PyResult<(&'static str, PyObject)> {
    let s: Arc<dyn Store> = store.inner.clone();
    let outcome = py
        .allow_threads(move || s.answer_interrupts(run_id, &answers, at.as_deref()))
        .py_err()?;
    Ok(match outcome {
        AnswerOutcome::NoRun => ("no_run", py.None()),
        AnswerOutcome::Answered(found) => {
            if found.1 {
                // A worker of this process blocked in `wait_for_work` looks again.
                clock::poke();
            }
            ("answered", found.into_py_any(py)?)
        }
        AnswerOutcome::Superseded(head) => ("superseded", head.into_py_any(py)?),
        AnswerOutcome::NotPending(id) => ("not_pending", id.into_py_any(py)?),
    })
}

/// The checkpoint graph run `run_id` is suspended at (its thread's head
/// for a run kept in a thread), which answers given from outside are keyed
/// by; `None` when it has none or there is no such run.
#[pyfunction]
pub fn graph_suspension_head(
    py: Python<'_>,
    store: &PyStore,
    run_id: &str,
) -> PyResult<Option<String>> {
    let s: Arc<dyn Store> = store.inner.clone();
    py.allow_threads(move || {
        let Some(run) = s.get_run(run_id)? else {
            return Ok(None);
        };
        let mut out = None;
        s.read(&mut |tx| {
            out = suspension_head(tx, run_id, run.rid, run.args_json.as_deref())?;
            Ok(())
        })?;
        Ok(out)
    })
    .py_err()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(answer_interrupts, m)?)?;
    m.add_function(wrap_pyfunction!(graph_suspension_head, m)?)
}
