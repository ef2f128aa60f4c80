//! Store calls of the async drivers, off the event loop (ASYNC-1, STORE-2):
//! a core operation that waits on a server runs on the core runtime's
//! blocking pool, and its outcome resolves an asyncio future of the caller's
//! loop through `composeai._engine.resolve_future`, the same bridge an
//! async step commit uses. The loop runs meanwhile.

use super::errors::to_py;
use crate::error::CoreResult;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;

/// `composeai._engine.resolve_future`, looked up once.
static RESOLVE: GILOnceCell<PyObject> = GILOnceCell::new();

pub(crate) fn resolver(py: Python<'_>) -> PyResult<PyObject> {
    Ok(RESOLVE
        .get_or_try_init(py, || {
            py.import("composeai._engine")?
                .getattr("resolve_future")
                .map(Bound::unbind)
        })?
        .clone_ref(py))
}

/// Hands `(ok, value)` to `future` on its loop (a closed loop has nobody
/// left to tell).
pub(crate) fn deliver(
    py: Python<'_>,
    event_loop: &PyObject,
    future: PyObject,
    outcome: PyResult<PyObject>,
) {
    let (ok, value) = match outcome {
        Ok(v) => (true, v),
        Err(e) => (false, e.into_value(py).into_any()),
    };
    let Ok(resolve) = resolver(py) else { return };
    let _ = event_loop.call_method1(py, "call_soon_threadsafe", (resolve, future, ok, value));
}

/// Runs `work` off the loop and resolves `future` with `convert` of its
/// value, or with the error. A panic in `work` becomes a `RuntimeError`.
pub(crate) fn resolve_with<T, W, C>(
    py: Python<'_>,
    future: Bound<'_, PyAny>,
    work: W,
    convert: C,
) -> PyResult<()>
where
    T: Send + 'static,
    W: FnOnce() -> CoreResult<T> + Send + 'static,
    C: FnOnce(Python<'_>, T) -> PyResult<PyObject> + Send + 'static,
{
    let event_loop = future.call_method0("get_loop")?.unbind();
    let future = future.unbind();
    resolver(py)?;
    crate::runtime::runtime().spawn_blocking(move || {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        Python::with_gil(|py| {
            let outcome = match outcome {
                Ok(Ok(v)) => convert(py, v),
                Ok(Err(e)) => Err(to_py(e)),
                Err(panic) => Err(PyRuntimeError::new_err(format!(
                    "composeai core panicked: {}",
                    panic_message(panic.as_ref())
                ))),
            };
            deliver(py, &event_loop, future, outcome);
        });
    });
    Ok(())
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".into()
    }
}
