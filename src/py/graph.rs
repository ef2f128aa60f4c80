//! `GraphDef`, `GraphRun` and the thread functions: the graph engine as
//! `composeai.graph` drives it. Values cross as JSON text.

use super::attempt::PyAttempt;
use super::errors::IntoPy;
use super::store::PyStore;
use crate::error::{CoreError, CoreResult};
use crate::graph::checkpoint::Progress;
use crate::graph::exec::{GraphRun, Outcome};
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
    inner: Mutex<GraphRun>,
}

/// `(node, scope, step, resume_json, attempt, done_json)`.
type ExecTuple = (String, String, i64, Option<String>, i64, Option<String>);
/// `(node, kind, update_json, goto_targets, payload_json)`.
type OutcomeTuple = (
    String,
    String,
    Option<String>,
    Option<Vec<String>>,
    Option<String>,
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
    let g = graph.inner.clone();
    let a = attempt.inner.clone();
    let run = py
        .allow_threads(move || -> CoreResult<GraphRun> {
            let input = input_json
                .map(|t| parse_state(&t, "graph input"))
                .transpose()?;
            GraphRun::open(g, a, thread_id, input, fresh, max_steps, deadline)
        })
        .py_err()?;
    Ok(PyGraphRun {
        inner: Mutex::new(run),
    })
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
    let progress: Progress = serde_json::from_str(progress_json)
        .map_err(|e| CoreError::Config(format!("the snapshot cannot be read: {e}")))
        .py_err()?;
    let run = GraphRun::from_snapshot(
        graph.inner.clone(),
        attempt.inner.clone(),
        state,
        progress,
        max_steps,
        deadline,
    );
    Ok(PyGraphRun {
        inner: Mutex::new(run),
    })
}

fn exec_tuple(e: crate::graph::exec::Exec) -> ExecTuple {
    (e.node, e.scope, e.step, e.resume, e.attempt, e.done)
}

