//! Loads the SQLite Python's `sqlite3` module calls when `composeai._core`
//! is imported (see `crate::sqlite_lib`).

use crate::sqlite_lib::{self, PythonModule};
use pyo3::exceptions::PyImportError;
use pyo3::prelude::*;
use std::ffi::c_int;
use std::path::Path;

/// Fills the engine's SQLite table before anything can call SQLite; an
/// `ImportError` naming the fix when no SQLite can be found.
pub fn load(py: Python<'_>) -> PyResult<()> {
    sqlite_lib::load(sqlite3_module(py)?).map_err(PyImportError::new_err)?;
    Ok(())
}

/// Python's `_sqlite3`, found as its import would find it but not imported:
/// importing it loads `functools`, `collections` and `types`, which
/// `import composeai` does not.
fn sqlite3_module(py: Python<'_>) -> PyResult<PythonModule> {
    const NAME: &str = "_sqlite3";
    let sys = py.import("sys")?;
    let flags: c_int = sys.getattr("getdlopenflags")?.call0()?.extract()?;
    if let Ok(m) = sys.getattr("modules")?.get_item(NAME) {
        return Ok(
            match m.getattr("__file__").and_then(|f| f.extract::<String>()) {
                Ok(file) => PythonModule::File(file, flags),
                Err(_) => PythonModule::BuiltIn,
            },
        );
    }
    let builtin: Vec<String> = sys.getattr("builtin_module_names")?.extract()?;
    if builtin.iter().any(|n| n == NAME) {
        return Ok(PythonModule::BuiltIn);
    }
    let suffixes: Vec<String> = py
        .import("_imp")?
        .getattr("extension_suffixes")?
        .call0()?
        .extract()?;
    let path: Vec<Bound<'_, PyAny>> = sys.getattr("path")?.extract()?;
    for dir in path.iter().filter_map(|d| d.extract::<String>().ok()) {
        for suffix in &suffixes {
            let file =
                Path::new(if dir.is_empty() { "." } else { &dir }).join(format!("{NAME}{suffix}"));
            if file.is_file() {
                // Absolute, so dlopen takes it for a path, not a library name.
                if let Ok(file) = std::fs::canonicalize(&file) {
                    return Ok(PythonModule::File(
                        file.to_string_lossy().into_owned(),
                        flags,
                    ));
                }
            }
        }
    }
    Ok(PythonModule::Missing)
}

/// `(origin, file, version)` of the SQLite the engine calls: origin
/// `"sqlite3 module"` when it is the one Python's `sqlite3` calls,
/// `"library"` when it was loaded by name (`COMPOSEAI_SQLITE_LIBRARY`).
#[pyfunction]
pub fn sqlite_library() -> PyResult<(&'static str, String, String)> {
    let l = sqlite_lib::ensure().map_err(PyImportError::new_err)?;
    Ok((l.origin, l.file.clone(), l.version.clone()))
}
