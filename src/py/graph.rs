//! `GraphDef`, `GraphRun` and the thread functions: the graph engine as
//! `composeai.graph` drives it. Values cross as JSON text.

use super::attempt::PyAttempt;
use super::errors::IntoPy;
use super::store::PyStore;
use crate::error::{CoreError, CoreResult};
use crate::graph::checkpoint::Progress;
use crate::graph::checkpoint::Thread;
use crate::graph::exec::{answered_nodes, GraphRun, Outcome};
use crate::graph::reduce::State;
use crate::graph::spec::{self, Graph};
use crate::graph::threads::{self, Claim};
use crate::store::Store;
use parking_lot::Mutex;
use pyo3::prelude::*;
use serde_json::Value;
use std::sync::Arc;

fn parse_state(text: &str, what: &str) -> CoreResult<State> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(CoreError::Serialization(format!(
            "{what}: not a JSON object"
        ))),
        Err(e) => Err(CoreError::Serialization(format!("{what}: {e}"))),
    }
}

fn parse_value(text: &str, what: &str) -> CoreResult<Value> {
    serde_json::from_str(text).map_err(|e| CoreError::Serialization(format!("{what}: {e}")))
}

fn parse_progress(text: &str) -> CoreResult<Progress> {
    serde_json::from_str(text)
        .map_err(|e| CoreError::Config(format!("the snapshot cannot be read: {e}")))
}

#[pyclass(name = "GraphDef", module = "composeai._core", frozen)]
pub struct PyGraphDef {
    inner: Arc<Graph>,
}

#[pymethods]
impl PyGraphDef {
    #[getter]
    fn fingerprint(&self) -> &str {
        &self.inner.fingerprint
    }

    #[getter]
    fn name(&self) -> &str {
        &self.inner.spec.name
    }
}

/// Validates a declaration: `(GraphDef, [])`, or `(None, issues_json)`.
#[pyfunction]
pub fn graph_compile(spec_json: &str) -> PyResult<(Option<PyGraphDef>, String)> {
    let spec = spec::parse(spec_json).py_err()?;
    match spec::compile(spec) {
        Ok(g) => Ok((Some(PyGraphDef { inner: Arc::new(g) }), "[]".into())),
        Err(issues) => {
            let list: Vec<Value> = issues.iter().map(|i| i.to_json()).collect();
            Ok((None, Value::Array(list).to_string()))
        }
    }
}

#[pyclass(name = "GraphRun", module = "composeai._core", frozen)]
pub struct PyGraphRun {
    /// Shared with the work of an async driver's off-loop call.
    inner: Arc<Mutex<GraphRun>>,
}

impl PyGraphRun {
    fn new(run: GraphRun) -> Self {
        PyGraphRun {
            inner: Arc::new(Mutex::new(run)),
        }
    }

