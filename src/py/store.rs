//! `Store`: the Python handle on the configured store (STORE-1): a SQLite
//! file or a PostgreSQL database.

use super::attempt::PyAttempt;
use super::errors::IntoPy;
use super::rows::{interrupt_tuple, run_row_dict, PendingTuple};
use super::spans::span_from_py;
use crate::run::Attempt;
use crate::store::postgres::PgStore;
use crate::store::sqlite::SqliteStore;
use crate::store::url::{self, StoreUrl};
use crate::store::ChatRow;
use crate::store::{NewRun, SpanRecord, Store};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::Arc;

type StepSpanTuple = (
    String,
    Option<String>,
    String,
    f64,
    Option<f64>,
    bool,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

#[pyclass(name = "Store", module = "composeai._core", frozen)]
pub struct PyStore {
    pub inner: Arc<dyn Store>,
    /// The SQLite store, for the durable primitives' own queries.
    pub sqlite: Option<Arc<SqliteStore>>,
    /// The PostgreSQL store, for the worker's and the queues' own queries.
    pub pg: Option<Arc<PgStore>>,
}

/// `(kind, target)` of a store specification: `("sqlite", path)` or
/// `("postgresql", redacted URL)`; `default_sqlite` when it is empty.
#[pyfunction]
pub fn store_target(spec: &str, default_sqlite: &str) -> PyResult<(String, String)> {
    Ok(match url::parse(spec, default_sqlite).py_err()? {
        StoreUrl::Sqlite(p) => ("sqlite".into(), p),
        StoreUrl::Postgres(pg) => ("postgresql".into(), pg.redacted),
    })
}

/// `compose migrate` (STORE-3): brings the store's schema up to date (or,
/// with `dry_run`, only reads it); returns `(version found, version now,
/// latest version)`.
#[pyfunction]
#[pyo3(signature = (spec, default_sqlite, dry_run=false))]
pub fn migrate_store(
    py: Python<'_>,
    spec: &str,
    default_sqlite: &str,
    dry_run: bool,
) -> PyResult<(i64, i64, i64)> {
    let parsed = url::parse(spec, default_sqlite).py_err()?;
    py.allow_threads(|| match parsed {
        StoreUrl::Sqlite(p) => crate::store::sqlite::migrate_file(&p, dry_run),
        StoreUrl::Postgres(pg) => {
            let store = PgStore::connect(pg)?;
            let (found, now) = store.migrate(dry_run)?;
            Ok((
                found as i64,
                now as i64,
                crate::store::postgres::PG_SCHEMA_VERSION as i64,
            ))
        }
    })
    .py_err()
}

/// A plain path names a SQLite file, as before store URLs existed.
fn parse_store_path(path: &str) -> crate::error::CoreResult<StoreUrl> {
    if path.contains("://") {
        url::parse(path, "")
    } else {
        Ok(StoreUrl::Sqlite(path.to_string()))
    }
}

fn open_parsed(parsed: StoreUrl) -> crate::error::CoreResult<PyStore> {
    Ok(match parsed {
        StoreUrl::Sqlite(p) => {
            let s = Arc::new(SqliteStore::open(&p)?);
            PyStore {
                inner: s.clone(),
                sqlite: Some(s),
                pg: None,
            }
        }
        StoreUrl::Postgres(pg) => {
            let s = Arc::new(PgStore::open(pg)?);
            PyStore {
                inner: s.clone(),
                sqlite: None,
                pg: Some(s),
            }
        }
    })
}

#[pymethods]
impl PyStore {
    /// Opens the store at `path` (a SQLite file path or a store URL),
    /// creating or migrating it.
    #[new]
    fn open(py: Python<'_>, path: String) -> PyResult<Self> {
        let parsed = parse_store_path(&path).py_err()?;
        py.allow_threads(|| open_parsed(parsed)).py_err()
    }

    /// `Store(path)` for an async driver: the connection and the schema
    /// check of a server run off the loop; `future` gets the store.
    #[staticmethod]
    fn aopen(py: Python<'_>, future: Bound<'_, PyAny>, path: String) -> PyResult<()> {
        let parsed = parse_store_path(&path).py_err()?;
        super::offloop::resolve_with(
            py,
            future,
            move || open_parsed(parsed),
            |py, store| Ok(Py::new(py, store)?.into_any()),
        )
    }

    /// `"sqlite"` or `"postgresql"`.
    #[getter]
    fn kind(&self) -> &'static str {
        if self.sqlite.is_some() {
            "sqlite"
        } else {
            "postgresql"
        }
    }

    #[getter]
    fn path(&self) -> &str {
        self.inner.path()
    }

    /// Creates a run (status `running`, leased to this process) and returns
    /// its first attempt. With `queued` the row's insert is left to the next
    /// commit or the store's writer (see `Attempt::start_queued`).
    #[pyo3(signature = (kind, name, fingerprint=None, args_json=None, budget_json=None, run_id=None, trace_id=None, queued=false, module=None))]
    #[allow(clippy::too_many_arguments)]
    fn start_run(
        &self,
        py: Python<'_>,
        kind: String,
        name: String,
        fingerprint: Option<String>,
        args_json: Option<String>,
        budget_json: Option<String>,
        run_id: Option<String>,
        trace_id: Option<String>,
        queued: bool,
        module: Option<String>,
    ) -> PyResult<PyAttempt> {
        let new = NewRun {
            run_id: run_id.unwrap_or_else(crate::ids::new_ulid),
            trace_id: trace_id.unwrap_or_else(crate::ids::new_ulid),
            kind,
            name,
            fingerprint,
            args_json,
            budget_json,
            module,
        };
        let store: Arc<dyn Store> = self.inner.clone();
        let attempt = py
            .allow_threads(|| {
                if queued {
                    Attempt::start_queued(store, new)
                } else {
                    Attempt::start(store, new)
                }
            })
            .py_err()?;
        Ok(PyAttempt::new(attempt))
    }

    /// `start_run` for an async driver: `future` (of the running loop) gets
    /// the attempt once the server answered; the loop runs meanwhile.
    #[pyo3(signature = (future, kind, name, fingerprint=None, args_json=None, budget_json=None, run_id=None, trace_id=None, module=None))]
    #[allow(clippy::too_many_arguments)]
    fn astart_run(
        &self,
        py: Python<'_>,
        future: Bound<'_, PyAny>,
        kind: String,
        name: String,
        fingerprint: Option<String>,
        args_json: Option<String>,
        budget_json: Option<String>,
        run_id: Option<String>,
        trace_id: Option<String>,
        module: Option<String>,
    ) -> PyResult<()> {
        let new = NewRun {
            run_id: run_id.unwrap_or_else(crate::ids::new_ulid),
            trace_id: trace_id.unwrap_or_else(crate::ids::new_ulid),
            kind,
            name,
            fingerprint,
            args_json,
            budget_json,
            module,
        };
        let store: Arc<dyn Store> = self.inner.clone();
        super::offloop::resolve_with(
            py,
            future,
            move || Attempt::start(store, new),
            |py, a| Ok(Py::new(py, PyAttempt::new(a))?.into_any()),
        )
    }

    /// `resume` for an async driver, resolving `future` with the attempt.
    #[pyo3(signature = (future, run_id, recover=false))]
    fn aresume(
        &self,
        py: Python<'_>,
        future: Bound<'_, PyAny>,
        run_id: String,
        recover: bool,
    ) -> PyResult<()> {
        let store: Arc<dyn Store> = self.inner.clone();
        super::offloop::resolve_with(
            py,
            future,
            move || {
                if recover {
                    Attempt::recover(store, &run_id, &[])
                } else {
                    Attempt::resume(store, &run_id)
                }
            },
            |py, a| Ok(Py::new(py, PyAttempt::new(a))?.into_any()),
        )
    }

    /// Takes the lease of an existing run and loads its journal. With
    /// `recover` (a worker continuing a due run), taking it from a dead
    /// holder counts against the recovery limit (STORE-12).
    /// `answers` (`(interrupt id, encoded value)`, FLOW-43) are journaled
    /// with the claim.
    #[pyo3(signature = (run_id, recover=false, answers=Vec::new()))]
    fn resume(
        &self,
        py: Python<'_>,
        run_id: String,
        recover: bool,
        answers: Vec<(String, String)>,
    ) -> PyResult<PyAttempt> {
        let store: Arc<dyn Store> = self.inner.clone();
        let attempt = py
            .allow_threads(|| {
                if recover {
                    Attempt::recover(store, &run_id, &answers)
                } else {
                    Attempt::resume_answering(store, &run_id, &answers)
                }
            })
            .py_err()?;
        Ok(PyAttempt::new(attempt))
    }

    /// A replay-only attempt at `run_id` (`composeai.testing.replay`): no
    /// lease, and nothing written.
    fn replay_attempt(&self, py: Python<'_>, run_id: String) -> PyResult<PyAttempt> {
        let store: Arc<dyn Store> = self.inner.clone();
        let attempt = py
            .allow_threads(|| Attempt::replay_only(store, &run_id))
            .py_err()?;
        Ok(PyAttempt::new(attempt))
    }

    /// The run row as a dict, or `None`.
    fn get_run<'py>(&self, py: Python<'py>, run_id: &str) -> PyResult<Option<Bound<'py, PyDict>>> {
        match py.allow_threads(|| self.inner.get_run(run_id)).py_err()? {
            Some(r) => Ok(Some(run_row_dict(py, &r)?)),
            None => Ok(None),
        }
    }

    /// `get_run` for an async driver, resolving `future` with the row.
    fn aget_run(&self, py: Python<'_>, future: Bound<'_, PyAny>, run_id: String) -> PyResult<()> {
        let store: Arc<dyn Store> = self.inner.clone();
        super::offloop::resolve_with(
            py,
            future,
            move || store.get_run(&run_id),
            |py, row| match row {
                Some(r) => Ok(run_row_dict(py, &r)?.into_any().unbind()),
                None => Ok(py.None()),
            },
        )
    }

    /// Pending interrupts of a run: `(id, kind, question, payload_json)`,
    /// ordered by id.
    fn pending(&self, py: Python<'_>, run_id: &str) -> PyResult<Vec<PendingTuple>> {
        let rows = py
            .allow_threads(|| -> crate::error::CoreResult<_> {
                match self.inner.get_run(run_id)? {
                    Some(r) => self.inner.pending(r.rid),
                    None => Ok(vec![]),
                }
            })
            .py_err()?;
        Ok(rows.into_iter().map(interrupt_tuple).collect())
    }

    /// `pending` for an async driver, resolving `future` with the list.
    fn apending(&self, py: Python<'_>, future: Bound<'_, PyAny>, run_id: String) -> PyResult<()> {
        let store: Arc<dyn Store> = self.inner.clone();
        super::offloop::resolve_with(
            py,
            future,
            move || match store.get_run(&run_id)? {
                Some(r) => store.pending(r.rid),
                None => Ok(vec![]),
            },
            |py, rows| {
                let rows: Vec<PendingTuple> = rows.into_iter().map(interrupt_tuple).collect();
                Ok(rows.into_pyobject(py)?.into_any().unbind())
            },
        )
    }

    /// The stored journal of a run as `(step_key, value_json)` pairs.
    fn journal(&self, py: Python<'_>, run_id: &str) -> PyResult<Vec<(String, String)>> {
        py.allow_threads(|| -> crate::error::CoreResult<_> {
            match self.inner.get_run(run_id)? {
                Some(r) => self.inner.journal(r.rid),
                None => Ok(vec![]),
            }
        })
        .py_err()
    }

    /// Queues a span that belongs to no run; `flush` (or the next commit)
    /// writes it.
    fn queue_span(&self, trace_id: String, span: &Bound<'_, PyAny>) -> PyResult<()> {
        let span = span_from_py(span)?;
        if crate::span_tap::on() {
            crate::span_tap::emit(&trace_id, None, &span);
        }
        self.inner.queue_span(SpanRecord {
            trace_id,
            rid: None,
            span,
            output_in_journal: false,
        });
        Ok(())
    }

    /// Upserts a chat row (CHAT-4): `updated_at` is now, the first
    /// `created_at` is kept.
    #[pyo3(signature = (chat_id, agent_name, system, model, messages_json, created_at))]
    #[allow(clippy::too_many_arguments)]
    fn save_chat(
        &self,
        py: Python<'_>,
        chat_id: String,
        agent_name: String,
        system: Option<String>,
        model: Option<String>,
        messages_json: String,
        created_at: f64,
    ) -> PyResult<()> {
        let row = ChatRow {
            chat_id,
            agent_name,
            system,
            model,
            messages_json,
            created_at,
            updated_at: 0.0,
        };
        py.allow_threads(|| self.inner.save_chat(&row)).py_err()
    }

    /// The chat row as a dict, or `None` (CHAT-7).
    fn load_chat<'py>(
        &self,
        py: Python<'py>,
        chat_id: &str,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(c) = py
            .allow_threads(|| self.inner.load_chat(chat_id))
            .py_err()?
        else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("chat_id", c.chat_id)?;
        d.set_item("agent_name", c.agent_name)?;
        d.set_item("system", c.system)?;
        d.set_item("model", c.model)?;
        d.set_item("messages_json", c.messages_json)?;
        d.set_item("created_at", c.created_at)?;
        d.set_item("updated_at", c.updated_at)?;
        Ok(Some(d))
    }

    /// The `ok` task-step spans of run `run_id` stored after `mark` (see
    /// `Attempt.span_mark`), in write order:
    /// `(span_id, parent_span_id, name, started_at, ended_at, replayed,
    /// step_key, attributes_json, input_json, output_json)`.
    fn step_spans(&self, py: Python<'_>, run_id: &str, mark: i64) -> PyResult<Vec<StepSpanTuple>> {
        let store = self.inner.clone();
        let rows = py
            .allow_threads(move || match store.get_run(run_id)? {
                Some(run) => store.step_spans(run.rid, mark),
                None => Ok(Vec::new()),
            })
            .py_err()?;
        Ok(rows
            .into_iter()
            .map(|r| {
                (
                    r.span_id,
                    r.parent_span_id,
                    r.name,
                    r.started_at,
                    r.ended_at,
                    r.replayed,
                    r.step_key,
                    r.attributes_json,
                    r.input_json,
                    r.output_json,
                )
            })
            .collect())
    }

    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        py.allow_threads(|| self.inner.flush()).py_err()
    }

    /// Writes everything queued and lets go of the database (at exit).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.allow_threads(|| self.inner.close()).py_err()
    }
}
