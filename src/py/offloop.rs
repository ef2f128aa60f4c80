//! Store calls of the async drivers, off the event loop (ASYNC-1, STORE-2):
//! a core operation that waits on a server runs on the core runtime's
//! blocking pool, and its outcome resolves an asyncio future of the caller's
//! loop through `composeai._engine.resolve_future`, the same bridge an
//! async step commit uses. The loop runs meanwhile.

use super::errors::to_py;
use crate::error::CoreResult;
use parking_lot::{Condvar, Mutex};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use std::time::{Duration, Instant};

/// Deliveries the core's threads still owe an event loop, and whether the
/// interpreter has begun to exit. A thread that takes the GIL once
/// finalization has begun aborts the process, and a delivery can take it
/// right after the loop's caller returned (`call_soon_threadsafe` releases
/// the GIL to write the loop's wake-up byte), so exit waits for them.
struct Deliveries {
    owed: usize,
    closed: bool,
}

static DELIVERIES: Mutex<Deliveries> = Mutex::new(Deliveries {
    owed: 0,
    closed: false,
});
static SETTLED: Condvar = Condvar::new();

/// How long exit waits for work still in flight (a server round trip whose
/// caller has gone); later deliveries are dropped.
const EXIT_WAIT: Duration = Duration::from_secs(2);

/// One delivery owed, from hand-off until its future is resolved.
pub(crate) struct Owed(());

impl Owed {
    pub(crate) fn new() -> Owed {
        DELIVERIES.lock().owed += 1;
        Owed(())
    }

    /// Runs `f` with the GIL, unless the interpreter is exiting.
    pub(crate) fn with_gil(self, f: impl FnOnce(Python<'_>)) {
        if DELIVERIES.lock().closed {
            return;
        }
        Python::with_gil(f);
    }
}

impl Drop for Owed {
    fn drop(&mut self) {
        let mut d = DELIVERIES.lock();
        d.owed -= 1;
        if d.owed == 0 {
            SETTLED.notify_all();
        }
    }
}

/// Registered with `atexit` when the module loads, so it runs after the
/// package's own exit handlers: waits for owed deliveries, with the GIL
/// released so they can finish, then drops any that come later.
#[pyfunction]
pub(crate) fn settle_deliveries(py: Python<'_>) {
    py.allow_threads(|| {
        let deadline = Instant::now() + EXIT_WAIT;
        let mut d = DELIVERIES.lock();
        d.closed = true;
        while d.owed > 0 {
            if SETTLED.wait_until(&mut d, deadline).timed_out() {
                break;
            }
        }
    });
}

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
    let owed = Owed::new();
    crate::runtime::runtime().spawn_blocking(move || {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        owed.with_gil(|py| {
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