    /// Runs `work` on the graph run off the loop, resolving `future` with
    /// `convert` of its value (the `a…` twins of the methods below).
    fn off_loop<T, W, C>(
        &self,
        py: Python<'_>,
        future: Bound<'_, PyAny>,
        work: W,
        convert: C,
    ) -> PyResult<()>
    where
        T: Send + 'static,
        W: FnOnce(&mut GraphRun) -> CoreResult<T> + Send + 'static,
        C: FnOnce(Python<'_>, T) -> PyResult<PyObject> + Send + 'static,
    {
        let inner = self.inner.clone();
        super::offloop::resolve_with(py, future, move || work(&mut inner.lock()), convert)
    }
}

/// `(delta_json, routers, status, ready)` of a step.
type SteppedTuple = (String, Vec<String>, Option<String>, Vec<ExecTuple>);

fn step_run(run: &mut GraphRun, outcomes: Vec<OutcomeTuple>) -> CoreResult<SteppedTuple> {
    let parsed = outcomes
        .into_iter()
        .map(|t| outcome(run, t))
        .collect::<CoreResult<Vec<_>>>()?;
    let stepped = run.step(parsed)?;
    Ok((
        stepped.delta,
        stepped.routers,
        stepped.status,
        stepped.ready.into_iter().map(exec_tuple).collect(),
    ))
}

fn route_run(
    run: &mut GraphRun,
    labels: Vec<(String, String)>,
) -> CoreResult<(String, Vec<ExecTuple>)> {
    let (status, ready) = run.route(labels)?;
    Ok((status, ready.into_iter().map(exec_tuple).collect()))
}

fn none(py: Python<'_>, (): ()) -> PyResult<PyObject> {
    Ok(py.None())
}

/// `(node, scope, step, resume_json, attempt, done_json)`.
type ExecTuple = (String, String, i64, Option<String>, i64, Option<String>);
/// `(span_id, parent_span_id, started_at, ended_at)` of a node's span the
/// core queues with its step.
type NodeSpan = (String, Option<String>, f64, f64);
/// `(node, kind, update_json, goto_targets, payload_json, span)`.
type OutcomeTuple = (
    String,
    String,
    Option<String>,
    Option<Vec<String>>,
    Option<String>,
    Option<NodeSpan>,
);

/// Opens a graph run attempt at its stored head; `input_json` starts a new
/// pass from the start node.
#[pyfunction]
#[pyo3(signature = (graph, attempt, thread_id, input_json, fresh, max_steps, deadline=None))]
#[allow(clippy::too_many_arguments)]
pub fn graph_open(
    py: Python<'_>,
    graph: &PyGraphDef,
    attempt: &PyAttempt,
    thread_id: Option<String>,
    input_json: Option<String>,
    fresh: bool,
    max_steps: i64,
    deadline: Option<f64>,
) -> PyResult<PyGraphRun> {
    let open = opener(
        graph, attempt, thread_id, input_json, fresh, max_steps, deadline,
    );
    let run = py.allow_threads(open).py_err()?;
    Ok(PyGraphRun::new(run))
}

/// `graph_open` for an async driver: `future` (of the running loop) gets
/// the graph run once its head was read; the loop runs meanwhile.
#[pyfunction]
#[pyo3(signature = (future, graph, attempt, thread_id, input_json, fresh, max_steps, deadline=None))]
#[allow(clippy::too_many_arguments)]
pub fn graph_aopen(
    py: Python<'_>,
    future: Bound<'_, PyAny>,
    graph: &PyGraphDef,
    attempt: &PyAttempt,
    thread_id: Option<String>,
    input_json: Option<String>,
    fresh: bool,
    max_steps: i64,
    deadline: Option<f64>,
) -> PyResult<()> {
    let open = opener(
        graph, attempt, thread_id, input_json, fresh, max_steps, deadline,
    );
    super::offloop::resolve_with(py, future, open, |py, run| {
        Ok(Py::new(py, PyGraphRun::new(run))?.into_any())
    })
}

/// The work of `graph_open`, to run wherever the caller waits.
#[allow(clippy::too_many_arguments)]
fn opener(
    graph: &PyGraphDef,
    attempt: &PyAttempt,
    thread_id: Option<String>,
    input_json: Option<String>,
    fresh: bool,
    max_steps: i64,
    deadline: Option<f64>,
) -> impl FnOnce() -> CoreResult<GraphRun> + Send + 'static {
    let g = graph.inner.clone();
    let a = attempt.inner.clone();
    move || {
        let input = input_json
            .map(|t| parse_state(&t, "graph input"))
            .transpose()?;
        GraphRun::open(g, a, thread_id, input, fresh, max_steps, deadline)
    }
}

/// Opens a run from a caller's snapshot (`state_json`, `progress_json`).
#[pyfunction]
#[pyo3(signature = (graph, attempt, state_json, progress_json, max_steps, deadline=None))]
pub fn graph_from_snapshot(
    graph: &PyGraphDef,
    attempt: &PyAttempt,
    state_json: &str,
    progress_json: &str,
    max_steps: i64,
    deadline: Option<f64>,
) -> PyResult<PyGraphRun> {
    let state = parse_state(state_json, "snapshot state").py_err()?;
    let progress = parse_progress(progress_json).py_err()?;
    let run = GraphRun::from_snapshot(
        graph.inner.clone(),
        attempt.inner.clone(),
        state,
        progress,
        max_steps,
        deadline,
    );
    Ok(PyGraphRun::new(run))
}

