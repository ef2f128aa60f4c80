//! Maps core errors onto the documented Python exception classes, which
//! live in `composeai.errors` and are handed to the core at import time.

use crate::error::CoreError;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::PyType;

static CONFIG_ERROR: GILOnceCell<Py<PyType>> = GILOnceCell::new();
static SERIALIZATION_ERROR: GILOnceCell<Py<PyType>> = GILOnceCell::new();
static REVOKED_SIGNAL: GILOnceCell<Py<PyType>> = GILOnceCell::new();
static CANCELLED_SIGNAL: GILOnceCell<Py<PyType>> = GILOnceCell::new();
static STORE_ERROR: GILOnceCell<Py<PyType>> = GILOnceCell::new();
static STORE_UNAVAILABLE: GILOnceCell<Py<PyType>> = GILOnceCell::new();
static FLOW_TIMEOUT: GILOnceCell<Py<PyType>> = GILOnceCell::new();

/// Registers the Python classes raised for core errors.
#[pyfunction]
#[pyo3(signature = (config, serialization, revoked, cancelled=None))]
pub fn register_errors(
    py: Python<'_>,
    config: Py<PyType>,
    serialization: Py<PyType>,
    revoked: Py<PyType>,
    cancelled: Option<Py<PyType>>,
) -> PyResult<()> {
    let _ = CONFIG_ERROR.set(py, config);
    let _ = SERIALIZATION_ERROR.set(py, serialization);
    let _ = REVOKED_SIGNAL.set(py, revoked);
    if let Some(cancelled) = cancelled {
        let _ = CANCELLED_SIGNAL.set(py, cancelled);
    }
    Ok(())
}

/// The class registered in `cell`, else `composeai.errors.<name>` (so
/// modules that never load the engine, like the CLI, get the same classes).
fn raise(cell: &GILOnceCell<Py<PyType>>, name: &str, msg: String) -> PyErr {
    Python::with_gil(|py| {
        if let Some(cls) = cell.get(py) {
            return PyErr::from_type(cls.bind(py).clone(), msg);
        }
        let imported = py
            .import("composeai.errors")
            .and_then(|m| m.getattr(name))
            .and_then(|c| c.downcast_into::<PyType>().map_err(PyErr::from));
        match imported {
            Ok(cls) => {
                let _ = cell.set(py, cls.clone().unbind());
                PyErr::from_type(cls, msg)
            }
            Err(_) => PyRuntimeError::new_err(msg),
        }
    })
}

pub fn to_py(e: CoreError) -> PyErr {
    match e {
        CoreError::Config(m) => raise(&CONFIG_ERROR, "ConfigError", m),
        CoreError::Serialization(m) => raise(&SERIALIZATION_ERROR, "SerializationError", m),
        CoreError::Revoked(m) => raise(&REVOKED_SIGNAL, "ComposeError", m),
        CoreError::Cancelled(m) => raise(&CANCELLED_SIGNAL, "ComposeError", m),
        CoreError::Store(m) => raise(&STORE_ERROR, "StoreError", m),
        CoreError::Unavailable(m) => raise(&STORE_UNAVAILABLE, "StoreUnavailableError", m),
        CoreError::Deadline(m) => raise(&FLOW_TIMEOUT, "FlowTimeoutError", m),
        CoreError::Nondeterminism { .. } => nondeterminism(e),
        CoreError::ReplayEnd(ref key) => replay_end(key.clone(), e.to_string()),
        CoreError::Graph {
            code,
            message,
            details_json,
        } => graph_error(code, message, details_json),
    }
}

/// `composeai.errors.NondeterminismError` with the divergence's parts as
/// attributes.
fn nondeterminism(e: CoreError) -> PyErr {
    let message = e.to_string();
    let CoreError::Nondeterminism {
        run_id,
        key,
        recorded,
        called,
    } = e
    else {
        return PyRuntimeError::new_err(message);
    };
    Python::with_gil(|py| {
        let made = py
            .import("composeai.errors")
            .and_then(|m| m.getattr("NondeterminismError"))
            .and_then(|cls| {
                let kwargs = pyo3::types::PyDict::new(py);
                kwargs.set_item("run_id", run_id)?;
                kwargs.set_item("key", key)?;
                kwargs.set_item("recorded", recorded)?;
                kwargs.set_item("called", called)?;
                cls.call((message,), Some(&kwargs))
            });
        match made {
            Ok(exc) => PyErr::from_value(exc),
            Err(e) => e,
        }
    })
}

/// Emits `composeai.errors.NondeterminismWarning` for each divergence an
/// attempt under `on_divergence="warn"` met since the last call.
pub fn warn_divergences(py: Python<'_>, attempt: &crate::run::Attempt) -> PyResult<()> {
    if !attempt.has_warnings() {
        return Ok(());
    }
    let category = py
        .import("composeai.errors")?
        .getattr("NondeterminismWarning")?;
    for warning in attempt.take_warnings() {
        let message = std::ffi::CString::new(warning.to_string().replace('\0', " "))?;
        PyErr::warn(py, &category, &message, 1)?;
    }
    Ok(())
}

/// The internal signal that ends a replay-only run at `key`.
fn replay_end(key: String, message: String) -> PyErr {
    Python::with_gil(|py| {
        let made = py
            .import("composeai.errors")
            .and_then(|m| m.getattr("_ReplayEnd"))
            .and_then(|cls| cls.call1((message, key)));
        match made {
            Ok(exc) => PyErr::from_value(exc),
            Err(e) => e,
        }
    })
}

/// A graph error becomes the `composeai.graph` class for its code.
fn graph_error(code: String, message: String, details_json: String) -> PyErr {
    Python::with_gil(|py| {
        let made = py
            .import("composeai.graph")
            .and_then(|m| m.getattr("_error_from_core"))
            .and_then(|f| f.call1((&code, &message, &details_json)));
        match made {
            Ok(exc) => PyErr::from_value(exc),
            Err(e) => e,
        }
    })
}

pub fn value_error(msg: impl Into<String>) -> PyErr {
    PyValueError::new_err(msg.into())
}

pub trait IntoPy<T> {
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for Result<T, CoreError> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
