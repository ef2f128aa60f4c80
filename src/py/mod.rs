//! The `composeai._core` extension module: every exported class and
//! function is listed here.

mod answer;
mod attempt;
mod budget;
mod codec;
mod durable;
mod errors;
mod graph;
mod offloop;
mod published;
mod query;
mod queue;
mod rows;
mod schedule;
mod span_tap;
mod spans;
mod sqlite_lib;
mod step;
mod store;
mod trace;
mod upgrade;

use pyo3::prelude::*;

/// A new ULID (26 characters, Crockford base32, monotonic in this process).
#[pyfunction(name = "ulid")]
fn new_ulid() -> String {
    crate::ids::new_ulid()
}

/// The hash a step identity keeps of its encoded arguments (issue 27).
#[pyfunction]
fn step_digest(text: &str) -> u64 {
    crate::journal::digest(text)
}

/// The SHA-256 of `text`'s UTF-8 bytes, as 64 lowercase hex digits: flow
/// fingerprints (FLOW-9) and request hashes (TEST-22).
#[pyfunction]
fn sha256_hex(py: Python<'_>, text: &str) -> String {
    use sha2::{Digest, Sha256};
    use std::fmt::Write;
    let digest = py.allow_threads(|| Sha256::digest(text.as_bytes()));
    let mut out = String::with_capacity(64);
    for byte in digest {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

/// The first span-persistence failure since the last call, if any.
#[pyfunction]
fn take_span_write_error() -> Option<String> {
    crate::store::slot::take_span_write_error()
}

/// Waits (GIL released, at most `timeout` seconds) until the store
/// outage state moves past generation `seen`; returns `(generation, down,
/// back)`: `down` is `(since, store, cause)` while a store is unreachable,
/// `back` is `(at, seconds it lasted)` of the last outage that ended.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn store_outage_wait(
    py: Python<'_>,
    seen: u64,
    timeout: f64,
) -> (u64, Option<(f64, String, String)>, Option<(f64, f64)>) {
    let wait = std::time::Duration::from_secs_f64(timeout.max(0.0));
    let (generation, down, back) = py.allow_threads(|| crate::outage::wait_change(seen, wait));
    (generation, down.map(|d| (d.since, d.store, d.why)), back)
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    sqlite_lib::load(py)?;
    py.import("atexit")?.call_method1(
        "register",
        (wrap_pyfunction!(offloop::settle_deliveries, py)?,),
    )?;
    m.add_class::<store::PyStore>()?;
    m.add_class::<attempt::PyAttempt>()?;
    m.add_class::<attempt::PyFence>()?;
    m.add_class::<budget::PyBudgetMeter>()?;
    m.add_function(wrap_pyfunction!(new_ulid, m)?)?;
    m.add_function(wrap_pyfunction!(sha256_hex, m)?)?;
    m.add_function(wrap_pyfunction!(step_digest, m)?)?;
    m.add_function(wrap_pyfunction!(store::store_target, m)?)?;
    m.add_function(wrap_pyfunction!(store::migrate_store, m)?)?;
    m.add_function(wrap_pyfunction!(take_span_write_error, m)?)?;
    m.add_function(wrap_pyfunction!(store_outage_wait, m)?)?;
    m.add_function(wrap_pyfunction!(span_tap::set_span_tap, m)?)?;
    m.add_function(wrap_pyfunction!(sqlite_lib::sqlite_library, m)?)?;
    m.add_function(wrap_pyfunction!(errors::register_errors, m)?)?;
    m.add_function(wrap_pyfunction!(codec::register_decoder, m)?)?;
    m.add_function(wrap_pyfunction!(codec::loads_plain, m)?)?;
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
    m.add_function(wrap_pyfunction!(query::otel_view, m)?)?;
    m.add_function(wrap_pyfunction!(query::span_view, m)?)?;
    answer::register(m)?;
    durable::register(m)?;
    step::register(m)?;
    queue::register(m)?;
    schedule::register(m)?;
    upgrade::register(m)?;
    published::register(m)?;
    m.add_class::<graph::PyGraphDef>()?;
    m.add_class::<graph::PyGraphRun>()?;
    for f in [
        wrap_pyfunction!(graph::graph_compile, m)?,
        wrap_pyfunction!(graph::graph_open, m)?,
        wrap_pyfunction!(graph::graph_aopen, m)?,
        wrap_pyfunction!(graph::graph_from_snapshot, m)?,
        wrap_pyfunction!(graph::graph_check_resume, m)?,
        wrap_pyfunction!(graph::graph_run_head, m)?,
        wrap_pyfunction!(graph::graph_arun_head, m)?,
        wrap_pyfunction!(graph::graph_answered_nodes, m)?,
        wrap_pyfunction!(graph::graph_aanswered_nodes, m)?,
        wrap_pyfunction!(graph::thread_claim, m)?,
        wrap_pyfunction!(graph::thread_start, m)?,
        wrap_pyfunction!(graph::thread_astart, m)?,
        wrap_pyfunction!(graph::thread_aclaim, m)?,
        wrap_pyfunction!(graph::thread_arelease, m)?,
        wrap_pyfunction!(graph::thread_ainfo, m)?,
        wrap_pyfunction!(graph::thread_acheck_resume, m)?,
        wrap_pyfunction!(graph::thread_aaudit_add, m)?,
        wrap_pyfunction!(graph::thread_release, m)?,
        wrap_pyfunction!(graph::thread_info, m)?,
        wrap_pyfunction!(graph::thread_state, m)?,
        wrap_pyfunction!(graph::thread_history, m)?,
        wrap_pyfunction!(graph::thread_history_any, m)?,
        wrap_pyfunction!(graph::thread_rewind, m)?,
        wrap_pyfunction!(graph::thread_rewind_any, m)?,
        wrap_pyfunction!(graph::thread_fork, m)?,
        wrap_pyfunction!(graph::thread_delete, m)?,
        wrap_pyfunction!(graph::thread_prune, m)?,
        wrap_pyfunction!(graph::thread_list, m)?,
        wrap_pyfunction!(graph::thread_audit_add, m)?,
        wrap_pyfunction!(graph::thread_audit, m)?,
        wrap_pyfunction!(graph::thread_check_resume, m)?,
    ] {
        m.add_function(f)?;
    }
    Ok(())
}
