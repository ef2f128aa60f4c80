//! The `@task` call, in the core. `composeai.Task` is a `TaskCall`: inside a
//! run, its call reserves the step's key and replays the journaled value, or
//! runs the body under a `StepFrame` and commits the value with its span,
//! described by a few scalars. No engine frame of Python runs on these
//! paths and no `Span` object is built unless the body reads its frame's
//! `span`. Every other case (outside a run, a task with a timeout or
//! retries, spans kept in memory, an event bus, journaled failures) is
//! handed whole to the Python driver (`composeai._engine`), before any key
//! is reserved.

use super::attempt::{PyAttempt, PyFence};
use super::errors::IntoPy;
use crate::journal::Fence;
use crate::run::Attempt;
use crate::store::spans::SpanView;
use parking_lot::Mutex;
use pyo3::exceptions::PyKeyError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{
    PyBool, PyBytes, PyDict, PyInt, PyString, PyTuple, PyWeakrefMethods, PyWeakrefReference,
};
use std::sync::{Arc, Weak};

/// What the call needs of the Python side, registered once by the engine.
struct Hooks {
    /// The bound `get` of `_engine.FRAME`, `_engine.ASYNC_DRIVER` and
    /// `events._BUS`, and `FRAME`'s `set` and `reset`: called with no
    /// method lookup.
    frame_get: PyObject,
    frame_set: PyObject,
    frame_reset: PyObject,
    driver_get: PyObject,
    bus_get: PyObject,
    /// `sys.modules`: the facade and cancel checks apply once their modules are loaded.
    modules: Py<PyDict>,
    facade: PyObject,
    cancel: PyObject,
    capture: PyObject,
    /// `os.environ`'s raw mapping and the encoded `COMPOSE_TRACE_CONTENT`
    /// key: OBS-70's switch read without calling `capture` (None when the
    /// platform has no such mapping).
    environ: Option<(Py<PyDict>, PyObject)>,
    dumps: PyObject,
    /// The whole step in Python: `general(frame, run, task, args, kwargs)`.
    general: PyObject,
    /// A call outside any run: `outside(task, frame, args, kwargs)`.
    outside: PyObject,
    /// A failed lean body: `failed(frame, inner, exc)`.
    failed: PyObject,
    /// A lean step whose span was built: `finish(frame, inner, value)`.
    finish: PyObject,
    /// An unencodable value: `unencodable(inner, exc)` raises.
    unencodable: PyObject,
    /// The step's input text when the core declines it: `args_json(args, kwargs)`.
    args_json: PyObject,
    /// `call_body(fn, True, args, kwargs)`: an `async def` body from sync code.
    call_body: PyObject,
    /// `build_span(step_frame)`: the `Span` of a lean step.
    build_span: PyObject,
    /// `step_digest(args, kwargs)`: the hash of arguments `args_text`
    /// cannot write (issue 27).
    digest: PyObject,
}

static HOOKS: GILOnceCell<Hooks> = GILOnceCell::new();

fn hook(hooks: &Bound<'_, PyDict>, name: &str) -> PyResult<PyObject> {
    hooks
        .get_item(name)?
        .map(Bound::unbind)
        .ok_or_else(|| PyKeyError::new_err(format!("task path hook {name:?} is missing")))
}

/// Registers the engine's side of the task call (the first registration
/// stays).
#[pyfunction]
pub fn register_task_path(py: Python<'_>, hooks: &Bound<'_, PyDict>) -> PyResult<()> {
    let frame = hook(hooks, "frame")?.into_bound(py);
    let bound = |name: &str, method: &str| -> PyResult<PyObject> {
        Ok(hook(hooks, name)?.bind(py).getattr(method)?.unbind())
    };
    let registered = Hooks {
        frame_get: frame.getattr("get")?.unbind(),
        frame_set: frame.getattr("set")?.unbind(),
        frame_reset: frame.getattr("reset")?.unbind(),
        driver_get: bound("driver", "get")?,
        bus_get: bound("bus", "get")?,
        modules: hook(hooks, "modules")?
            .into_bound(py)
            .downcast_into::<PyDict>()?
            .unbind(),
        facade: hook(hooks, "facade")?,
        cancel: hook(hooks, "cancel")?,
        capture: hook(hooks, "capture")?,
        environ: match (
            hook(hooks, "environ")?
                .into_bound(py)
                .downcast_into::<PyDict>(),
            hook(hooks, "content_key")?,
        ) {
            (Ok(environ), key) => Some((environ.unbind(), key)),
            (Err(_), _) => None,
        },
        dumps: hook(hooks, "dumps")?,
        general: hook(hooks, "general")?,
        outside: hook(hooks, "outside")?,
        failed: hook(hooks, "failed")?,
        finish: hook(hooks, "finish")?,
        unencodable: hook(hooks, "unencodable")?,
        args_json: hook(hooks, "args_json")?,
        call_body: hook(hooks, "call_body")?,
        build_span: hook(hooks, "build_span")?,
        digest: hook(hooks, "digest")?,
    };
    let _ = HOOKS.set(py, registered);
    Ok(())
}

