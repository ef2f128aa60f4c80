//! Store rows as the Python layer receives them.

use crate::store::{InterruptRow, RunRow};
use pyo3::prelude::*;
use pyo3::types::PyDict;

pub fn run_row_dict<'py>(py: Python<'py>, r: &RunRow) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("run_id", &r.run_id)?;
    d.set_item("kind", &r.kind)?;
    d.set_item("name", &r.name)?;
    d.set_item("status", &r.status)?;
    d.set_item("created_at", r.created_at)?;
    d.set_item("updated_at", r.updated_at)?;
    d.set_item("trace_id", &r.trace_id)?;
    d.set_item("fingerprint", &r.fingerprint)?;
    d.set_item("args_json", &r.args_json)?;
    d.set_item("output_json", &r.output_json)?;
    d.set_item("error_json", &r.error_json)?;
    d.set_item("budget_json", &r.budget_json)?;
    d.set_item("module", &r.module)?;
    Ok(d)
}

/// `(interrupt_id, kind, question, payload_json)`.
pub type PendingTuple = (String, String, Option<String>, Option<String>);

pub fn interrupt_tuple(p: InterruptRow) -> PendingTuple {
    (p.interrupt_id, p.kind, p.question, p.payload_json)
}
