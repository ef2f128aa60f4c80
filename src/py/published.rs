//! Reading runs from outside (OPS-20 … OPS-23): the run listing, events
//! and streams a run publishes, and retention. A reader waits on the
//! store's wake-up mechanism (the listener's hint on PostgreSQL; on
//! SQLite the change marker, and this process's own publications), with
//! the GIL released, in slices the caller bounds so an interrupt reaches
//! Python between them.

use super::attempt::{PyAttempt, PyFence};
use super::errors::IntoPy;
use super::rows::run_row_dict;
use super::store::PyStore;
use crate::clock;
use crate::error::{CoreError, CoreResult};
use crate::store::published::{announced, await_announcement, ListedRun, PruneFilter, Published};
use crate::store::query::RunFilter;
use crate::store::{RunRow, Store};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Whether a stream reader of `run` is done waiting: the run completed,
/// failed or was cancelled, or waits for an answer (an approval, a
/// question). A run parked on a timer or a signal is continued by a worker
/// without anyone's help, and an answered run is due: their readers wait
/// on. (A run a worker continues keeps its `paused` row until it settles
/// again; its answered interrupts are no longer pending.)
fn settled(store: &Source, run: &RunRow) -> CoreResult<bool> {
    Ok(match run.status.as_str() {
        "paused" => store
            .inner
            .pending(run.rid)?
            .iter()
            .any(|p| p.kind != "timer" && p.kind != "signal"),
        status => FINAL.contains(&status),
    })
}

/// The statuses after which a run never publishes again.
const FINAL: [&str; 3] = ["completed", "failed", "cancelled"];

fn run_of(store: &dyn Store, run_id: &str) -> CoreResult<RunRow> {
    store.get_run(run_id)?.ok_or_else(|| {
        CoreError::Config(format!(
            "no run found with run_id '{run_id}' -- check the id (compose runs lists them) and \
             that this process uses the run's store (COMPOSE_DIR / COMPOSE_STORE)"
        ))
    })
}

/// What has changed in the store before a read, so a wait after it misses
/// nothing committed in between.
struct Seen {
    epoch: u64,
    announced: u64,
    marker: Option<i64>,
}

/// The store a reader reads, and whether its wake-ups are notifications.
#[derive(Clone)]
struct Source {
    inner: Arc<dyn Store>,
    notified: bool,
}

impl Source {
    fn of(store: &PyStore) -> Source {
        Source {
            inner: store.inner.clone(),
            notified: store.pg.is_some(),
        }
    }
}

fn seen(store: &Source) -> CoreResult<Seen> {
    Ok(Seen {
        epoch: clock::epoch(),
        announced: announced(),
        marker: if store.notified {
            None
        } else {
            Some(store.inner.change_marker()?)
        },
    })
}

/// Sleeps until something may have been published since `seen`, or
/// `limit` passed.
fn wait_change(store: &Source, seen: &Seen, limit: Duration) -> CoreResult<()> {
    let slice = store.inner.wait_slice();
    let start = Instant::now();
    loop {
        let left = limit.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Ok(());
        }
        match seen.marker {
            // PostgreSQL: the listener turns notifications into pokes.
            None => {
                if clock::epoch() != seen.epoch {
                    return Ok(());
                }
                clock::nap(None, left.min(slice));
            }
            Some(marker) => {
                if await_announcement(seen.announced, left.min(slice))
                    || store.inner.change_marker()? != marker
                {
                    return Ok(());
                }
            }
        }
    }
}

fn seconds(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
}

/// Journals a publishing step of the attempt: `what` is `"event"`,
/// `"append"` or `"close"`, `name` the event or stream key. Returns the
/// stored journal value.
#[pyfunction]
#[pyo3(signature = (attempt, key, value_json, what, name, item_json, fence=None))]
#[allow(clippy::too_many_arguments)]
fn attempt_publish(
    py: Python<'_>,
    attempt: &PyAttempt,
    key: &str,
    value_json: &str,
    what: &str,
    name: &str,
    item_json: &str,
    fence: Option<&PyFence>,
) -> PyResult<String> {
    let item = match what {
        "event" => Published::Event {
            key: name,
            value: item_json,
        },
        "append" => Published::Append {
            key: name,
            value: item_json,
        },
        "close" => Published::Close { key: name },
        other => {
            return Err(super::errors::value_error(format!(
                "unknown publication {other:?}"
            )))
        }
    };
    let inner = attempt.inner.clone();
    let fence = fence.map(|f| f.inner.clone());
    py.allow_threads(|| inner.commit_published(key, value_json, &item, fence.as_ref()))
        .map(|v| v.to_string())
        .py_err()
}

