//! `set_span_tap(callback)`: a Python callable as the span tap
//! (`crate::span_tap`), for OpenTelemetry export.
//!
//! The callable gets one 16-tuple per finished span: `(trace_id, run_id,
//! span_id, parent_span_id, kind, name, started_at, ended_at, status,
//! replayed, step_key, attributes_json, usage, error_json, input_json,
//! output_json)`, `usage` as in `spans.rs`. It is called on the thread that
//! ended the span; what it raises is reported as unraisable and dropped (a
//! span's export never fails the step).

use crate::span_tap::{Tap, Tapped};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use std::sync::Arc;

pub(super) fn span_tuple<'py>(py: Python<'py>, t: &Tapped<'_>) -> PyResult<Bound<'py, PyTuple>> {
    let s = t.span;
    let usage = s.usage.as_ref().map(|u| {
        (
            u.input_tokens,
            u.output_tokens,
            u.cache_read_tokens,
            u.cache_creation_tokens,
            u.reasoning_tokens,
            u.cost_usd,
            u.cost_complete,
        )
    });
    let items: [Bound<'py, PyAny>; 16] = [
        t.trace_id.into_pyobject(py)?.into_any(),
        t.run_id.into_pyobject(py)?.into_any(),
        s.span_id.as_str().into_pyobject(py)?.into_any(),
        s.parent_span_id.as_deref().into_pyobject(py)?.into_any(),
        s.kind.as_str().into_pyobject(py)?.into_any(),
        s.name.as_str().into_pyobject(py)?.into_any(),
        s.started_at.into_pyobject(py)?.into_any(),
        s.ended_at.into_pyobject(py)?.into_any(),
        s.status.as_str().into_pyobject(py)?.into_any(),
        s.replayed.into_pyobject(py)?.to_owned().into_any(),
        s.step_key.as_deref().into_pyobject(py)?.into_any(),
        s.attributes_json.as_deref().into_pyobject(py)?.into_any(),
        usage.into_pyobject(py)?.into_any(),
        s.error_json.as_deref().into_pyobject(py)?.into_any(),
        s.input_json.as_deref().into_pyobject(py)?.into_any(),
        s.output_json.as_deref().into_pyobject(py)?.into_any(),
    ];
    PyTuple::new(py, items)
}

/// Sets the span tap to `callback`, or removes it with `None`.
#[pyfunction]
pub fn set_span_tap(callback: Option<PyObject>) {
    let tap = callback.map(|callback| -> Tap {
        Arc::new(move |t: &Tapped<'_>| {
            Python::with_gil(|py| {
                if let Err(e) = span_tuple(py, t).and_then(|r| callback.call1(py, (r,))) {
                    e.write_unraisable(py, None);
                }
            })
        })
    });
    crate::span_tap::set(tap);
}