fn exec_tuple(e: crate::graph::exec::Exec) -> ExecTuple {
    (e.node, e.scope, e.step, e.resume, e.attempt, e.done)
}

/// A node's outcome, its span (when given) queued first.
fn outcome(run: &GraphRun, t: OutcomeTuple) -> CoreResult<(String, Outcome)> {
    let (node, kind, update, targets, payload, span) = t;
    if let Some((span_id, parent, started, ended)) = span {
        run.queue_node_span(&node, span_id, parent, started, ended, update.clone())?;
    }
    let what = format!("node '{node}' update");
    let update = update.map(|u| parse_state(&u, &what)).transpose()?;
    let o = match kind.as_str() {
        "update" => Outcome::Update(update),
        "suspend" => Outcome::Suspend {
            payload: payload
                .map(|p| parse_value(&p, "suspend payload"))
                .transpose()?
                .unwrap_or(Value::Null),
            update,
        },
        "goto" => Outcome::Goto {
            targets: targets.unwrap_or_default(),
            update,
        },
        other => return Err(CoreError::Config(format!("unknown node outcome '{other}'"))),
    };
    Ok((node, o))
}

#[pymethods]
impl PyGraphRun {
    fn ready(&self, py: Python<'_>) -> PyResult<Vec<ExecTuple>> {
        let execs = py.allow_threads(|| self.inner.lock().ready()).py_err()?;
        Ok(execs.into_iter().map(exec_tuple).collect())
    }

    /// The suspended nodes answered from outside the run for the
    /// suspension it was opened at (they win over `answer`'s values).
    fn answered_outside(&self) -> PyResult<Vec<String>> {
        self.inner.lock().answered_outside().py_err()
    }

    /// Records `(node, value_json)` answers; with those given from outside
    /// the run (which win) they name exactly the suspended nodes.
    fn answer(&self, py: Python<'_>, values: Vec<(String, String)>) -> PyResult<()> {
        py.allow_threads(|| self.inner.lock().answer(values))
            .py_err()
    }

    /// `answer` for an async driver, resolving `future` with `None`.
    fn aanswer(
        &self,
        py: Python<'_>,
        future: Bound<'_, PyAny>,
        values: Vec<(String, String)>,
    ) -> PyResult<()> {
        self.off_loop(py, future, move |run| run.answer(values), none)
    }

    /// Merges a step's outcomes; returns `(delta_json, routers, status,
    /// ready)`: with routers to call, `status` is `None` until `route`.
    fn step(&self, py: Python<'_>, outcomes: Vec<OutcomeTuple>) -> PyResult<SteppedTuple> {
        py.allow_threads(|| step_run(&mut self.inner.lock(), outcomes))
            .py_err()
    }

    /// `step` for an async driver: `future` gets its tuple once the step's
    /// checkpoint is durable.
    fn astep(
        &self,
        py: Python<'_>,
        future: Bound<'_, PyAny>,
        outcomes: Vec<OutcomeTuple>,
    ) -> PyResult<()> {
        self.off_loop(
            py,
            future,
            move |run| step_run(run, outcomes),
            |py, t| Ok(t.into_pyobject(py)?.into_any().unbind()),
        )
    }

    /// The routers' labels; returns `(status, ready)`.
    fn route(
        &self,
        py: Python<'_>,
        labels: Vec<(String, String)>,
    ) -> PyResult<(String, Vec<ExecTuple>)> {
        py.allow_threads(|| route_run(&mut self.inner.lock(), labels))
            .py_err()
    }