fn hooks(py: Python<'_>) -> PyResult<&'static Hooks> {
    HOOKS
        .get(py)
        .ok_or_else(|| pyo3::exceptions::PyRuntimeError::new_err("composeai._engine is not loaded"))
}

/// The frame a lean step's body runs under: `Frame`'s attributes, with the
/// span built on first read of `span`.
#[pyclass(name = "StepFrame", module = "composeai._core", frozen)]
pub struct PyStepFrame {
    #[pyo3(get)]
    run: PyObject,
    /// The step's key: the journal scope of what the body calls.
    #[pyo3(get)]
    scope: Py<PyString>,
    #[pyo3(get)]
    fence: PyObject,
    #[pyo3(get)]
    trace: PyObject,
    #[pyo3(get)]
    span_id: Py<PyString>,
    #[pyo3(get)]
    parent_span_id: PyObject,
    #[pyo3(get)]
    name: Py<PyString>,
    #[pyo3(get)]
    started_at: f64,
    /// The call's arguments, the span's input when `capture` (OBS-70).
    #[pyo3(get)]
    args: Py<PyTuple>,
    #[pyo3(get)]
    kwargs: PyObject,
    #[pyo3(get)]
    capture: bool,
    built: GILOnceCell<PyObject>,
}

#[pymethods]
impl PyStepFrame {
    /// A step's own frame never defers its children's commits.
    #[getter]
    fn defer(&self) -> bool {
        false
    }

    /// The step's `Span`, built now if nobody read it before.
    #[getter]
    fn span(slf: &Bound<'_, Self>) -> PyResult<PyObject> {
        let py = slf.py();
        let this = slf.get();
        if let Some(span) = this.built.get(py) {
            return Ok(span.clone_ref(py));
        }
        let span = hooks(py)?.build_span.call1(py, (slf,))?;
        Ok(this.built.get_or_init(py, || span).clone_ref(py))
    }

    /// Whether `span` was read (the step then finishes in Python).
    #[getter]
    fn span_built(&self, py: Python<'_>) -> bool {
        self.built.get(py).is_some()
    }
}

#[pyclass(name = "TaskCall", module = "composeai._core", subclass, frozen)]
pub struct PyTaskCall {}

#[pymethods]
impl PyTaskCall {
    /// The subclass's `__init__` takes the arguments; its `_step` holds
    /// `(fn, name, lean, is_async)`.
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> Self {
        PyTaskCall {}
    }

    #[pyo3(signature = (*args, **kwargs))]
    fn __call__<'py>(
        slf: &Bound<'py, Self>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        task_call(slf.as_any(), args, kwargs)
    }
}

/// `kwargs` as the dict a Python `**kwargs` parameter receives.
fn kwargs_dict<'py>(py: Python<'py>, kwargs: Option<&Bound<'py, PyDict>>) -> Bound<'py, PyDict> {
    match kwargs {
        Some(k) => k.clone(),
        None => PyDict::new(py),
    }
}

