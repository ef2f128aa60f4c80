//! Trace rendering for `composeai.tracing` (OBS-16, OBS-20 … OBS-25).
//!
//! A span crosses the boundary as an 11-tuple:
//! `(span_id, parent_span_id, kind, name, started_at, ended_at, status,
//! replayed, error_type, error_message, usage)` where `usage` is `None` or
//! `(input_tokens, output_tokens, cache_read_tokens, cache_creation_tokens,
//! reasoning_tokens, cost_usd, cost_complete)`.

use super::spans::{fields, usage_from_tuple, UsageTuple};
use crate::trace::{self, RenderSpan};
use pyo3::prelude::*;

const RENDER_FIELDS: usize = 11;

fn render_span_from_py(obj: &Bound<'_, PyAny>) -> PyResult<RenderSpan> {
    let t = fields(obj, RENDER_FIELDS, "render span")?;
    let usage: Option<UsageTuple> = t.get_item(10)?.extract()?;
    Ok(RenderSpan {
        span_id: t.get_item(0)?.extract()?,
        parent_span_id: t.get_item(1)?.extract()?,
        kind: t.get_item(2)?.extract()?,
        name: t.get_item(3)?.extract()?,
        started_at: t.get_item(4)?.extract()?,
        ended_at: t.get_item(5)?.extract()?,
        status: t.get_item(6)?.extract()?,
        replayed: t.get_item(7)?.extract()?,
        error_type: t.get_item(8)?.extract()?,
        error_message: t.get_item(9)?.extract()?,
        usage: usage.map(usage_from_tuple),
    })
}

fn spans_from_py(spans: &[Bound<'_, PyAny>]) -> PyResult<Vec<RenderSpan>> {
    spans.iter().map(render_span_from_py).collect()
}

/// The tree view of a trace (OBS-20 … OBS-24), no trailing newline.
#[pyfunction]
pub fn render_tree(
    py: Python<'_>,
    trace_id: &str,
    spans: Vec<Bound<'_, PyAny>>,
    color: bool,
) -> PyResult<String> {
    let spans = spans_from_py(&spans)?;
    let trace_id = trace_id.to_owned();
    Ok(py.allow_threads(move || trace::render_tree(&trace_id, &spans, color)))
}

/// The Mermaid flowchart of a trace (OBS-25), no trailing newline.
#[pyfunction]
pub fn render_mermaid(py: Python<'_>, spans: Vec<Bound<'_, PyAny>>) -> PyResult<String> {
    let spans = spans_from_py(&spans)?;
    Ok(py.allow_threads(move || trace::render_mermaid(&spans)))
}

/// The trace status of OBS-16.
#[pyfunction]
pub fn trace_status(spans: Vec<Bound<'_, PyAny>>) -> PyResult<&'static str> {
    let spans = spans_from_py(&spans)?;
    Ok(trace::trace_status(&spans))
}
