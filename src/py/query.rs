//! Queries for the `compose` CLI (OBS-30 … OBS-35).
//!
//! Each function takes the database path and never creates a store: a
//! missing file is reported as the outcome `"no_store"` (or `None`).
//! Errors raise `composeai.errors.ConfigError`/`SerializationError`
//! directly, so the CLI does not depend on `register_errors` having run.

use super::errors::to_py;
use super::rows::{run_row_dict, PendingTuple};
use super::spans::UsageTuple;
use crate::error::{CoreError, CoreResult};
use crate::store::postgres::PgStore;
use crate::store::query::{CostBucket, CostsBy, Resolved, RunFilter, RunSummary, StoredSpan};
use crate::store::sqlite::open_connection;
use crate::store::sqlite::query::{self, SearchError};
use crate::store::url::{self, StoreUrl};
use crate::store::{InterruptRow, RunRow};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use rusqlite::Connection;

fn sql(path: &str) -> impl Fn(rusqlite::Error) -> CoreError + '_ {
    move |e| CoreError::Store(format!("composeai store '{path}': {e}"))
}

/// The store a CLI query reads: a SQLite file or a PostgreSQL database
/// (STORE-2), with the same rows from either.
enum Source {
    Sqlite(Connection, String),
    Postgres(PgStore),
}

impl Source {
    fn list_runs(&self, f: &RunFilter) -> CoreResult<Vec<RunSummary>> {
        match self {
            Source::Sqlite(c, p) => query::list_runs(c, f).map_err(sql(p)),
            Source::Postgres(pg) => pg.cli_list_runs(f, None),
        }
    }

    fn last_run(&self) -> CoreResult<Option<RunRow>> {
        match self {
            Source::Sqlite(c, p) => query::last_run(c).map_err(sql(p)),
            Source::Postgres(pg) => pg.cli_last_run(),
        }
    }

    fn resolve_run(&self, id: &str) -> CoreResult<Resolved> {
        match self {
            Source::Sqlite(c, p) => query::resolve_run(c, id).map_err(sql(p)),
            Source::Postgres(pg) => pg.cli_resolve_run(id),
        }
    }

    /// The spans of `trace_id`, the trace of run `rid`.
    fn trace(&self, rid: i64, trace_id: &str, with_payloads: bool) -> CoreResult<Vec<StoredSpan>> {
        match self {
            Source::Sqlite(c, p) if with_payloads => {
                query::trace_spans_with_payloads(c, rid, trace_id).map_err(sql(p))
            }
            Source::Sqlite(c, p) => Ok(query::trace_spans(c, rid, trace_id)
                .map_err(sql(p))?
                .into_iter()
                .map(|span| StoredSpan {
                    span,
                    ..Default::default()
                })
                .collect()),
            Source::Postgres(pg) => pg.cli_trace(trace_id, with_payloads),
        }
    }

    /// The run's events (OPS-21): `(key, latest value JSON)` by key.
    fn events(&self, rid: i64) -> CoreResult<Vec<(String, String)>> {
        match self {
            Source::Sqlite(c, p) => c
                .prepare_cached(
                    "SELECT key, value_json FROM run_events WHERE rid = ?1 ORDER BY key",
                )
                .and_then(|mut st| {
                    st.query_map([rid], |r| Ok((r.get(0)?, r.get(1)?)))?
                        .collect()
                })
                .map_err(sql(p)),
            Source::Postgres(pg) => crate::store::published::PublishStore::events(pg, rid),
        }
    }

    fn pending(&self, rid: i64) -> CoreResult<Vec<InterruptRow>> {
        match self {
            Source::Sqlite(c, p) => query::pending_interrupts(c, rid).map_err(sql(p)),
            Source::Postgres(pg) => pg.cli_pending(rid),
        }
    }