/// Appends `values` (JSON) to stream `name` of the attempt's run,
/// unjournaled.
#[pyfunction]
fn attempt_append_stream(
    py: Python<'_>,
    attempt: &PyAttempt,
    name: &str,
    values: Vec<String>,
) -> PyResult<()> {
    let inner = attempt.inner.clone();
    py.allow_threads(|| inner.append_stream(name, &values))
        .py_err()
}

/// The latest value (JSON) of event `key` of run `run_id`, waiting up to
/// `wait` seconds for it to be set: `("found", value)`, `("final", None)`
/// when the run will never publish again, or `("waiting", None)`.
#[pyfunction]
fn event_wait(
    py: Python<'_>,
    store: &PyStore,
    run_id: &str,
    key: &str,
    wait: f64,
) -> PyResult<(&'static str, Option<String>)> {
    let store = Source::of(store);
    py.allow_threads(|| -> CoreResult<(&'static str, Option<String>)> {
        let start = Instant::now();
        let limit = seconds(wait);
        loop {
            let before = seen(&store)?;
            let run = run_of(&*store.inner, run_id)?;
            if let Some(v) = store.inner.event(run.rid, key)? {
                return Ok(("found", Some(v)));
            }
            if FINAL.contains(&run.status.as_str()) {
                return Ok(("final", None));
            }
            let left = limit.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Ok(("waiting", None));
            }
            wait_change(&store, &before, left)?;
        }
    })
    .py_err()
}

/// Every event of run `run_id`: `[(key, value JSON)]` by key.
#[pyfunction]
fn run_events(py: Python<'_>, store: &PyStore, run_id: &str) -> PyResult<Vec<(String, String)>> {
    let store = store.inner.clone();
    py.allow_threads(|| {
        let run = run_of(&*store, run_id)?;
        store.events(run.rid)
    })
    .py_err()
}

/// The values of stream `key` of run `run_id` after sequence number
/// `after`, at most `limit`, waiting up to `wait` seconds for one:
/// `([(seq, value JSON)], done)`, `done` once the stream is closed or the
/// run settled and every value was read.
#[pyfunction]
fn stream_read(
    py: Python<'_>,
    store: &PyStore,
    run_id: &str,
    key: &str,
    after: i64,
    limit: i64,
    wait: f64,
) -> PyResult<Chunk> {
    let store = Source::of(store);
    py.allow_threads(|| read_chunk(&store, run_id, key, after, limit, wait))
        .py_err()
}

/// `([(seq, value JSON)], done)`.
type Chunk = (Vec<(i64, String)>, bool);

fn read_chunk(
    store: &Source,
    run_id: &str,
    key: &str,
    after: i64,
    limit: i64,
    wait: f64,
) -> CoreResult<Chunk> {
    let start = Instant::now();
    let limit_wait = seconds(wait);
    loop {
        let before = seen(store)?;
        // The status is read before the values: a run settled by then
        // wrote every value the read below returns.
        let run = run_of(&*store.inner, run_id)?;
        let chunk = store.inner.stream_after(run.rid, key, after, limit)?;
        if !chunk.values.is_empty() {
            return Ok((chunk.values, false));
        }
        if chunk.closed || settled(store, &run)? {
            return Ok((Vec::new(), true));
        }
        let left = limit_wait.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Ok((Vec::new(), false));
        }
        wait_change(store, &before, left)?;
    }
}

