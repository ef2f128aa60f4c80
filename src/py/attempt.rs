//! `Attempt` and `Fence`: the engine protocol the Python drivers follow.
//! Python reserves a key, runs the body on a miss, and commits the value;
//! the core decides replay, first-write-wins and journal access.

use super::errors::to_py;
use super::errors::IntoPy;
use super::rows::{interrupt_tuple, PendingTuple};
use super::spans::span_from_py;
use crate::journal::Call;
use crate::journal::Fence;
use crate::run::{Attempt, Commit};
use crate::store::{AgentStateRow, InterruptRow, Settlement};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyString, PyTuple};
use std::sync::Arc;

#[pyclass(name = "Fence", module = "composeai._core", frozen)]
#[derive(Clone)]
pub struct PyFence {
    pub inner: Fence,
}

#[pymethods]
impl PyFence {
    /// A fence revoked together with this one, or on its own.
    fn child(&self) -> PyFence {
        PyFence {
            inner: self.inner.child(),
        }
    }

    fn revoke(&self) {
        self.inner.revoke();
    }

    #[getter]
    fn revoked(&self) -> bool {
        self.inner.is_revoked()
    }
}

type AgentStateTuple = (String, String, Option<String>, i64);

fn agent_state_row(t: AgentStateTuple) -> AgentStateRow {
    AgentStateRow {
        scope_key: t.0,
        messages_json: t.1,
        partial_results_json: t.2,
        turn: t.3,
    }
}

#[pyclass(name = "Attempt", module = "composeai._core", frozen)]
pub struct PyAttempt {
    pub(crate) inner: Arc<Attempt>,
}

impl PyAttempt {
    pub fn new(attempt: Attempt) -> PyAttempt {
        PyAttempt {
            inner: Arc::new(attempt),
        }
    }
}

#[pymethods]
impl PyAttempt {
    #[getter]
    fn run_id(&self) -> &str {
        &self.inner.run.run_id
    }

    #[getter]
    fn trace_id(&self) -> &str {
        self.inner.trace_id()
    }

    #[getter]
    fn kind(&self) -> &str {
        &self.inner.run.kind
    }

    #[getter]
    fn name(&self) -> &str {
        &self.inner.run.name
    }

    #[getter]
    fn status(&self) -> &str {
        &self.inner.run.status
    }

    #[getter]
    fn fingerprint(&self) -> Option<&str> {
        self.inner.run.fingerprint.as_deref()
    }

    #[getter]
    fn args_json(&self) -> Option<&str> {
        self.inner.run.args_json.as_deref()
    }

    #[getter]
    fn budget_json(&self) -> Option<&str> {
        self.inner.run.budget_json.as_deref()
    }

    #[getter]
    fn output_json(&self) -> Option<&str> {
        self.inner.run.output_json.as_deref()
    }

    fn root_fence(&self) -> PyFence {
        PyFence {
            inner: self.inner.root_fence().clone(),
        }
    }