fn outcome(t: OutcomeTuple) -> CoreResult<(String, Outcome)> {
    let (node, kind, update, targets, payload) = t;
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

    /// Records `(node, value_json)` answers for exactly the suspended nodes.
    fn answer(&self, py: Python<'_>, values: Vec<(String, String)>) -> PyResult<()> {
        py.allow_threads(|| self.inner.lock().answer(values))
            .py_err()
    }

    /// Merges a step's outcomes; returns `(delta_json, routers, status,
    /// ready)`: with routers to call, `status` is `None` until `route`.
    #[allow(clippy::type_complexity)]
    fn step(
        &self,
        py: Python<'_>,
        outcomes: Vec<OutcomeTuple>,
    ) -> PyResult<(String, Vec<String>, Option<String>, Vec<ExecTuple>)> {
        let stepped = py
            .allow_threads(|| -> CoreResult<_> {
                let parsed = outcomes
                    .into_iter()
                    .map(outcome)
                    .collect::<CoreResult<Vec<_>>>()?;
                self.inner.lock().step(parsed)
            })
            .py_err()?;
        Ok((
            stepped.delta,
            stepped.routers,
            stepped.status,
            stepped.ready.into_iter().map(exec_tuple).collect(),
        ))
    }

    /// The routers' labels; returns `(status, ready)`.
    fn route(
        &self,
        py: Python<'_>,
        labels: Vec<(String, String)>,
    ) -> PyResult<(String, Vec<ExecTuple>)> {
        let (status, ready) = py
            .allow_threads(|| self.inner.lock().route(labels))
            .py_err()?;
        Ok((status, ready.into_iter().map(exec_tuple).collect()))
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

    fn release(&self, py: Python<'_>, status: &str) -> PyResult<()> {
        py.allow_threads(|| self.inner.lock().release(status))
            .py_err()
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

fn dyn_store(store: &PyStore) -> Arc<dyn Store> {
    store.inner.clone()
}

fn to_json_text<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// Claims a thread for `run()` and creates its new run in one transaction;
/// returns the run's first attempt.
#[pyfunction]
#[pyo3(signature = (store, thread_id, graph, fingerprint, args_json, budget_json, run_id))]
#[allow(clippy::too_many_arguments)]
pub fn thread_start(
    py: Python<'_>,
    store: &PyStore,
    thread_id: &str,
    graph: &str,
    fingerprint: &str,
    args_json: String,
    budget_json: Option<String>,
    run_id: String,
) -> PyResult<PyAttempt> {
    let new = crate::store::NewRun {
        run_id: run_id.clone(),
        trace_id: crate::ids::new_ulid(),
        kind: "graph".into(),
        name: graph.to_string(),
        fingerprint: Some(fingerprint.to_string()),
        args_json: Some(args_json),
        budget_json,
    };
    let s = dyn_store(store);
    let attempt = py
        .allow_threads(|| {
            crate::run::Attempt::start_with(s, new, &mut |tx| {
                threads::claim_in(tx, thread_id, graph, fingerprint, Claim::Run, Some(&run_id))
                    .map(|_| ())
            })
        })
        .py_err()?;
    Ok(PyAttempt::new(attempt))
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
    let s = dyn_store(store);
    let before = py
        .allow_threads(|| threads::claim(&*s, thread_id, graph, fingerprint, mode, run_id))
        .py_err()?;
    Ok(to_json_text(&before.map(|t| {
        let mut v = t.to_json();
        v["fingerprint"] = Value::String(t.fingerprint.clone());
        v
    })))
}

#[pyfunction]
pub fn thread_release(
    py: Python<'_>,
    store: &PyStore,
    thread_id: &str,
    status: &str,
) -> PyResult<()> {
    let s = dyn_store(store);
    py.allow_threads(|| threads::release(&*s, thread_id, status))
        .py_err()
}

/// The thread row as JSON (with its fingerprint), or `null`.
#[pyfunction]
pub fn thread_info(py: Python<'_>, store: &PyStore, thread_id: &str) -> PyResult<String> {
    let s = dyn_store(store);
    let t = py
        .allow_threads(|| threads::info(&*s, thread_id))
        .py_err()?;
    Ok(to_json_text(&t.map(|t| {
        let mut v = t.to_json();
        v["fingerprint"] = Value::String(t.fingerprint.clone());
        v
    })))
}

/// `(state_json, progress_json)` at the thread's head, or `None`.
#[pyfunction]
pub fn thread_state(
    py: Python<'_>,
    store: &PyStore,
    thread_id: &str,
) -> PyResult<Option<(String, String)>> {
    let s = dyn_store(store);
    py.allow_threads(|| threads::head_state(&*s, thread_id))
        .py_err()
}

#[pyfunction]
pub fn thread_history(
    py: Python<'_>,
    store: &PyStore,
    thread_id: &str,
    limit: i64,
) -> PyResult<String> {
    let s = dyn_store(store);
    let rows = py
        .allow_threads(|| threads::history(&*s, thread_id, limit))
        .py_err()?;
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
    let s = dyn_store(store);
    let rows = py
        .allow_threads(|| threads::history_any(&*s, thread_id, limit))
        .py_err()?;
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
    let s = dyn_store(store);
    let v = py
        .allow_threads(|| threads::rewind(&*s, thread_id, graph, fingerprint, checkpoint_id))
        .py_err()?;
    Ok(v.to_string())
}

#[pyfunction]
pub fn thread_rewind_any(
    py: Python<'_>,
    store: &PyStore,
    thread_id: &str,
    checkpoint_id: &str,
) -> PyResult<String> {
    let s = dyn_store(store);
    let v = py
        .allow_threads(|| threads::rewind_any(&*s, thread_id, checkpoint_id))
        .py_err()?;
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
    let s = dyn_store(store);
    let v = py
        .allow_threads(|| {
            threads::fork(
                &*s,
                thread_id,
                graph,
                fingerprint,
                checkpoint_id,
                new_thread_id,
            )
        })
        .py_err()?;
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
    let s = dyn_store(store);
    py.allow_threads(|| threads::delete(&*s, thread_id, graph, fingerprint))
        .py_err()
}

/// Deletes threads not updated since `before_ms`; returns their ids.
#[pyfunction]
pub fn thread_prune(py: Python<'_>, store: &PyStore, before_ms: i64) -> PyResult<Vec<String>> {
    let s = dyn_store(store);
    py.allow_threads(|| threads::prune(&*s, before_ms)).py_err()
}

#[pyfunction]
#[pyo3(signature = (store, graph=None))]
pub fn thread_list(py: Python<'_>, store: &PyStore, graph: Option<&str>) -> PyResult<String> {
    let s = dyn_store(store);
    let rows = py.allow_threads(|| threads::list(&*s, graph)).py_err()?;
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
    let s = dyn_store(store);
    py.allow_threads(|| threads::add_audit(&*s, thread_id, actor, action, checkpoint_id))
        .py_err()
}

#[pyfunction]
pub fn thread_audit(
    py: Python<'_>,
    store: &PyStore,
    thread_id: &str,
    limit: i64,
) -> PyResult<String> {
    let s = dyn_store(store);
    let rows = py
        .allow_threads(|| threads::audit(&*s, thread_id, limit))
        .py_err()?;
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
    let s = dyn_store(store);
    py.allow_threads(|| threads::check_resume(&*s, thread_id, &names))
        .py_err()
}

/// Refuses resume values that do not name exactly a snapshot's waiting nodes.
#[pyfunction]
pub fn graph_check_resume(progress_json: &str, names: Vec<String>) -> PyResult<()> {
    let progress: Progress = serde_json::from_str(progress_json)
        .map_err(|e| CoreError::Config(format!("the snapshot cannot be read: {e}")))
        .py_err()?;
    crate::graph::exec::check_answers(&progress.pending, &names).py_err()
}

/// The newest checkpoint id of a thread-less graph run, or `None`.
#[pyfunction]
pub fn graph_run_head(py: Python<'_>, store: &PyStore, run_id: &str) -> PyResult<Option<String>> {
    let s = dyn_store(store);
    py.allow_threads(|| -> CoreResult<Option<String>> {
        let Some(run) = s.get_run(run_id)? else {
            return Ok(None);
        };
        let mut out = None;
        s.read(&mut |c| {
            out = c.run_head(run.rid)?.map(|r| r.checkpoint_id);
            Ok(())
        })?;
        Ok(out)
    })
    .py_err()
}
