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

/// Registers the Python classes raised for core errors.
#[pyfunction]
pub fn register_errors(
    py: Python<'_>,
    config: Py<PyType>,
    serialization: Py<PyType>,
    revoked: Py<PyType>,
) -> PyResult<()> {
    let _ = CONFIG_ERROR.set(py, config);
    let _ = SERIALIZATION_ERROR.set(py, serialization);
    let _ = REVOKED_SIGNAL.set(py, revoked);
    Ok(())
}

fn raise(cell: &GILOnceCell<Py<PyType>>, msg: String) -> PyErr {
    Python::with_gil(|py| match cell.get(py) {
        Some(cls) => PyErr::from_type(cls.bind(py).clone(), msg),
        None => PyRuntimeError::new_err(msg),
    })
}

pub fn to_py(e: CoreError) -> PyErr {
    match e {
        CoreError::Config(m) => raise(&CONFIG_ERROR, m),
        CoreError::Serialization(m) => raise(&SERIALIZATION_ERROR, m),
        CoreError::Revoked(m) => raise(&REVOKED_SIGNAL, m),
        CoreError::Store(m) => raise(&CONFIG_ERROR, m),
    }
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