    /// Allocates the next key for `name` in `scope`; returns
    /// `(key, value_json or None)`. With `kind`, the step is a journaled
    /// call of the body, checked against its recorded identity (issue 27).
    #[pyo3(signature = (scope, name, fence=None, kind=None, digest=None))]
    fn reserve<'py>(
        &self,
        py: Python<'py>,
        scope: &str,
        name: &str,
        fence: Option<&PyFence>,
        kind: Option<&str>,
        digest: Option<u64>,
    ) -> PyResult<(String, Option<Bound<'py, PyString>>)> {
        let call = kind.map(|kind| Call { kind, digest });
        let reserved = self
            .inner
            .reserve(scope, name, call, fence.map(|f| &f.inner));
        super::errors::warn_divergences(py, &self.inner)?;
        let (key, hit) = reserved.py_err()?;
        Ok((key, hit.map(|v| PyString::new(py, &v))))
    }

    /// How a divergence from the journal is met: "raise" or "warn".
    fn set_divergence(&self, mode: &str) -> PyResult<()> {
        self.inner.set_divergence(mode).py_err()
    }

    /// Raises `NondeterminismError` when the body, now done, did not make
    /// every journaled call of the run's own scope.
    fn check_complete(&self, py: Python<'_>) -> PyResult<()> {
        let checked = self.inner.check_complete();
        super::errors::warn_divergences(py, &self.inner)?;
        checked.py_err()
    }

    /// Makes this attempt (a new run's first) a fork of run `source`,
    /// executing from journal key `at` on (issue 27).
    fn fork_from(&self, py: Python<'_>, source: &str, at: &str) -> PyResult<()> {
        let store = self.inner.store().clone();
        let read = py.allow_threads(|| store.read_journal(source)).py_err()?;
        let Some((_, journal)) = read else {
            return Err(crate::error::CoreError::Config(format!(
                "no run found with run_id '{source}'"
            )))
            .py_err();
        };
        self.inner
            .set_source(source, journal, at.to_string())
            .py_err()
    }

    /// The `NondeterminismError` that ended this attempt's journal access.
    fn divergence(&self, py: Python<'_>) -> Option<PyObject> {
        self.inner
            .divergence()
            .map(|e| to_py(e).into_value(py).into_any())
    }

    #[getter]
    fn replayed_steps(&self) -> u64 {
        self.inner.replayed_steps()
    }

    #[getter]
    fn replay_only(&self) -> bool {
        self.inner.is_replay_only()
    }

    /// A step's start in one call. Allocates the key for `name` in `scope`;
    /// on a miss returns it. On a journal hit, queues the replayed span and
    /// returns the record `(value, span_id, parent_span_id, kind, name, at,
    /// key, capture)`, the stored value decoded: the body is not run and
    /// nothing is read from the store (FLOW-16, FLOW-19).
    #[pyo3(signature = (scope, name, kind, parent_span_id, capture, fence=None, digest=None))]
    #[allow(clippy::too_many_arguments)]
    fn replay<'py>(
        &self,
        py: Python<'py>,
        scope: &str,
        name: &Bound<'py, PyString>,
        kind: &Bound<'py, PyString>,
        parent_span_id: &Bound<'py, PyAny>,
        capture: bool,
        fence: Option<&PyFence>,
        digest: Option<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let name_str = name.to_str()?;
        let call = Call {
            kind: kind.to_str()?,
            digest,
        };
        let reserved = self
            .inner
            .reserve(scope, name_str, Some(call), fence.map(|f| &f.inner));
        super::errors::warn_divergences(py, &self.inner)?;
        let (key, hit) = reserved.py_err()?;
        let Some(stored) = hit else {
            return Ok(PyString::new(py, &key).into_any());
        };
        let value = super::codec::decode(py, &stored)?;
        let span_id = crate::ids::new_ulid();
        let at = crate::time::now();
        let parent: Option<String> = parent_span_id.extract()?;
        let record = PyTuple::new(
            py,
            [
                value,
                PyString::new(py, &span_id).into_any(),
                parent_span_id.clone(),
                kind.clone().into_any(),
                name.clone().into_any(),
                PyFloat::new(py, at).into_any(),
                PyString::new(py, &key).into_any(),
                PyBool::new(py, capture).to_owned().into_any(),
            ],
        )?;
        self.inner.queue_replayed_span(
            span_id,
            parent,
            kind.to_str()?.to_owned(),
            name_str.to_owned(),
            at,
            key,
            capture,
        );
        Ok(record.into_any())
    }

    #[pyo3(signature = (scope, name, fence=None))]
    fn next_key(&self, scope: &str, name: &str, fence: Option<&PyFence>) -> PyResult<String> {
        self.inner
            .next_key(scope, name, fence.map(|f| &f.inner))
            .py_err()
    }

    /// Allocates the key of a `map` (`digest`: its number of items) or an
    /// `aggregate` (`digest`: the hash of its branches' names): a call that
    /// takes a position and is checked, but journals no row of its own.
    #[pyo3(signature = (scope, kind, digest, fence=None))]
    fn open_scope(
        &self,
        py: Python<'_>,
        scope: &str,
        kind: &str,
        digest: u64,
        fence: Option<&PyFence>,
    ) -> PyResult<String> {
        let call = Call {
            kind,
            digest: Some(digest),
        };
        let opened = self
            .inner
            .open_scope(scope, kind, call, fence.map(|f| &f.inner));
        super::errors::warn_divergences(py, &self.inner)?;
        opened.py_err()
    }

    /// `compose.patched` (or, with `deprecate`, `deprecate_patch`) in
    /// `scope`: whether the body takes the patched branch; journals the
    /// marker where the body runs past the journal of a run started on
    /// this code (`same_code`: the run's fingerprint is the code's).
    #[pyo3(signature = (scope, patch_id, same_code, deprecate=false, fence=None))]
    fn patched(
        &self,
        py: Python<'_>,
        scope: &str,
        patch_id: &str,
        same_code: bool,
        deprecate: bool,
        fence: Option<&PyFence>,
    ) -> PyResult<bool> {
        let attempt = &self.inner;
        let fence = fence.map(|f| f.inner.clone());
        py.allow_threads(|| attempt.patched(scope, patch_id, same_code, deprecate, fence.as_ref()))
            .py_err()
    }

    #[pyo3(signature = (key, fence=None))]
    fn lookup<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        fence: Option<&PyFence>,
    ) -> PyResult<Option<Bound<'py, PyString>>> {
        let hit = self.inner.lookup(key, fence.map(|f| &f.inner)).py_err()?;
        Ok(hit.map(|v| PyString::new(py, &v)))
    }

    /// Journals `value_json` under `key` with the step's span, durably, and
    /// returns the stored value (an earlier write wins).
    #[pyo3(signature = (key, value_json, span=None, fence=None))]
    fn commit<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        value_json: &str,
        span: Option<&Bound<'py, PyAny>>,
        fence: Option<&PyFence>,
    ) -> PyResult<Bound<'py, PyString>> {
        let span = span.map(span_from_py).transpose()?;
        if self.inner.batches(fence.map(|f| &f.inner)) {
            // Only queued: no I/O to release the GIL for.
            let stored = self.inner.commit(key, value_json, span, None).py_err()?;
            return Ok(PyString::new(py, &stored));
        }
        let fence = fence.map(|f| f.inner.clone());
        let inner = self.inner.clone();
        let stored = py
            .allow_threads(move || inner.commit(key, value_json, span, fence.as_ref()))
            .py_err()?;
        Ok(PyString::new(py, &stored))
    }

    /// Whether commits wait on a server: the async driver then awaits
    /// `acommit` rather than blocking its event loop on `commit`.
    #[getter]
    fn remote(&self) -> bool {
        self.inner.store().remote()
    }

    /// `commit` for the async driver: resolves `future` (of the running
    /// loop) with the stored value, or the error, from the core's runtime
    /// once the server answered; the loop runs meanwhile.
    #[pyo3(signature = (key, value_json, span, fence, future))]
    fn acommit<'py>(
        &self,
        py: Python<'py>,
        key: String,
        value_json: String,
        span: Option<&Bound<'py, PyAny>>,
        fence: Option<&PyFence>,
        future: Bound<'py, PyAny>,
    ) -> PyResult<()> {
        let span = span.map(span_from_py).transpose()?;
        if fence.is_some() && self.inner.batches(None) && self.inner.store().remote() {
            // A fenced step under batch durability first commits the waiting
            // batch (`Attempt::sync_point`): the whole commit runs off the loop.
            let fence = fence.map(|f| f.inner.clone());
            let inner = self.inner.clone();
            return super::offloop::resolve_with(
                py,
                future,
                move || inner.commit(&key, &value_json, span, fence.as_ref()),
                |py, v| Ok(PyString::new(py, &v).into_any().unbind()),
            );
        }
        let pending = match self
            .inner
            .begin_commit(&key, &value_json, span, fence.map(|f| &f.inner))
            .py_err()?
        {
            Commit::Stored(v) => {
                future.call_method1("set_result", (PyString::new(py, &v),))?;
                return Ok(());
            }
            Commit::Pending(p) => p,
        };
        let event_loop = future.call_method0("get_loop")?.unbind();
        let future = future.unbind();
        super::offloop::resolver(py)?;
        let inner = self.inner.clone();
        let owed = super::offloop::Owed::new();
        crate::runtime::runtime().spawn(async move {
            let outcome = pending
                .await
                .map(|winner| inner.end_commit(&key, &value_json, winner));
            owed.with_gil(|py| {
                let outcome = outcome
                    .map(|v| PyString::new(py, &v).into_any().unbind())
                    .map_err(to_py);
                super::offloop::deliver(py, &event_loop, future, outcome);
            });
        });
        Ok(())
    }

    /// Like `commit`, but durable soon rather than before returning; `sync`
    /// waits for it. For steps whose value the flow body sees only later.
    #[pyo3(signature = (key, value_json, span=None, fence=None))]
    fn commit_deferred<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        value_json: &str,
        span: Option<&Bound<'py, PyAny>>,
        fence: Option<&PyFence>,
    ) -> PyResult<Bound<'py, PyString>> {
        let span = span.map(span_from_py).transpose()?;
        let inner = &self.inner;
        let stored = py
            .allow_threads(|| inner.commit_deferred(key, value_json, span, fence.map(|f| &f.inner)))
            .py_err()?;
        Ok(PyString::new(py, &stored))
    }

    /// Where this attempt's spans begin in the store: 0 for a first
    /// attempt (a new run has none), `None` when the store cannot read
    /// spans back (see `step_spans`).
    fn span_mark(&self, py: Python<'_>) -> PyResult<Option<i64>> {
        let inner = &self.inner;
        py.allow_threads(|| inner.span_mark()).py_err()
    }

    /// Switches the attempt to batch durability (`durability="batch"`).
    fn set_batch(&self) -> PyResult<()> {
        self.inner.set_batch().py_err()
    }

    /// Waits until every deferred journal write of this attempt is durable.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        let inner = self.inner.clone();
        py.allow_threads(move || inner.sync()).py_err()
    }

    /// `sync` for an async driver, resolving `future` with `None`.
    fn aflush(&self, py: Python<'_>, future: Bound<'_, PyAny>) -> PyResult<()> {
        let inner = self.inner.clone();
        super::offloop::resolve_with(py, future, move || inner.sync(), |py, ()| Ok(py.None()))
    }

    /// Queues the span of a replayed step (see `Attempt::queue_replayed_span`).
    #[allow(clippy::too_many_arguments)]
    fn replayed(
        &self,
        span_id: String,
        parent_span_id: Option<String>,
        kind: String,
        name: String,
        at: f64,
        step_key: String,
        with_output: bool,
    ) {
        self.inner.queue_replayed_span(
            span_id,
            parent_span_id,
            kind,
            name,
            at,
            step_key,
            with_output,
        );
    }

    /// Stores an agent snapshot `(scope_key, messages_json,
    /// partial_results_json, turn)` durably.
    #[pyo3(signature = (state, fence=None))]
    fn save_agent_state(
        &self,
        py: Python<'_>,
        state: AgentStateTuple,
        fence: Option<&PyFence>,
    ) -> PyResult<()> {
        let row = agent_state_row(state);
        let fence = fence.map(|f| f.inner.clone());
        let inner = self.inner.clone();
        py.allow_threads(move || inner.save_agent_state(&row, fence.as_ref()))
            .py_err()
    }

    /// The snapshot for `scope_key` as `(messages_json, partial_results_json,
    /// turn)`, or `None`.
    fn load_agent_state(
        &self,
        py: Python<'_>,
        scope_key: &str,
    ) -> PyResult<Option<(String, Option<String>, i64)>> {
        let row = py
            .allow_threads(|| self.inner.load_agent_state(scope_key))
            .py_err()?;
        Ok(row.map(|r| (r.messages_json, r.partial_results_json, r.turn)))
    }

    /// `(tokens, usd)` of earlier attempts' `llm` spans (one step's, with
    /// `step_key`).
    #[pyo3(signature = (step_key=None))]
    fn prior_llm_usage(&self, py: Python<'_>, step_key: Option<&str>) -> PyResult<(i64, f64)> {
        py.allow_threads(|| self.inner.prior_llm_usage(step_key))
            .py_err()
    }

    /// `prior_llm_usage()` of the whole run for an async driver, resolving
    /// `future` with `(tokens, cost)`.
    fn aprior_llm_usage(&self, py: Python<'_>, future: Bound<'_, PyAny>) -> PyResult<()> {
        let inner = self.inner.clone();
        super::offloop::resolve_with(
            py,
            future,
            move || inner.prior_llm_usage(None),
            |py, usage| Ok(usage.into_pyobject(py)?.into_any().unbind()),
        )
    }

    /// Commits the run row now if its insert is still queued: before user
    /// code that may run long or tell others the run id (a tool batch).
    fn store_row(&self, py: Python<'_>) -> PyResult<()> {
        let inner = self.inner.clone();
        py.allow_threads(move || inner.rid().map(|_| ())).py_err()
    }

    /// Queues a finished span of this run.
    fn span(&self, span: &Bound<'_, PyAny>) -> PyResult<()> {
        self.inner.queue_span(span_from_py(span)?);
        Ok(())
    }

    fn set_budget(&self, py: Python<'_>, budget_json: &str) -> PyResult<()> {
        py.allow_threads(|| self.inner.set_budget(budget_json))
            .py_err()
    }

    /// `set_budget` for an async driver, resolving `future` with `None`.
    fn aset_budget(
        &self,
        py: Python<'_>,
        future: Bound<'_, PyAny>,
        budget_json: String,
    ) -> PyResult<()> {
        let inner = self.inner.clone();
        super::offloop::resolve_with(
            py,
            future,
            move || inner.set_budget(&budget_json),
            |py, ()| Ok(py.None()),
        )
    }

    /// Journals `(interrupt_id, value_json)` answers and clears them from
    /// the pending interrupts.
    fn record_answers(&self, py: Python<'_>, answers: Vec<(String, String)>) -> PyResult<()> {
        py.allow_threads(|| self.inner.record_answers(answers))
            .py_err()
    }

    fn pending(&self, py: Python<'_>) -> PyResult<Vec<PendingTuple>> {
        let rows = py.allow_threads(|| self.inner.pending()).py_err()?;
        Ok(rows.into_iter().map(interrupt_tuple).collect())
    }

    /// Ends the attempt by deleting the run and everything stored for it.
    fn discard(&self, py: Python<'_>) -> PyResult<()> {
        py.allow_threads(|| self.inner.discard()).py_err()
    }

    /// Ends the attempt: status, output or error, pending interrupts, lease
    /// released, queued spans written, in one transaction.
    #[pyo3(signature = (status, output_json=None, error_json=None, pending=vec![], agent_states=vec![]))]
    fn settle(
        &self,
        py: Python<'_>,
        status: String,
        output_json: Option<String>,
        error_json: Option<String>,
        pending: Vec<PendingTuple>,
        agent_states: Vec<AgentStateTuple>,
    ) -> PyResult<()> {
        let settlement = settlement(status, output_json, error_json, pending, agent_states);
        py.allow_threads(|| self.inner.settle(settlement)).py_err()
    }

    /// `settle` for an async driver: `future` (of the running loop) is
    /// resolved with `None` once the settlement is durable.
    #[pyo3(signature = (future, status, output_json=None, error_json=None, pending=vec![], agent_states=vec![]))]
    #[allow(clippy::too_many_arguments)]
    fn asettle(
        &self,
        py: Python<'_>,
        future: Bound<'_, PyAny>,
        status: String,
        output_json: Option<String>,
        error_json: Option<String>,
        pending: Vec<PendingTuple>,
        agent_states: Vec<AgentStateTuple>,
    ) -> PyResult<()> {
        let settlement = settlement(status, output_json, error_json, pending, agent_states);
        let inner = self.inner.clone();
        super::offloop::resolve_with(
            py,
            future,
            move || inner.settle(settlement),
            |py, ()| Ok(py.None()),
        )
    }

    /// `record_answers` for an async driver, resolving `future` with `None`.
    fn arecord_answers(
        &self,
        py: Python<'_>,
        future: Bound<'_, PyAny>,
        answers: Vec<(String, String)>,
    ) -> PyResult<()> {
        let inner = self.inner.clone();
        super::offloop::resolve_with(
            py,
            future,
            move || inner.record_answers(answers),
            |py, ()| Ok(py.None()),
        )
    }
}

fn settlement(
    status: String,
    output_json: Option<String>,
    error_json: Option<String>,
    pending: Vec<PendingTuple>,
    agent_states: Vec<AgentStateTuple>,
) -> Settlement {
    Settlement {
        status,
        output_json,
        error_json,
        pending: pending
            .into_iter()
            .map(
                |(interrupt_id, kind, question, payload_json)| InterruptRow {
                    interrupt_id,
                    kind,
                    question,
                    payload_json,
                },
            )
            .collect(),
        agent_states: agent_states.into_iter().map(agent_state_row).collect(),
        wait: None,
    }
}