    /// `route` for an async driver, resolving `future` with `(status, ready)`.
    fn aroute(
        &self,
        py: Python<'_>,
        future: Bound<'_, PyAny>,
        labels: Vec<(String, String)>,
    ) -> PyResult<()> {
        self.off_loop(
            py,
            future,
            move |run| route_run(run, labels),
            |py, t| Ok(t.into_pyobject(py)?.into_any().unbind()),
        )
    }

    /// The status of a run with nothing left to run in this attempt.
    fn idle_status(&self) -> String {
        self.inner.lock().idle_status()
    }

    /// Writes the staged checkpoint; with `output_json` a completed or
    /// suspended run is settled in the same transaction.
    #[pyo3(signature = (output_json=None))]
    fn commit(&self, py: Python<'_>, output_json: Option<String>) -> PyResult<()> {
        py.allow_threads(|| self.inner.lock().commit(output_json))
            .py_err()
    }

    /// `commit` for an async driver, resolving `future` with `None`.
    #[pyo3(signature = (future, output_json=None))]
    fn acommit(
        &self,
        py: Python<'_>,
        future: Bound<'_, PyAny>,
        output_json: Option<String>,
    ) -> PyResult<()> {
        self.off_loop(py, future, move |run| run.commit(output_json), none)
    }

    fn release(&self, py: Python<'_>, status: &str) -> PyResult<()> {
        py.allow_threads(|| self.inner.lock().release(status))
            .py_err()
    }

    /// `release` for an async driver, resolving `future` with `None`.
    fn arelease(&self, py: Python<'_>, future: Bound<'_, PyAny>, status: String) -> PyResult<()> {
        self.off_loop(py, future, move |run| run.release(&status), none)
    }

    fn state_json(&self) -> String {
        self.inner.lock().state_json()
    }

    fn progress_json(&self) -> String {
        self.inner.lock().progress_json()
    }

    /// `(node, payload_json)` of the suspended nodes.
    fn pending(&self) -> Vec<(String, String)> {
        self.inner
            .lock()
            .pending()
            .iter()
            .map(|p| (p.node.clone(), p.payload.to_string()))
            .collect()
    }

    #[getter]
    fn head(&self) -> Option<String> {
        self.inner.lock().head.clone()
    }

    #[getter]
    fn version(&self) -> i64 {
        self.inner.lock().version
    }

    #[getter]
    fn steps(&self) -> i64 {
        self.inner.lock().steps
    }
}

/// Runs `f` on the store with the GIL released.
fn on_store<T: Send>(
    py: Python<'_>,
    store: &PyStore,
    f: impl FnOnce(&dyn Store) -> CoreResult<T> + Send,
) -> PyResult<T> {
    let s: Arc<dyn Store> = store.inner.clone();
    py.allow_threads(move || f(&*s)).py_err()
}

/// A thread row as JSON text, with its fingerprint; `null` for none.
fn thread_json(t: Option<Thread>) -> String {
    let v = t.map_or(Value::Null, |t| {
        let mut v = t.to_json();
        v["fingerprint"] = Value::String(t.fingerprint);
        v
    });
    v.to_string()
}

/// The error record of a run that failed as its attempt opened, named by
/// the Python class the error raises as.
fn open_error_json(e: &CoreError) -> String {
    let kind = match e {
        CoreError::Graph { code, .. } if code.starts_with("checkpoint_") => "GraphStorageError",
        CoreError::Graph { .. } => "GraphError",
        CoreError::Serialization(_) => "SerializationError",
        _ => "ConfigError",
    };
    serde_json::json!({"type": kind, "message": e.to_string()}).to_string()
}