/// `stream_read` for an async reader: resolves `future` (of the running
/// loop) with its outcome, the loop running meanwhile.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn astream_read(
    py: Python<'_>,
    store: &PyStore,
    future: Bound<'_, PyAny>,
    run_id: String,
    key: String,
    after: i64,
    limit: i64,
    wait: f64,
) -> PyResult<()> {
    let store = Source::of(store);
    super::offloop::resolve_with(
        py,
        future,
        move || read_chunk(&store, &run_id, &key, after, limit, wait),
        |py, chunk| Ok(chunk.into_pyobject(py)?.into_any().unbind()),
    )
}

fn listed_dict<'py>(py: Python<'py>, l: &ListedRun) -> PyResult<Bound<'py, PyDict>> {
    let d = run_row_dict(py, &l.summary.run)?;
    d.set_item("tokens", l.summary.tokens)?;
    d.set_item("input_tokens", l.summary.input_tokens)?;
    d.set_item("output_tokens", l.summary.output_tokens)?;
    d.set_item("cost_usd", l.summary.cost_usd)?;
    d.set_item("cost_complete", l.summary.cost_complete)?;
    d.set_item("pending", &l.pending)?;
    d.set_item("queue", &l.queue)?;
    d.set_item("parent_id", &l.parent_id)?;
    Ok(d)
}

/// Runs matching the filters, newest first (OPS-20): dicts of the run
/// row with usage, pending interrupt ids, queue and fork origin. `before`
/// is the id of the last run of the previous page.
#[pyfunction]
#[pyo3(signature = (store, status, kind, name, since, until, query, limit, before))]
#[allow(clippy::too_many_arguments)]
fn list_runs<'py>(
    py: Python<'py>,
    store: &PyStore,
    status: Vec<String>,
    kind: Vec<String>,
    name: Option<String>,
    since: Option<f64>,
    until: Option<f64>,
    query: Option<String>,
    limit: i64,
    before: Option<String>,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let rows = py
        .allow_threads(|| -> CoreResult<Vec<ListedRun>> {
            let before = match before {
                None => None,
                Some(id) => {
                    let run = store.inner.get_run(&id)?.ok_or_else(|| {
                        CoreError::Config(format!(
                            "list_runs(before={id:?}): no run found with that id -- pass the id \
                             of the last run of the previous page"
                        ))
                    })?;
                    Some((run.created_at, run.run_id))
                }
            };
            let filter = RunFilter {
                status,
                kind,
                name,
                since,
                until,
                before,
                limit,
            };
            store.inner.list_runs(&filter, query.as_deref())
        })
        .py_err()?;
    rows.iter().map(|l| listed_dict(py, l)).collect()
}

/// Deletes settled runs last updated before `older_than` (Unix seconds)
/// with every row that belongs to them, `batch` runs per transaction;
/// returns how many (with `dry_run`, how many would be).
#[pyfunction]
#[pyo3(signature = (store, older_than, statuses, name, kind, dry_run, batch))]
#[allow(clippy::too_many_arguments)]
fn prune_runs(
    py: Python<'_>,
    store: &PyStore,
    older_than: f64,
    statuses: Vec<String>,
    name: Option<String>,
    kind: Option<String>,
    dry_run: bool,
    batch: usize,
) -> PyResult<u64> {
    let filter = PruneFilter {
        older_than,
        statuses,
        name,
        kind,
        batch,
    };
    py.allow_threads(|| store.inner.prune_runs(&filter, dry_run))
        .py_err()
}

/// Returns free pages to the file system: `(bytes before, bytes after)`
/// of a SQLite file, `None` for a server store.
#[pyfunction]
fn compact_store(py: Python<'_>, store: &PyStore) -> PyResult<Option<(u64, u64)>> {
    py.allow_threads(|| store.inner.compact()).py_err()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    for f in [
        wrap_pyfunction!(attempt_publish, m)?,
        wrap_pyfunction!(attempt_append_stream, m)?,
        wrap_pyfunction!(event_wait, m)?,
        wrap_pyfunction!(run_events, m)?,
        wrap_pyfunction!(stream_read, m)?,
        wrap_pyfunction!(astream_read, m)?,
        wrap_pyfunction!(list_runs, m)?,
        wrap_pyfunction!(prune_runs, m)?,
        wrap_pyfunction!(compact_store, m)?,
    ] {
        m.add_function(f)?;
    }
    Ok(())
}