    fn llm_costs(
        &self,
        by: CostsBy,
        since: Option<f64>,
    ) -> CoreResult<(Vec<CostBucket>, CostBucket)> {
        match self {
            Source::Sqlite(c, p) => query::llm_costs(c, by, since).map_err(sql(p)),
            Source::Postgres(pg) => pg.cli_llm_costs(by, since),
        }
    }
}

/// Opens the store at `path` (a SQLite file, or a PostgreSQL URL) if it
/// exists (migrating an old SQLite file); `None` when there is none.
fn open_existing(path: &str) -> CoreResult<Option<Source>> {
    if path.starts_with("postgresql://") || path.starts_with("postgres://") {
        let StoreUrl::Postgres(url) = url::parse(path, "")? else {
            return Ok(None);
        };
        let pg = PgStore::connect(url)?;
        return Ok(pg.cli_has_store()?.then_some(Source::Postgres(pg)));
    }
    if !std::path::Path::new(path).exists() {
        return Ok(None);
    }
    open_connection(path, false).map(|c| Some(Source::Sqlite(c, path.to_string())))
}

fn summary_dict<'py>(py: Python<'py>, s: &RunSummary) -> PyResult<Bound<'py, PyDict>> {
    let d = run_row_dict(py, &s.run)?;
    d.set_item("tokens", s.tokens)?;
    d.set_item("cost_usd", s.cost_usd)?;
    d.set_item("cost_complete", s.cost_complete)?;
    Ok(d)
}

/// `compose runs` rows: every `runs` column plus `tokens`, `cost_usd` and
/// `cost_complete`, newest first; `None` when there is no store.
#[pyfunction]
#[pyo3(signature = (db_path, status=None, kind=None, since=None, limit=10, before=None))]
pub fn query_runs<'py>(
    py: Python<'py>,
    db_path: &str,
    status: Option<String>,
    kind: Option<String>,
    since: Option<f64>,
    limit: i64,
    before: Option<(f64, String)>,
) -> PyResult<Option<Vec<Bound<'py, PyDict>>>> {
    let filter = RunFilter {
        status: status.into_iter().collect(),
        kind: kind.into_iter().collect(),
        since,
        before,
        limit,
        ..RunFilter::default()
    };
    let rows = py
        .allow_threads(|| -> CoreResult<Option<Vec<RunSummary>>> {
            let Some(src) = open_existing(db_path)? else {
                return Ok(None);
            };
            src.list_runs(&filter).map(Some)
        })
        .map_err(to_py)?;
    match rows {
        None => Ok(None),
        Some(rows) => rows
            .iter()
            .map(|s| summary_dict(py, s))
            .collect::<PyResult<_>>()
            .map(Some),
    }
}

/// How a run id (or `--last`) resolved.
enum Lookup {
    NoStore,
    NotFound,
    Ambiguous(Vec<String>),
    Found(Box<(Source, RunRow)>),
}

fn lookup(path: &str, run_id: Option<&str>) -> CoreResult<Lookup> {
    let Some(src) = open_existing(path)? else {
        return Ok(Lookup::NoStore);
    };
    let found = match run_id {
        None => src.last_run()?.map(|r| Resolved::Found(Box::new(r))),
        Some(id) => Some(src.resolve_run(id)?),
    };
    Ok(match found {
        None | Some(Resolved::NotFound) => Lookup::NotFound,
        Some(Resolved::Ambiguous(ids)) => Lookup::Ambiguous(ids),
        Some(Resolved::Found(run)) => Lookup::Found(Box::new((src, *run))),
    })
}

/// Resolves a run id or prefix (OBS-30), or the newest run when `run_id`
/// is `None`. Returns `(outcome, value)`: `("no_store", None)`,
/// `("not_found", None)`, `("ambiguous", [ids, sorted])` or
/// `("found", run_dict)`.
#[pyfunction]
#[pyo3(signature = (db_path, run_id=None))]
pub fn resolve_run(
    py: Python<'_>,
    db_path: &str,
    run_id: Option<&str>,
) -> PyResult<(String, PyObject)> {
    let found = py
        .allow_threads(|| lookup(db_path, run_id))
        .map_err(to_py)?;
    Ok(match found {
        Lookup::NoStore => ("no_store".into(), py.None()),
        Lookup::NotFound => ("not_found".into(), py.None()),
        Lookup::Ambiguous(ids) => (
            "ambiguous".into(),
            ids.into_pyobject(py)?.into_any().unbind(),
        ),
        Lookup::Found(found) => (
            "found".into(),
            run_row_dict(py, &found.1)?.into_any().unbind(),
        ),
    })
}