/// `run()` of a thread: claims it, creates its new run and opens the run's
/// first attempt at the thread's head (read in the claiming transaction).
/// A run that cannot be opened is settled failed and the thread released.
#[pyfunction]
#[pyo3(signature = (store, graph, thread_id, args_json, budget_json, run_id, input_json, max_steps, deadline=None))]
#[allow(clippy::too_many_arguments)]
pub fn thread_start(
    py: Python<'_>,
    store: &PyStore,
    graph: &PyGraphDef,
    thread_id: String,
    args_json: String,
    budget_json: Option<String>,
    run_id: String,
    input_json: String,
    max_steps: i64,
    deadline: Option<f64>,
) -> PyResult<(PyAttempt, PyGraphRun)> {
    let start = thread_starter(
        store,
        graph,
        thread_id,
        args_json,
        budget_json,
        run_id,
        input_json,
        max_steps,
        deadline,
    );
    let (attempt, run) = py.allow_threads(start).py_err()?;
    Ok((PyAttempt { inner: attempt }, PyGraphRun::new(run)))
}

/// `thread_start` for an async driver: `future` (of the running loop) gets
/// `(attempt, graph run)` once the server answered.
#[pyfunction]
#[pyo3(signature = (future, store, graph, thread_id, args_json, budget_json, run_id, input_json, max_steps, deadline=None))]
#[allow(clippy::too_many_arguments)]
pub fn thread_astart(
    py: Python<'_>,
    future: Bound<'_, PyAny>,
    store: &PyStore,
    graph: &PyGraphDef,
    thread_id: String,
    args_json: String,
    budget_json: Option<String>,
    run_id: String,
    input_json: String,
    max_steps: i64,
    deadline: Option<f64>,
) -> PyResult<()> {
    let start = thread_starter(
        store,
        graph,
        thread_id,
        args_json,
        budget_json,
        run_id,
        input_json,
        max_steps,
        deadline,
    );
    super::offloop::resolve_with(py, future, start, |py, (attempt, run)| {
        let pair = (
            Py::new(py, PyAttempt { inner: attempt })?,
            Py::new(py, PyGraphRun::new(run))?,
        );
        Ok(pair.into_pyobject(py)?.into_any().unbind())
    })
}

/// The work of `thread_start`, to run wherever the caller waits.
#[allow(clippy::too_many_arguments)]
fn thread_starter(
    store: &PyStore,
    graph: &PyGraphDef,
    thread_id: String,
    args_json: String,
    budget_json: Option<String>,
    run_id: String,
    input_json: String,
    max_steps: i64,
    deadline: Option<f64>,
) -> impl FnOnce() -> CoreResult<(Arc<crate::run::Attempt>, GraphRun)> + Send + 'static {
    let g = graph.inner.clone();
    let s: Arc<dyn Store> = store.inner.clone();
    move || {
        let new = crate::store::NewRun {
            run_id: run_id.clone(),
            trace_id: crate::ids::new_ulid(),
            kind: "graph".into(),
            name: g.spec.name.clone(),
            fingerprint: Some(g.fingerprint.clone()),
            args_json: Some(args_json),
            budget_json,
            module: None,
        };
        let input = parse_state(&input_json, "graph input")?;
        let (name, fingerprint) = (g.spec.name.clone(), g.fingerprint.clone());
        let mut head = None;
        let attempt = Arc::new(crate::run::Attempt::start_with(
            s.clone(),
            new,
            &mut |tx| {
                let (before, chain) = threads::claim_in(
                    tx,
                    &thread_id,
                    &name,
                    &fingerprint,
                    Claim::Run,
                    Some(&run_id),
                )?;
                head = Some((before.and_then(|t| t.head), chain));
                Ok(())
            },
        )?);
        let thread = Some(thread_id.clone());
        match GraphRun::open_at(
            g,
            attempt.clone(),
            thread,
            head,
            Some(input),
            true,
            max_steps,
            deadline,
        ) {
            Ok(run) => Ok((attempt, run)),
            Err(e) => {
                // The error raised is the open's; these only tidy up.
                let _ = attempt.settle(crate::store::Settlement {
                    status: "failed".into(),
                    error_json: Some(open_error_json(&e)),
                    ..Default::default()
                });
                let _ = threads::release(&*s, &thread_id, "failed");
                Err(e)
            }
        }
    }
}

