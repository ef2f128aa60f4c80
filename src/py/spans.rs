//! Span rows to and from Python tuples.
//!
//! A span crosses the boundary as a 14-tuple:
//! `(span_id, parent_span_id, kind, name, started_at, ended_at, status,
//! replayed, step_key, attributes_json, usage, error_json, input_json,
//! output_json)` where `usage` is `None` or `(input_tokens, output_tokens,
//! cache_read_tokens, cache_creation_tokens, reasoning_tokens, cost_usd,
//! cost_complete)`.

use super::errors::value_error;
use crate::store::{SpanRow, UsageRow};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

pub const SPAN_FIELDS: usize = 14;

pub type UsageTuple = (i64, i64, i64, i64, i64, Option<f64>, bool);

pub fn usage_from_tuple(t: UsageTuple) -> UsageRow {
    UsageRow {
        input_tokens: t.0,
        output_tokens: t.1,
        cache_read_tokens: t.2,
        cache_creation_tokens: t.3,
        reasoning_tokens: t.4,
        cost_usd: t.5,
        cost_complete: t.6,
    }
}

/// `obj` as a tuple of exactly `n` fields, else a `ValueError` naming `what`.
pub fn fields<'a, 'py>(
    obj: &'a Bound<'py, PyAny>,
    n: usize,
    what: &str,
) -> PyResult<&'a Bound<'py, PyTuple>> {
    let t = obj.downcast::<PyTuple>()?;
    if t.len() != n {
        return Err(value_error(format!(
            "{what} must have {n} fields, got {}",
            t.len()
        )));
    }
    Ok(t)
}

pub fn span_from_py(obj: &Bound<'_, PyAny>) -> PyResult<SpanRow> {
    let t = fields(obj, SPAN_FIELDS, "span record")?;
    let usage: Option<UsageTuple> = t.get_item(10)?.extract()?;
    Ok(SpanRow {
        span_id: t.get_item(0)?.extract()?,
        parent_span_id: t.get_item(1)?.extract()?,
        kind: t.get_item(2)?.extract()?,
        name: t.get_item(3)?.extract()?,
        started_at: t.get_item(4)?.extract()?,
        ended_at: t.get_item(5)?.extract()?,
        status: t.get_item(6)?.extract()?,
        replayed: t.get_item(7)?.extract()?,
        step_key: t.get_item(8)?.extract()?,
        attributes_json: t.get_item(9)?.extract()?,
        usage: usage.map(usage_from_tuple),
        error_json: t.get_item(11)?.extract()?,
        input_json: t.get_item(12)?.extract()?,
        output_json: t.get_item(13)?.extract()?,
    })
}