fn task_call<'py>(
    task: &Bound<'py, PyAny>,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = task.py();
    let h = hooks(py)?;
    let modules = h.modules.bind(py);
    // ASYNC-6: nothing to check before the runtime is loaded or an async
    // driver is set.
    if modules.contains(intern!(py, "composeai._runtime"))?
        || !h.driver_get.bind(py).call0()?.is_none()
    {
        h.facade.call0(py)?;
    }
    let frame = h.frame_get.bind(py).call0()?;
    // The frame of the last lean step is known, and so is its run's leanness.
    let found = match known_frame(&frame) {
        Some(parts) => Found::Known(parts),
        None => {
            let run = if frame.is_none() {
                frame.clone()
            } else {
                frame.getattr(intern!(py, "run"))?
            };
            if run.is_none() {
                let kw = kwargs_dict(py, kwargs);
                return h.outside.bind(py).call1((task, frame, args, kw));
            }
            Found::Run(run)
        }
    };
    let spec = task.getattr(intern!(py, "_step"))?;
    let spec = spec.downcast::<PyTuple>()?;
    if !spec.get_item(2)?.is_truthy()?
        || !h.bus_get.bind(py).call0()?.is_none()
        || match &found {
            Found::Known(_) => false,
            Found::Run(run) => {
                run.getattr(intern!(py, "span_mark"))?.is_none()
                    || run.getattr(intern!(py, "journal_failures"))?.is_truthy()?
            }
        }
    {
        let run = match found {
            Found::Known(_) => frame.getattr(intern!(py, "run"))?,
            Found::Run(run) => run,
        };
        let kw = kwargs_dict(py, kwargs);
        return h.general.bind(py).call1((frame, run, task, args, kw));
    }
    if modules.contains(intern!(py, "composeai._streams"))? {
        h.cancel.call0(py)?;
    }
    let capture = match &h.environ {
        Some((environ, key)) => match environ.bind(py).get_item(key)? {
            Some(value) => value
                .downcast::<PyBytes>()
                .map_or(true, |v| v.as_bytes() != b"0"),
            None => true,
        },
        None => h.capture.bind(py).call0()?.is_truthy()?,
    };
    let name_obj = spec.get_item(1)?.downcast_into::<PyString>()?;
    let name = name_obj.to_str()?;
    let (parts, run) = match found {
        Found::Known(parts) => (parts, None),
        Found::Run(run) => (frame_parts(&frame, &run)?, Some(run)),
    };
    let FrameParts {
        scope: scope_obj,
        parent: parent_obj,
        fence: fence_obj,
        attempt,
    } = parts;
    let parent: Option<&str> = if parent_obj.is_none() {
        None
    } else {
        Some(parent_obj.downcast::<PyString>()?.to_str()?)
    };
    let scope = scope_obj.to_str()?;
    let fence = if fence_obj.is_none() {
        None
    } else {
        Some(fence_obj.downcast::<PyFence>()?.get().inner.clone())
    };
    let attempt = &attempt;
    let digest = match args_digest(args, kwargs)? {
        Some(d) => Some(d),
        None => h
            .digest
            .bind(py)
            .call1((args, kwargs_dict(py, kwargs)))?
            .extract()?,
    };
    let call = crate::journal::Call {
        kind: "task",
        digest,
    };
    let reserved = attempt.reserve_step(scope, name, Some(call), fence.as_ref());
    super::errors::warn_divergences(py, attempt)?;
    let (step_key, hit) = reserved.py_err()?;
    if let Some(stored) = hit {
        // FLOW-16: replayed, the body not run; the span row is queued.
        let value = super::codec::decode(py, &stored)?;
        let (span_id, at) = crate::ids::new_ulid_bytes();
        attempt.queue_replayed(span_id, parent, "task".into(), name, at, step_key, capture);
        return Ok(value);
    }
    let key = step_key.to_string();
    let body = spec.get_item(0)?;
    let is_async = spec.get_item(3)?.is_truthy()?;
    let span_id = crate::ids::new_ulid();
    let started_at = crate::time::now();
    let run = match run {
        Some(run) => run,
        None => frame.getattr(intern!(py, "run"))?,
    };
    let inner = Bound::new(
        py,
        PyStepFrame {
            run: run.unbind(),
            scope: PyString::new(py, &key).unbind(),
            fence: fence_obj.clone().unbind(),
            trace: frame.getattr(intern!(py, "trace"))?.unbind(),
            span_id: PyString::new(py, &span_id).unbind(),
            parent_span_id: parent_obj.clone().unbind(),
            name: name_obj.clone().unbind(),
            started_at,
            args: args.clone().unbind(),
            kwargs: kwargs_dict(py, kwargs).into_any().unbind(),
            capture,
            built: GILOnceCell::new(),
        },
    )?;
    let token = h.frame_set.bind(py).call1((&inner,))?;
    let outcome = if is_async {
        h.call_body
            .bind(py)
            .call1((&body, true, args, kwargs_dict(py, kwargs)))
    } else {
        body.call(args, kwargs)
    };
    h.frame_reset.bind(py).call1((token,))?;
    let value = match outcome {
        Ok(value) => value,
        Err(err) => {
            let exc = err.value(py).clone();
            if let Some(tb) = err.traceback(py) {
                if exc.getattr(intern!(py, "__traceback__"))?.is_none() {
                    exc.setattr(intern!(py, "__traceback__"), tb)?;
                }
            }
            h.failed.bind(py).call1((&frame, &inner, exc))?;
            return Err(err);
        }
    };
    if inner.get().built.get(py).is_some() {
        // The body read its span (and may have changed it): Python closes it.
        return h.finish.bind(py).call1((&frame, &inner, &value));
    }
    let (value_json, scalar) = match encode_scalar(&value)? {
        Some(text) => (text, true),
        None => match h.dumps.bind(py).call1((&value,)) {
            Ok(text) => (text.extract::<String>()?, false),
            Err(err) => {
                let exc = err.value(py).clone();
                return Err(match h.unencodable.bind(py).call1((&inner, exc)) {
                    Err(raised) => raised,
                    Ok(_) => err,
                });
            }
        },
    };
    let input_json = if capture {
        Some(match args_text(args, kwargs)? {
            Some(text) => text,
            None => h
                .args_json
                .bind(py)
                .call1((args, kwargs_dict(py, kwargs)))?
                .extract()?,
        })
    } else {
        None
    };
    let span = SpanView {
        span_id: &span_id,
        parent_span_id: parent,
        kind: "task",
        name,
        started_at,
        ended_at: Some(crate::time::now()),
        status: "ok",
        replayed: false,
        step_key: Some(&key),
        input_json: input_json.as_deref(),
        output: capture,
    };
    let stored = if frame.getattr(intern!(py, "defer"))?.is_truthy()? {
        let row = span.to_row(&value_json);
        // A server store commits here; the GIL is not held across the trip.
        py.allow_threads(|| attempt.commit_deferred(&key, &value_json, Some(row), fence.as_ref()))
            .py_err()?
    } else {
        commit(py, attempt, &key, &value_json, span, fence)?
    };
    if scalar && *stored == *value_json {
        // FLOW-18: the value decoded from what was stored; an immutable
        // scalar stored as its own text decodes to an equal object.
        return Ok(value);
    }
    super::codec::decode(py, &stored)
}