/// Claims a thread (`mode`: run/resume/retry); returns the thread's row
/// before the claim as JSON (`null` for a new thread).
#[pyfunction]
#[pyo3(signature = (store, thread_id, graph, fingerprint, mode, run_id=None))]
pub fn thread_claim(
    py: Python<'_>,
    store: &PyStore,
    thread_id: &str,
    graph: &str,
    fingerprint: &str,
    mode: &str,
    run_id: Option<&str>,
) -> PyResult<String> {
    let mode = Claim::parse(mode)
        .ok_or_else(|| CoreError::Config(format!("unknown claim mode '{mode}'")))
        .py_err()?;
    let before = on_store(py, store, |s| {
        threads::claim(s, thread_id, graph, fingerprint, mode, run_id)
    })?;
    Ok(thread_json(before))
}

#[pyfunction]
pub fn thread_release(
    py: Python<'_>,
    store: &PyStore,
    thread_id: &str,
    status: &str,
) -> PyResult<()> {
    on_store(py, store, |s| threads::release(s, thread_id, status))
}

/// Runs `f` on the store off the loop, resolving `future` with `convert`
/// of its value (the `thread_a…` twins of the functions here).
fn on_store_off_loop<T, F, C>(
    py: Python<'_>,
    future: Bound<'_, PyAny>,
    store: &PyStore,
    f: F,
    convert: C,
) -> PyResult<()>
where
    T: Send + 'static,
    F: FnOnce(&dyn Store) -> CoreResult<T> + Send + 'static,
    C: FnOnce(Python<'_>, T) -> PyResult<PyObject> + Send + 'static,
{
    let s: Arc<dyn Store> = store.inner.clone();
    super::offloop::resolve_with(py, future, move || f(&*s), convert)
}

fn text(py: Python<'_>, t: String) -> PyResult<PyObject> {
    Ok(pyo3::types::PyString::new(py, &t).into_any().unbind())
}

/// `thread_claim` for an async driver, resolving `future` with its JSON.
#[pyfunction]
#[pyo3(signature = (future, store, thread_id, graph, fingerprint, mode, run_id=None))]
#[allow(clippy::too_many_arguments)]
pub fn thread_aclaim(
    py: Python<'_>,
    future: Bound<'_, PyAny>,
    store: &PyStore,
    thread_id: String,
    graph: String,
    fingerprint: String,
    mode: &str,
    run_id: Option<String>,
) -> PyResult<()> {
    let mode = Claim::parse(mode)
        .ok_or_else(|| CoreError::Config(format!("unknown claim mode '{mode}'")))
        .py_err()?;
    on_store_off_loop(
        py,
        future,
        store,
        move |s| {
            let before =
                threads::claim(s, &thread_id, &graph, &fingerprint, mode, run_id.as_deref())?;
            Ok(thread_json(before))
        },
        text,
    )
}

/// `thread_release` for an async driver, resolving `future` with `None`.
#[pyfunction]
pub fn thread_arelease(
    py: Python<'_>,
    future: Bound<'_, PyAny>,
    store: &PyStore,
    thread_id: String,
    status: String,
) -> PyResult<()> {
    on_store_off_loop(
        py,
        future,
        store,
        move |s| threads::release(s, &thread_id, &status),
        none,
    )
}

/// `thread_info` for an async driver, resolving `future` with its JSON.
#[pyfunction]
pub fn thread_ainfo(
    py: Python<'_>,
    future: Bound<'_, PyAny>,
    store: &PyStore,
    thread_id: String,
) -> PyResult<()> {
    on_store_off_loop(
        py,
        future,
        store,
        move |s| Ok(thread_json(threads::info(s, &thread_id)?)),
        text,
    )
}

/// `thread_check_resume` for an async driver, resolving `future` with `None`.
#[pyfunction]
pub fn thread_acheck_resume(
    py: Python<'_>,
    future: Bound<'_, PyAny>,
    store: &PyStore,
    thread_id: String,
    names: Vec<String>,
) -> PyResult<()> {
    on_store_off_loop(
        py,
        future,
        store,
        move |s| threads::check_resume(s, &thread_id, &names),
        none,
    )
}

/// `thread_audit_add` for an async driver, resolving `future` with `None`.
#[pyfunction]
#[pyo3(signature = (future, store, thread_id, actor, action, checkpoint_id=None))]
pub fn thread_aaudit_add(
    py: Python<'_>,
    future: Bound<'_, PyAny>,
    store: &PyStore,
    thread_id: String,
    actor: Option<String>,
    action: String,
    checkpoint_id: Option<String>,
) -> PyResult<()> {
    on_store_off_loop(
        py,
        future,
        store,
        move |s| {
            threads::add_audit(
                s,
                &thread_id,
                actor.as_deref(),
                &action,
                checkpoint_id.as_deref(),
            )
        },
        none,
    )
}

/// The thread row as JSON (with its fingerprint), or `null`.
#[pyfunction]
pub fn thread_info(py: Python<'_>, store: &PyStore, thread_id: &str) -> PyResult<String> {
    let t = on_store(py, store, |s| threads::info(s, thread_id))?;
    Ok(thread_json(t))
}

/// `(state_json, progress_json)` at the thread's head, or `None`.
#[pyfunction]
pub fn thread_state(
    py: Python<'_>,
    store: &PyStore,
    thread_id: &str,
) -> PyResult<Option<(String, String)>> {
    on_store(py, store, |s| threads::head_state(s, thread_id))
}

#[pyfunction]
pub fn thread_history(
    py: Python<'_>,
    store: &PyStore,
    thread_id: &str,
    limit: i64,
) -> PyResult<String> {
    let rows = on_store(py, store, |s| threads::history(s, thread_id, limit))?;
    Ok(Value::Array(rows).to_string())
}

/// History of a thread named by id alone (the CLI); unknown id is an error.
#[pyfunction]
pub fn thread_history_any(
    py: Python<'_>,
    store: &PyStore,
    thread_id: &str,
    limit: i64,
) -> PyResult<String> {
    let rows = on_store(py, store, |s| threads::history_any(s, thread_id, limit))?;
    Ok(Value::Array(rows).to_string())
}

#[pyfunction]
pub fn thread_rewind(
    py: Python<'_>,
    store: &PyStore,
    thread_id: &str,
    graph: &str,
    fingerprint: &str,
    checkpoint_id: &str,
) -> PyResult<String> {
    let v = on_store(py, store, |s| {
        threads::rewind(s, thread_id, graph, fingerprint, checkpoint_id)
    })?;
    Ok(v.to_string())
}

#[pyfunction]
pub fn thread_rewind_any(
    py: Python<'_>,
    store: &PyStore,
    thread_id: &str,
    checkpoint_id: &str,
) -> PyResult<String> {
    let v = on_store(py, store, |s| {
        threads::rewind_any(s, thread_id, checkpoint_id)
    })?;
    Ok(v.to_string())
}

#[pyfunction]
pub fn thread_fork(
    py: Python<'_>,
    store: &PyStore,
    thread_id: &str,
    graph: &str,
    fingerprint: &str,
    checkpoint_id: &str,
    new_thread_id: &str,
) -> PyResult<String> {
    let v = on_store(py, store, |s| {
        threads::fork(
            s,
            thread_id,
            graph,
            fingerprint,
            checkpoint_id,
            new_thread_id,
        )
    })?;
    Ok(v.to_string())
}

#[pyfunction]
pub fn thread_delete(
    py: Python<'_>,
    store: &PyStore,
    thread_id: &str,
    graph: &str,
    fingerprint: &str,
) -> PyResult<bool> {
    on_store(py, store, |s| {
        threads::delete(s, thread_id, graph, fingerprint)
    })
}

/// Deletes threads not updated since `before_ms`; returns their ids.
#[pyfunction]
pub fn thread_prune(py: Python<'_>, store: &PyStore, before_ms: i64) -> PyResult<Vec<String>> {
    on_store(py, store, |s| threads::prune(s, before_ms))
}

#[pyfunction]
#[pyo3(signature = (store, graph=None))]
pub fn thread_list(py: Python<'_>, store: &PyStore, graph: Option<&str>) -> PyResult<String> {
    let rows = on_store(py, store, |s| threads::list(s, graph))?;
    Ok(Value::Array(rows).to_string())
}

#[pyfunction]
#[pyo3(signature = (store, thread_id, actor, action, checkpoint_id=None))]
pub fn thread_audit_add(
    py: Python<'_>,
    store: &PyStore,
    thread_id: &str,
    actor: Option<&str>,
    action: &str,
    checkpoint_id: Option<&str>,
) -> PyResult<()> {
    on_store(py, store, |s| {
        threads::add_audit(s, thread_id, actor, action, checkpoint_id)
    })
}

#[pyfunction]
pub fn thread_audit(
    py: Python<'_>,
    store: &PyStore,
    thread_id: &str,
    limit: i64,
) -> PyResult<String> {
    let rows = on_store(py, store, |s| threads::audit(s, thread_id, limit))?;
    Ok(Value::Array(rows).to_string())
}

/// Refuses resume values that do not name exactly the thread's waiting nodes.
#[pyfunction]
pub fn thread_check_resume(
    py: Python<'_>,
    store: &PyStore,
    thread_id: &str,
    names: Vec<String>,
) -> PyResult<()> {
    on_store(py, store, |s| threads::check_resume(s, thread_id, &names))
}

/// Refuses resume values that do not name exactly a snapshot's waiting nodes.
#[pyfunction]
pub fn graph_check_resume(progress_json: &str, names: Vec<String>) -> PyResult<()> {
    let progress = parse_progress(progress_json).py_err()?;
    crate::graph::exec::check_answers(&progress.pending, &names).py_err()
}

/// The newest checkpoint id of a thread-less graph run, or `None`.
#[pyfunction]
pub fn graph_run_head(py: Python<'_>, store: &PyStore, run_id: &str) -> PyResult<Option<String>> {
    on_store(py, store, |s| run_head(s, run_id))
}

/// `graph_run_head` for an async driver, resolving `future` with the id.
#[pyfunction]
pub fn graph_arun_head(
    py: Python<'_>,
    future: Bound<'_, PyAny>,
    store: &PyStore,
    run_id: String,
) -> PyResult<()> {
    on_store_off_loop(
        py,
        future,
        store,
        move |s| run_head(s, &run_id),
        |py, head| Ok(head.into_pyobject(py)?.into_any().unbind()),
    )
}

/// The nodes of graph run `run_id` answered from outside (`compose
/// answer`) for the suspension it is paused at, which a resume of it will
/// take as their answers.
#[pyfunction]
pub fn graph_answered_nodes(
    py: Python<'_>,
    store: &PyStore,
    run_id: &str,
) -> PyResult<Vec<String>> {
    on_store(py, store, |s| answered_nodes(s, run_id))
}

/// `graph_answered_nodes` for an async driver, resolving `future` with the list.
#[pyfunction]
pub fn graph_aanswered_nodes(
    py: Python<'_>,
    future: Bound<'_, PyAny>,
    store: &PyStore,
    run_id: String,
) -> PyResult<()> {
    on_store_off_loop(
        py,
        future,
        store,
        move |s| answered_nodes(s, &run_id),
        |py, nodes| Ok(nodes.into_pyobject(py)?.into_any().unbind()),
    )
}

fn run_head(s: &dyn Store, run_id: &str) -> CoreResult<Option<String>> {
    let Some(run) = s.get_run(run_id)? else {
        return Ok(None);
    };
    let mut out = None;
    s.read(&mut |c| {
        out = c.run_head(run.rid)?.map(|r| r.checkpoint_id);
        Ok(())
    })?;
    Ok(out)
}
