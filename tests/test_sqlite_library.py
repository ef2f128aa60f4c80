"""Which SQLite the engine calls (OBS-1's `runs.db` is shared with Python's `sqlite3`).

The engine is built without a link-time SQLite and, on import, takes the SQLite that Python's
`_sqlite3` module calls. These tests check that choice, and the two other outcomes on a Python
whose `_sqlite3` hides its SQLite (statically linked, symbols not exported): the library named
by `COMPOSEAI_SQLITE_LIBRARY` (default `libsqlite3.so.0`), or a clear `ImportError`. Such a
Python is stood in for by a `_sqlite3` extension module built here, first on `sys.path`, that
has a hidden `sqlite3_libversion_number` of its own and no exported SQLite symbol.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from _proc import Sandbox
from composeai import _core

_HIDDEN_SQLITE_MODULE = r"""
#include <Python.h>

/* What a statically linked SQLite built with hidden visibility looks like from outside. */
__attribute__((visibility("hidden"))) int sqlite3_libversion_number(void) { return 3999000; }

static PyObject *hidden_version(PyObject *self, PyObject *args) {
    return PyLong_FromLong(sqlite3_libversion_number());
}

static PyMethodDef methods[] = {{"hidden_version", hidden_version, METH_NOARGS, NULL},
                                {NULL, NULL, 0, NULL}};
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "_sqlite3", NULL, -1, methods};

PyMODINIT_FUNC PyInit__sqlite3(void) { return PyModule_Create(&def); }
"""

_RUN_A_FLOW = """
import _sqlite3
import composeai as compose
from composeai import _core

@compose.task
def double(x):
    return 2 * x

@compose.flow
def twice(x):
    return double(x) + double(x + 1)

run = twice.run(5)
emit(library=list(_core.sqlite_library()), output=run.output, status=run.status,
     module=_sqlite3.__file__, hidden=_sqlite3.hidden_version())
"""


def _sqlite_in_process() -> list[str]:
    """The SQLite shared libraries mapped into this process."""
    maps = Path("/proc/self/maps").read_text().splitlines()
    return sorted({ln.split()[-1] for ln in maps if "libsqlite3" in ln.split()[-1]})


@pytest.fixture
def hidden_sqlite_python(tmp_path: Path) -> Sandbox:
    """A sandbox whose children import the stand-in `_sqlite3` described above."""
    cc = shutil.which("cc") or shutil.which("gcc")
    include = sysconfig.get_paths()["include"]
    if cc is None or not Path(include, "Python.h").exists():
        pytest.skip("needs a C compiler and Python's headers to build the stand-in module")
    src = tmp_path / "hidden_sqlite3.c"
    src.write_text(_HIDDEN_SQLITE_MODULE)
    subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-O1",
            f"-I{include}",
            str(src),
            "-o",
            str(tmp_path / "_sqlite3.so"),
        ],
        check=True,
    )
    return Sandbox(tmp_path, store="")


def test_obs1_engine_calls_the_sqlite_python_sqlite3_module_calls():
    """OBS-1: in a process that imported `composeai._core`, the engine's SQLite is the
    library Python's `sqlite3` module loaded (same file, same version), and no second
    SQLite is mapped."""
    origin, file, version = _core.sqlite_library()
    assert origin == "sqlite3 module"
    assert version == sqlite3.sqlite_version
    mapped = _sqlite_in_process()
    assert len(mapped) == 1
    assert Path(file).resolve() == Path(mapped[0]).resolve()


def test_obs1_hidden_sqlite_falls_back_to_the_shared_library(hidden_sqlite_python):
    """OBS-1: when Python's `_sqlite3` does not export SQLite's functions, the engine loads
    `libsqlite3.so.0` by name (its hidden copy is not picked up) and runs flows as usual."""
    out = hidden_sqlite_python.run(_RUN_A_FLOW).ok()
    assert out["module"].startswith(str(hidden_sqlite_python.root))
    assert out["hidden"] == 3999000
    origin, file, version = out["library"]
    assert origin == "library"
    assert "libsqlite3.so" in file
    assert version == sqlite3.sqlite_version
    assert (out["status"], out["output"]) == ("completed", 22)


def test_obs1_hidden_sqlite_uses_the_library_named_by_the_environment(hidden_sqlite_python):
    """OBS-1: `COMPOSEAI_SQLITE_LIBRARY` names the library loaded in that case."""
    path = _sqlite_in_process()[0]
    out = hidden_sqlite_python.run(_RUN_A_FLOW, COMPOSEAI_SQLITE_LIBRARY=path).ok()
    origin, file, _ = out["library"]
    assert (origin, Path(file).resolve()) == ("library", Path(path).resolve())


def test_obs1_no_sqlite_is_an_import_error_naming_the_fix(hidden_sqlite_python, tmp_path):
    """OBS-1: with neither an exported SQLite nor the named library, importing the engine
    raises an `ImportError` that says what is missing and how to install it; no crash."""
    missing = str(tmp_path / "nowhere" / "libsqlite3.so.0")
    result = hidden_sqlite_python.run(_RUN_A_FLOW, COMPOSEAI_SQLITE_LIBRARY=missing)
    assert result.returncode == 0, result.describe()
    out = result.error()
    assert out["error_type"] == "ImportError"
    message = out["message"]
    assert "does not export SQLite's functions" in message
    assert missing in message
    assert "apt-get install libsqlite3-0" in message
    assert "COMPOSEAI_SQLITE_LIBRARY" in message


def test_obs1_a_library_without_sqlite_is_refused(hidden_sqlite_python):
    """OBS-1: a `COMPOSEAI_SQLITE_LIBRARY` that is not SQLite is an `ImportError` too."""
    out = hidden_sqlite_python.run(_RUN_A_FLOW, COMPOSEAI_SQLITE_LIBRARY="libm.so.6").error()
    assert out["error_type"] == "ImportError"
    assert "libm.so.6" in out["message"] and "not a SQLite library" in out["message"]


def test_obs1_the_engine_is_not_linked_against_sqlite():
    """OBS-1: the extension module has no link-time SQLite dependency (the import-time one
    is the only one), so a portable wheel carries none."""
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("needs readelf")
    dynamic = subprocess.run(
        [readelf, "-d", _core.__file__], check=True, capture_output=True, text=True
    ).stdout
    needed = [ln for ln in dynamic.splitlines() if "(NEEDED)" in ln]
    assert needed and not any("sqlite" in ln for ln in needed)
    assert sys.platform.startswith("linux")