/// What a step knows of its frame before its checks: the frame's parts, if
/// it is the remembered frame of a lean run, or else its run.
enum Found<'py> {
    Known(FrameParts<'py>),
    Run(Bound<'py, PyAny>),
}

/// What a step reads of the frame it is called in.
struct FrameParts<'py> {
    scope: Bound<'py, PyString>,
    /// The parent span's id, or None.
    parent: Bound<'py, PyAny>,
    fence: Bound<'py, PyAny>,
    attempt: Arc<Attempt>,
}

/// `FrameParts` of the last flow frame a lean step was called in. A frame
/// is never changed once made (nesting makes a new one), and neither are
/// the run's `span_mark` and `journal_failures` once its body runs, so the
/// steps of one flow body read the frame's and the run's attributes once.
/// Held weakly: the cache keeps no frame, run or attempt alive, and a frame
/// that died never matches.
struct FrameView {
    frame: Py<PyWeakrefReference>,
    scope: Py<PyString>,
    parent: PyObject,
    fence: PyObject,
    attempt: Weak<Attempt>,
}

static LAST_FRAME: Mutex<Option<FrameView>> = parking_lot::const_mutex(None);

/// `FrameParts` of `frame` if it is the remembered one.
fn known_frame<'py>(frame: &Bound<'py, PyAny>) -> Option<FrameParts<'py>> {
    let py = frame.py();
    let last = LAST_FRAME.lock();
    let view = last.as_ref()?;
    if !view.frame.bind(py).upgrade().is_some_and(|f| f.is(frame)) {
        return None;
    }
    Some(FrameParts {
        scope: view.scope.bind(py).clone(),
        parent: view.parent.bind(py).clone(),
        fence: view.fence.bind(py).clone(),
        attempt: view.attempt.upgrade()?,
    })
}

fn frame_parts<'py>(
    frame: &Bound<'py, PyAny>,
    run: &Bound<'py, PyAny>,
) -> PyResult<FrameParts<'py>> {
    let py = frame.py();
    if let Ok(step) = frame.downcast::<PyStepFrame>() {
        let step = step.get();
        return Ok(FrameParts {
            scope: step.scope.bind(py).clone(),
            parent: step.span_id.bind(py).clone().into_any(),
            fence: step.fence.bind(py).clone(),
            attempt: run_attempt(run)?,
        });
    }
    let parts = FrameParts {
        scope: frame
            .getattr(intern!(py, "scope"))?
            .downcast_into::<PyString>()?,
        parent: frame
            .getattr(intern!(py, "span"))?
            .getattr(intern!(py, "span_id"))?,
        fence: frame.getattr(intern!(py, "fence"))?,
        attempt: run_attempt(run)?,
    };
    if let Ok(weak) = PyWeakrefReference::new(frame) {
        let view = FrameView {
            frame: weak.unbind(),
            scope: parts.scope.clone().unbind(),
            parent: parts.parent.clone().unbind(),
            fence: parts.fence.clone().unbind(),
            attempt: Arc::downgrade(&parts.attempt),
        };
        // The replaced view is dropped after the lock is released.
        let old = LAST_FRAME.lock().replace(view);
        drop(old);
    }
    Ok(parts)
}

