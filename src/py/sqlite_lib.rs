//! Loads the SQLite Python's `sqlite3` module calls when `composeai._core`
//! is imported (see `crate::sqlite_lib`).

use crate::sqlite_lib::{self, PythonModule};
use pyo3::exceptions::PyImportError;
use pyo3::prelude::*;

/// Fills the engine's SQLite table before anything can call SQLite; an
/// `ImportError` naming the fix when no SQLite can be found.
pub fn load(py: Python<'_>) -> PyResult<()> {
    let module = match py.import("_sqlite3") {
        Ok(m) => match m.getattr("__file__").and_then(|f| f.extract::<String>()) {
            Ok(file) => PythonModule::File(file),
            Err(_) => PythonModule::BuiltIn,
        },
        Err(_) => PythonModule::Missing,
    };
    sqlite_lib::load(module).map_err(PyImportError::new_err)?;
    Ok(())
}

/// `(origin, file, version)` of the SQLite the engine calls: origin
/// `"sqlite3 module"` when it is the one Python's `sqlite3` calls,
/// `"library"` when it was loaded by name (`COMPOSEAI_SQLITE_LIBRARY`).
#[pyfunction]
pub fn sqlite_library() -> PyResult<(&'static str, String, String)> {
    let l = sqlite_lib::ensure().map_err(PyImportError::new_err)?;
    Ok((l.origin, l.file.clone(), l.version.clone()))
}