struct TraceView {
    run: RunRow,
    text: String,
    pending: Vec<InterruptRow>,
    events: Vec<(String, String)>,
}

/// The whole data side of `compose trace` (OBS-32): resolves the run (the
/// newest when `run_id` is `None`), renders every span of its trace as a
/// tree (`fmt="tree"`) or Mermaid (`fmt="mermaid"`), and loads its pending
/// interrupts when it is paused. Returns `(outcome, value)` like
/// `resolve_run`, with `value` for `"found"` a dict `{run_id, status,
/// trace_id, text, pending: [(id, kind, question, payload_json)],
/// events: [(key, value_json)]}`.
#[pyfunction]
#[pyo3(signature = (db_path, run_id=None, fmt="tree", color=false))]
pub fn trace_view(
    py: Python<'_>,
    db_path: &str,
    run_id: Option<&str>,
    fmt: &str,
    color: bool,
) -> PyResult<(String, PyObject)> {
    let mermaid = match fmt {
        "tree" => false,
        "mermaid" => true,
        other => {
            return Err(super::errors::value_error(format!(
                "unknown trace format {other:?} (expected 'tree' or 'mermaid')"
            )))
        }
    };
    let view = py
        .allow_threads(|| -> CoreResult<Result<TraceView, Lookup>> {
            let (src, run) = match lookup(db_path, run_id)? {
                Lookup::Found(found) => *found,
                other => return Ok(Err(other)),
            };
            let trace_id = run.trace_id.clone().unwrap_or_default();
            let spans: Vec<_> = src
                .trace(run.rid, &trace_id, false)?
                .into_iter()
                .map(|s| s.span)
                .collect();
            let text = if mermaid {
                crate::trace::render_mermaid(&spans)
            } else {
                crate::trace::render_tree(&trace_id, &spans, color)
            };
            let pending = if run.status == "paused" {
                src.pending(run.rid)?
            } else {
                Vec::new()
            };
            let events = src.events(run.rid)?;
            Ok(Ok(TraceView {
                run,
                text,
                pending,
                events,
            }))
        })
        .map_err(to_py)?;
    let v = match view {
        Err(Lookup::NoStore) => return Ok(("no_store".into(), py.None())),
        Err(Lookup::Ambiguous(ids)) => {
            return Ok((
                "ambiguous".into(),
                ids.into_pyobject(py)?.into_any().unbind(),
            ))
        }
        Err(_) => return Ok(("not_found".into(), py.None())),
        Ok(v) => v,
    };
    let d = PyDict::new(py);
    d.set_item("run_id", &v.run.run_id)?;
    d.set_item("status", &v.run.status)?;
    d.set_item("trace_id", &v.run.trace_id)?;
    d.set_item("text", v.text)?;
    let pending: Vec<PendingTuple> = v
        .pending
        .into_iter()
        .map(super::rows::interrupt_tuple)
        .collect();
    d.set_item("pending", pending)?;
    d.set_item("events", v.events)?;
    Ok(("found".into(), d.into_any().unbind()))
}