fn run_attempt(run: &Bound<'_, PyAny>) -> PyResult<Arc<Attempt>> {
    Ok(run
        .getattr(intern!(run.py(), "attempt"))?
        .downcast::<PyAttempt>()?
        .get()
        .inner
        .clone())
}

/// The step's durable commit (only queued under batch durability), the GIL
/// released while it writes.
fn commit(
    py: Python<'_>,
    attempt: &Arc<Attempt>,
    key: &str,
    value_json: &str,
    span: SpanView<'_>,
    fence: Option<Fence>,
) -> PyResult<Arc<str>> {
    if attempt.batches(fence.as_ref()) {
        return attempt.commit_batched_view(key, value_json, span).py_err();
    }
    let row = span.to_row(value_json);
    let attempt = attempt.clone();
    py.allow_threads(move || attempt.commit(key, value_json, Some(row), fence.as_ref()))
        .py_err()
}

/// Integers beyond this go through the Python codec (as in `_engine._args_text`).
const BIG_INT: i64 = 1_000_000_000_000_000_000;

/// The codec's text of an exact `bool`, `None`, 64-bit `int` or ASCII `str`
/// (what `_codec.dumps` writes for them), or `None` for anything else.
fn encode_scalar(value: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    if value.is_none() {
        return Ok(Some("null".to_owned()));
    }
    if let Ok(b) = value.downcast_exact::<PyBool>() {
        return Ok(Some(if b.is_true() { "true" } else { "false" }.to_owned()));
    }
    if value.is_exact_instance_of::<PyInt>() {
        return Ok(value.extract::<i64>().ok().map(|n| n.to_string()));
    }
    if let Ok(s) = value.downcast_exact::<PyString>() {
        // Lone surrogates do not convert: the Python codec decides.
        let Ok(text) = s.to_str() else {
            return Ok(None);
        };
        if text.is_ascii() {
            let mut out = String::with_capacity(text.len() + 2);
            push_ascii_json(&mut out, text);
            return Ok(Some(out));
        }
    }
    Ok(None)
}

/// `json.encoder.encode_basestring` of ASCII text.
fn push_ascii_json(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `_engine._args_text`: the step input `{"args": [...], "kwargs": {}}` of
/// ints, bools, None and ASCII strings, as `dumps_lenient` writes it; `None`
/// for any other input.
fn args_text(
    args: &Bound<'_, PyTuple>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<Option<String>> {
    // Room for a few short arguments: no regrowth in the common case.
    let mut out = String::with_capacity(48);
    Ok(write_args_text(args, kwargs, &mut out)?.then_some(out))
}

/// The hash of `args_text` (issue 27), written into a buffer kept per
/// thread: a replayed step allocates nothing for it.
fn args_digest(
    args: &Bound<'_, PyTuple>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<Option<u64>> {
    thread_local! {
        static TEXT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    }
    TEXT.with(|text| {
        let mut out = text.borrow_mut();
        out.clear();
        let written = write_args_text(args, kwargs, &mut out)?;
        Ok(written.then(|| crate::journal::digest(&out)))
    })
}

/// Writes `args_text` into `out`; false (`out` then holds a part) for an
/// input it does not write.
fn write_args_text(
    args: &Bound<'_, PyTuple>,
    kwargs: Option<&Bound<'_, PyDict>>,
    out: &mut String,
) -> PyResult<bool> {
    if kwargs.is_some_and(|k| !k.is_empty()) {
        return Ok(false);
    }
    use std::fmt::Write;
    out.push_str("{\"args\":[");
    for (i, a) in args.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        if a.is_none() {
            out.push_str("null");
        } else if let Ok(b) = a.downcast_exact::<PyBool>() {
            out.push_str(if b.is_true() { "true" } else { "false" });
        } else if a.is_exact_instance_of::<PyInt>() {
            match a.extract::<i64>() {
                Ok(n) if -BIG_INT < n && n < BIG_INT => {
                    let _ = write!(out, "{n}");
                }
                _ => return Ok(false),
            }
        } else if let Ok(s) = a.downcast_exact::<PyString>() {
            let Ok(text) = s.to_str() else {
                return Ok(false);
            };
            if !text.is_ascii() {
                return Ok(false);
            }
            push_ascii_json(out, text);
        } else {
            return Ok(false);
        }
    }
    out.push_str("],\"kwargs\":{}}");
    Ok(true)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTaskCall>()?;
    m.add_class::<PyStepFrame>()?;
    m.add_function(wrap_pyfunction!(register_task_path, m)?)?;
    Ok(())
}
