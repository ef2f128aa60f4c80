//! The `composeai._core` extension module: every exported class and
//! function is listed here.

mod attempt;
mod budget;
mod durable;
mod errors;
mod query;
mod spans;
mod store;
mod trace;

use pyo3::prelude::*;

/// A new ULID (26 characters, Crockford base32, monotonic in this process).
#[pyfunction(name = "ulid")]
fn new_ulid() -> String {
    crate::ids::new_ulid()
}

/// The first span-persistence failure since the last call, if any.
#[pyfunction]
fn take_span_write_error() -> Option<String> {
    crate::store::sqlite::take_span_write_error()
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<store::PyStore>()?;
    m.add_class::<attempt::PyAttempt>()?;
    m.add_class::<attempt::PyFence>()?;
    m.add_class::<budget::PyBudgetMeter>()?;
    m.add_function(wrap_pyfunction!(new_ulid, m)?)?;
    m.add_function(wrap_pyfunction!(store::store_target, m)?)?;
    m.add_function(wrap_pyfunction!(store::migrate_store, m)?)?;
    m.add_function(wrap_pyfunction!(take_span_write_error, m)?)?;
    m.add_function(wrap_pyfunction!(errors::register_errors, m)?)?;
    m.add_function(wrap_pyfunction!(trace::render_tree, m)?)?;
    m.add_function(wrap_pyfunction!(trace::render_mermaid, m)?)?;
    m.add_function(wrap_pyfunction!(trace::trace_status, m)?)?;
    m.add_function(wrap_pyfunction!(query::query_runs, m)?)?;
    m.add_function(wrap_pyfunction!(query::resolve_run, m)?)?;
    m.add_function(wrap_pyfunction!(query::trace_view, m)?)?;
    m.add_function(wrap_pyfunction!(query::search_runs, m)?)?;
    m.add_function(wrap_pyfunction!(query::llm_costs, m)?)?;
    m.add_function(wrap_pyfunction!(query::diff_view, m)?)?;
    m.add_function(wrap_pyfunction!(query::export_view, m)?)?;
    durable::register(m)?;
    Ok(())
}