/// The outcome of a search and its rows (or the query error).
type Searched = (&'static str, Result<Vec<RunSummary>, String>);

/// `compose runs -q` (OBS-31): brings the derived full-text index up to date,
/// then lists the runs owning a span whose name or payload matches the FTS5
/// query `query`, with the filters of `query_runs`. Returns
/// `(outcome, value)`: `("no_store", None)`, `("ok", rows)`,
/// `("unavailable", rows)` (FTS5 missing: `rows` are unfiltered by the
/// query) or `("bad_query", sqlite_message)`.
#[pyfunction]
#[pyo3(signature = (db_path, query, status=None, kind=None, since=None, limit=10, before=None))]
#[allow(clippy::too_many_arguments)]
pub fn search_runs(
    py: Python<'_>,
    db_path: &str,
    query: &str,
    status: Option<String>,
    kind: Option<String>,
    since: Option<f64>,
    limit: i64,
    before: Option<(f64, String)>,
) -> PyResult<(String, PyObject)> {
    let filter = RunFilter {
        status: status.into_iter().collect(),
        kind: kind.into_iter().collect(),
        since,
        before,
        limit,
        ..RunFilter::default()
    };
    let found = py
        .allow_threads(|| -> CoreResult<Option<Searched>> {
            let conn = match open_existing(db_path)? {
                None => return Ok(None),
                Some(Source::Postgres(pg)) => {
                    return Ok(Some(match pg.cli_search_runs(&filter, query)? {
                        Ok(rows) => ("ok", Ok(rows)),
                        Err(msg) => ("bad_query", Err(msg)),
                    }))
                }
                Some(Source::Sqlite(conn, _)) => conn,
            };
            Ok(Some(match query::search_runs(&conn, &filter, query) {
                Ok(rows) => ("ok", Ok(rows)),
                Err(SearchError::Unavailable) => (
                    "unavailable",
                    Ok(query::list_runs(&conn, &filter).map_err(sql(db_path))?),
                ),
                Err(SearchError::Syntax(msg)) => ("bad_query", Err(msg)),
                Err(SearchError::Sql(e)) => return Err(sql(db_path)(e)),
            }))
        })
        .map_err(to_py)?;
    Ok(match found {
        None => ("no_store".into(), py.None()),
        Some((outcome, Ok(rows))) => {
            let rows = rows
                .iter()
                .map(|s| summary_dict(py, s))
                .collect::<PyResult<Vec<_>>>()?;
            (outcome.into(), rows.into_pyobject(py)?.into_any().unbind())
        }
        Some((outcome, Err(msg))) => (outcome.into(), msg.into_pyobject(py)?.into_any().unbind()),
    })
}

type CostTuple = (String, i64, i64, Option<f64>, bool);

fn cost_tuple(b: CostBucket) -> CostTuple {
    (b.key, b.calls, b.tokens, b.cost_usd, b.incomplete)
}

/// `compose costs` (OBS-34): the `llm` spans (started at or after `since`)
/// bucketed `by` `"model"`, `"name"` or `"day"`. Returns `None` without a
/// store, else `(buckets sorted by key, total)`, each a tuple
/// `(key, calls, tokens, cost_usd | None, incomplete)`.
#[pyfunction]
#[pyo3(signature = (db_path, by="model", since=None))]
pub fn llm_costs(
    py: Python<'_>,
    db_path: &str,
    by: &str,
    since: Option<f64>,
) -> PyResult<Option<(Vec<CostTuple>, CostTuple)>> {
    let by = match by {
        "model" => CostsBy::Model,
        "name" => CostsBy::Name,
        "day" => CostsBy::Day,
        other => {
            return Err(super::errors::value_error(format!(
                "unknown costs bucket {other:?} (expected 'model', 'name' or 'day')"
            )))
        }
    };
    let found = py
        .allow_threads(|| -> CoreResult<_> {
            let Some(src) = open_existing(db_path)? else {
                return Ok(None);
            };
            src.llm_costs(by, since).map(Some)
        })
        .map_err(to_py)?;
    Ok(found.map(|(buckets, total)| {
        (
            buckets.into_iter().map(cost_tuple).collect(),
            cost_tuple(total),
        )
    }))
}

fn usage_tuple(s: &StoredSpan) -> Option<UsageTuple> {
    s.span.usage.as_ref().map(|u| {
        (
            u.input_tokens,
            u.output_tokens,
            u.cache_read_tokens,
            u.cache_creation_tokens,
            u.reasoning_tokens,
            u.cost_usd,
            u.cost_complete,
        )
    })
}

/// Resolves `run_id` (OBS-30) and loads spans for it with `load`, returning
/// `(outcome, value)` like `resolve_run`; for `"found"` the value is
/// `{"run_id", "trace_id", "spans"}`.
fn run_spans<'py, T: IntoPyObject<'py>>(
    py: Python<'py>,
    db_path: &str,
    run_id: &str,
    load: impl Fn(&Source, &RunRow) -> CoreResult<Vec<StoredSpan>> + Send + Sync,
    convert: impl Fn(&RunRow, StoredSpan) -> PyResult<T>,
) -> PyResult<(String, PyObject)> {
    let found = py
        .allow_threads(
            || -> CoreResult<Result<(RunRow, Vec<StoredSpan>), Lookup>> {
                let (src, run) = match lookup(db_path, Some(run_id))? {
                    Lookup::Found(found) => *found,
                    other => return Ok(Err(other)),
                };
                let spans = load(&src, &run)?;
                Ok(Ok((run, spans)))
            },
        )
        .map_err(to_py)?;
    let (run, spans) = match found {
        Err(Lookup::NoStore) => return Ok(("no_store".into(), py.None())),
        Err(Lookup::Ambiguous(ids)) => {
            return Ok((
                "ambiguous".into(),
                ids.into_pyobject(py)?.into_any().unbind(),
            ))
        }
        Err(_) => return Ok(("not_found".into(), py.None())),
        Ok(found) => found,
    };
    let d = PyDict::new(py);
    d.set_item("run_id", &run.run_id)?;
    d.set_item("trace_id", &run.trace_id)?;
    let items = pyo3::types::PyList::empty(py);
    for s in spans {
        items.append(convert(&run, s)?)?;
    }
    d.set_item("spans", items)?;
    Ok(("found".into(), d.into_any().unbind()))
}

type DiffSpan = (
    String,
    Option<String>,
    String,
    String,
    f64,
    Option<f64>,
    Option<UsageTuple>,
    Option<String>,
);

/// The data side of `compose diff` for one run (OBS-33): resolves `run_id`
/// and returns `(outcome, value)` like `resolve_run`; for `"found"` the
/// value is `{"run_id", "trace_id", "spans"}` with every span of the run's
/// trace, ordered by `started_at` then span id, as `(span_id,
/// parent_span_id, kind, name, started_at, ended_at, usage | None,
/// output_json | None)`.
#[pyfunction]
pub fn diff_view(py: Python<'_>, db_path: &str, run_id: &str) -> PyResult<(String, PyObject)> {
    run_spans(
        py,
        db_path,
        run_id,
        |src, run| match run.trace_id.as_deref() {
            Some(t) => src.trace(run.rid, t, true),
            None => Ok(Vec::new()),
        },
        |_, s| -> PyResult<DiffSpan> {
            let usage = usage_tuple(&s);
            Ok((
                s.span.span_id,
                s.span.parent_span_id,
                s.span.kind,
                s.span.name,
                s.span.started_at,
                s.span.ended_at,
                usage,
                s.output_json,
            ))
        },
    )
}

type ExportSpan = (
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<UsageTuple>,
);

/// The data side of `compose export` (OBS-35): resolves `run_id` and returns
/// `(outcome, value)` like `resolve_run`; for `"found"` the value is
/// `{"run_id", "trace_id", "spans"}` with the run's `llm` spans, ordered by
/// `started_at` then span id, as `(span_id, name, attributes_json,
/// input_json, output_json, usage | None)`.
#[pyfunction]
pub fn export_view(py: Python<'_>, db_path: &str, run_id: &str) -> PyResult<(String, PyObject)> {
    run_spans(
        py,
        db_path,
        run_id,
        |src, run| {
            let Some(trace_id) = run.trace_id.as_deref() else {
                return Ok(Vec::new());
            };
            let mut spans = src.trace(run.rid, trace_id, true)?;
            spans.retain(|s| s.rid == Some(run.rid) && s.span.kind == "llm");
            Ok(spans)
        },
        |_, s| -> PyResult<ExportSpan> {
            let usage = usage_tuple(&s);
            Ok((
                s.span.span_id,
                s.span.name,
                s.attributes_json,
                s.input_json,
                s.output_json,
                usage,
            ))
        },
    )
}

/// The data side of `compose export --otlp`: resolves `run_id` and returns
/// `(outcome, value)` like `resolve_run`; for `"found"` the value is
/// `{"run_id", "trace_id", "spans"}` with every stored span of the run's
/// trace (both attempts' after a resume), ordered by `started_at` then span
/// id, each as the 16-tuple the span tap is given (`span_tap.rs`): the
/// step key is not read back, the error has no stack trace, and `run_id`
/// is set on the spans the run owns.
#[pyfunction]
pub fn otel_view(py: Python<'_>, db_path: &str, run_id: &str) -> PyResult<(String, PyObject)> {
    run_spans(
        py,
        db_path,
        run_id,
        |src, run| match run.trace_id.as_deref() {
            Some(t) => src.trace(run.rid, t, true),
            None => Ok(Vec::new()),
        },
        |run, s| -> PyResult<PyObject> {
            let span = s.span;
            let error_json = span.error_type.as_ref().map(|t| {
                serde_json::json!({"type": t, "message": span.error_message.as_deref().unwrap_or("")})
                    .to_string()
            });
            let row = crate::store::SpanRow {
                span_id: span.span_id,
                parent_span_id: span.parent_span_id,
                kind: span.kind,
                name: span.name,
                started_at: span.started_at,
                ended_at: span.ended_at,
                status: span.status,
                replayed: span.replayed,
                step_key: None,
                attributes_json: s.attributes_json,
                usage: span.usage,
                error_json,
                input_json: s.input_json,
                output_json: s.output_json,
            };
            let tapped = crate::span_tap::Tapped {
                trace_id: run.trace_id.as_deref().unwrap_or(""),
                run_id: (s.rid == Some(run.rid)).then_some(run.run_id.as_str()),
                span: &row,
            };
            Python::with_gil(|py| {
                Ok(super::span_tap::span_tuple(py, &tapped)?
                    .into_any()
                    .unbind())
            })
        },
    )
}

type ViewSpan = (
    String,
    Option<String>,
    String,
    String,
    f64,
    Option<f64>,
    String,
    bool,
    (Option<String>, Option<String>),
    Option<UsageTuple>,
    (Option<String>, Option<String>, Option<String>),
    Option<String>,
);

/// The data side of the web UI's run page: resolves `run_id` and returns
/// `(outcome, value)` like `resolve_run`; for `"found"` the value is
/// `{"run_id", "trace_id", "spans"}` with every span of the run's trace,
/// ordered by `started_at` then span id, as `(span_id, parent_span_id,
/// kind, name, started_at, ended_at, status, replayed, (error_type,
/// error_message), usage | None, (attributes_json, input_json,
/// output_json), step_key | None)`.
#[pyfunction]
pub fn span_view(py: Python<'_>, db_path: &str, run_id: &str) -> PyResult<(String, PyObject)> {
    run_spans(
        py,
        db_path,
        run_id,
        |src, run| match run.trace_id.as_deref() {
            Some(t) => src.trace(run.rid, t, true),
            None => Ok(Vec::new()),
        },
        |_, s| -> PyResult<ViewSpan> {
            let usage = usage_tuple(&s);
            let span = s.span;
            Ok((
                span.span_id,
                span.parent_span_id,
                span.kind,
                span.name,
                span.started_at,
                span.ended_at,
                span.status,
                span.replayed,
                (span.error_type, span.error_message),
                usage,
                (s.attributes_json, s.input_json, s.output_json),
                s.step_key,
            ))
        },
    )
}
