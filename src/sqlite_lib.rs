//! The SQLite library the engine calls, found when the engine is loaded
//! rather than when it is linked.
//!
//! The engine and Python's `sqlite3` module must share one SQLite in a
//! process: SQLite keeps each database file's POSIX locks in per-library
//! tables, so a second copy's `close()` would drop the first copy's locks on
//! the same file. A build linked against `libsqlite3.so.0` gets that from the
//! dynamic linker, but a portable wheel may not depend on it (it is not among
//! the libraries every Linux has) and must not ship a copy of its own. So the
//! crate is built without a link-time SQLite (`libsqlite3-sys`'s
//! `loadable_extension`: every SQLite call goes through a table of function
//! pointers, one indirect call as through the PLT), and `load` fills that
//! table once, before any SQLite call, from the first of:
//!
//! 1. the SQLite that Python's `_sqlite3` module calls: the process's global
//!    symbols, then the module's own dependencies, the order the dynamic
//!    linker bound the module's calls in (a conda Python's `_sqlite3` links
//!    conda's `libsqlite3`, found this way too);
//! 2. when that SQLite's symbols are not visible (linked statically into the
//!    interpreter or the module with its symbols hidden), or Python has no
//!    `sqlite3`: the shared library `COMPOSEAI_SQLITE_LIBRARY` names,
//!    `libsqlite3.so.0` by default. That is a second SQLite in the process:
//!    the engine works as usual, but a `sqlite3` connection of the same
//!    process to a store's database does not see the engine's locks;
//! 3. neither: an error that names the library and how to install it.
//!
//! Outside Python (`cargo test`, the benchmarks' binaries) step 1 is the
//! process's global symbols alone.

use rusqlite::ffi;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

/// The environment variable naming the SQLite library of step 2.
pub const LIBRARY_ENV: &str = "COMPOSEAI_SQLITE_LIBRARY";
const DEFAULT_LIBRARY: &str = "libsqlite3.so.0";

/// Where Python's `sqlite3` module gets SQLite, as the bindings found it.
pub enum PythonModule {
    /// `_sqlite3` is this shared object, loaded (when Python has not yet
    /// imported it) with these `dlopen` flags, Python's own for modules.
    File(String, c_int),
    /// `_sqlite3` is built into the interpreter.
    BuiltIn,
    /// `import _sqlite3` failed.
    Missing,
}

/// The SQLite the engine calls.
#[derive(Debug)]
pub struct Loaded {
    /// `"sqlite3 module"` (the one Python's `sqlite3` calls), `"process"`
    /// (already in a process without Python), or `"library"` (step 2).
    pub origin: &'static str,
    /// The file its code is in.
    pub file: String,
    /// `sqlite3_libversion()`.
    pub version: String,
}

static LOADED: OnceLock<Result<Loaded, String>> = OnceLock::new();

/// `sqlite3_database_file_object` (SQLite 3.31+; not in the 3.14 table).
static DATABASE_FILE_OBJECT: OnceLock<Option<DatabaseFileObject>> = OnceLock::new();
type DatabaseFileObject = unsafe extern "C" fn(*const c_char) -> *mut ffi::sqlite3_file;

/// Fills the API table from Python's SQLite (or step 2's library); later
/// calls return the first call's result.
pub fn load(module: PythonModule) -> Result<&'static Loaded, String> {
    LOADED
        .get_or_init(|| resolve(Some(module)))
        .as_ref()
        .map_err(Clone::clone)
}

/// The loaded SQLite, loading it for a process without Python if nothing did.
pub fn ensure() -> Result<&'static Loaded, String> {
    LOADED
        .get_or_init(|| resolve(None))
        .as_ref()
        .map_err(Clone::clone)
}

/// `sqlite3_database_file_object(name)`, `None` on a SQLite before 3.31.
///
/// # Safety
/// As SQLite's: `name` is a file name SQLite passed to a VFS's `xOpen`.
pub unsafe fn database_file_object(name: *const c_char) -> Option<*mut ffi::sqlite3_file> {
    DATABASE_FILE_OBJECT
        .get()
        .copied()
        .flatten()
        .map(|f| f(name))
}

fn resolve(python: Option<PythonModule>) -> Result<Loaded, String> {
    // SAFETY: dlopen/dlsym with NUL-terminated names; the handles are never
    // closed, so the resolved functions stay valid for the process's life.
    unsafe {
        let global = libc::dlopen(std::ptr::null(), libc::RTLD_LAZY);
        if has_sqlite(global) {
            let origin = if python.is_some() {
                "sqlite3 module"
            } else {
                "process"
            };
            return install(global, origin);
        }
        let why = match &python {
            Some(PythonModule::File(file, flags)) => {
                let path = CString::new(file.as_str()).map_err(|e| e.to_string())?;
                // Loading the module's file (as its import will) without
                // importing it: its import loads several Python modules.
                let mut module = libc::dlopen(path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
                if module.is_null() {
                    module = libc::dlopen(path.as_ptr(), *flags);
                }
                if module.is_null() {
                    format!(
                        "Python's sqlite3 module ({file}) cannot be loaded ({})",
                        dl_error()
                    )
                } else if has_sqlite(module) {
                    return install(module, "sqlite3 module");
                } else {
                    format!("Python's sqlite3 module ({file}) does not export SQLite's functions")
                }
            }
            Some(PythonModule::BuiltIn) => {
                "Python's sqlite3 module, built into the interpreter, does not export \
                 SQLite's functions"
                    .to_string()
            }
            Some(PythonModule::Missing) => "this Python has no sqlite3 module".to_string(),
            None => "no SQLite is loaded in this process".to_string(),
        };
        let name = std::env::var(LIBRARY_ENV)
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| DEFAULT_LIBRARY.to_string());
        let c_name = CString::new(name.as_str()).map_err(|e| e.to_string())?;
        let lib = libc::dlopen(c_name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if lib.is_null() {
            return Err(format!(
                "composeai needs the SQLite shared library: {why}, and {name} could not be \
                 loaded ({}). Install SQLite's library (Debian/Ubuntu: apt-get install \
                 libsqlite3-0; Fedora/RHEL: dnf install sqlite-libs; Alpine: apk add \
                 sqlite-libs) or set {LIBRARY_ENV} to the path of a libsqlite3.so",
                dl_error()
            ));
        }
        if !has_sqlite(lib) {
            return Err(format!(
                "{name} (from {LIBRARY_ENV} or the default) is not a SQLite library: it has no \
                 sqlite3_libversion_number"
            ));
        }
        install(lib, "library")
    }
}

unsafe fn has_sqlite(handle: *mut c_void) -> bool {
    !handle.is_null() && !sym(handle, c"sqlite3_libversion_number").is_null()
}

unsafe fn sym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    libc::dlsym(handle, name.as_ptr())
}

fn dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated message.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown error".to_string()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

/// Fills the API table from `handle`'s symbols.
unsafe fn install(handle: *mut c_void, origin: &'static str) -> Result<Loaded, String> {
    let mut api = routines(handle);
    ffi::rusqlite_extension_init2(&mut api).map_err(|e| format!("unusable SQLite: {e}"))?;
    let dfo = sym(handle, c"sqlite3_database_file_object");
    let _ = DATABASE_FILE_OBJECT
        .set((!dfo.is_null()).then(|| std::mem::transmute::<*mut c_void, DatabaseFileObject>(dfo)));
    let version_fn = sym(handle, c"sqlite3_libversion");
    let mut info: libc::Dl_info = std::mem::zeroed();
    let file = if libc::dladdr(version_fn, &mut info) != 0 && !info.dli_fname.is_null() {
        CStr::from_ptr(info.dli_fname)
            .to_string_lossy()
            .into_owned()
    } else {
        String::new()
    };
    let version = CStr::from_ptr(ffi::sqlite3_libversion())
        .to_string_lossy()
        .into_owned();
    Ok(Loaded {
        origin,
        file,
        version,
    })
}

/// The table of the 3.14 API the bindings were generated for, each entry the
/// symbol of its name (null where this SQLite lacks it; calling one of those
/// panics). A struct literal, so a field left out does not compile.
// Each entry's function type is its field's, as bindgen wrote it.
#[allow(clippy::missing_transmute_annotations)]
unsafe fn routines(handle: *mut c_void) -> ffi::sqlite3_api_routines {
    macro_rules! table {
        ($($field:ident),* ; $($odd:ident = $symbol:literal),*) => {
            ffi::sqlite3_api_routines {
                $($field: std::mem::transmute::<*mut c_void, _>(sym(
                    handle,
                    CStr::from_bytes_with_nul_unchecked(
                        concat!("sqlite3_", stringify!($field), "\0").as_bytes(),
                    ),
                )),)*
                $($odd: std::mem::transmute::<*mut c_void, _>(sym(handle, $symbol)),)*
            }
        };
    }
    table!(
        aggregate_context, aggregate_count, bind_blob, bind_double, bind_int, bind_int64,
        bind_null, bind_parameter_count, bind_parameter_index, bind_parameter_name, bind_text,
        bind_text16, bind_value, busy_handler, busy_timeout, changes, close, collation_needed,
        collation_needed16, column_blob, column_bytes, column_bytes16, column_count,
        column_database_name, column_database_name16, column_decltype, column_decltype16,
        column_double, column_int, column_int64, column_name, column_name16, column_origin_name,
        column_origin_name16, column_table_name, column_table_name16, column_text, column_text16,
        column_type, column_value, commit_hook, complete, complete16, create_collation,
        create_collation16, create_function, create_function16, create_module, data_count,
        db_handle, declare_vtab, enable_shared_cache, errcode, errmsg, errmsg16, exec, expired,
        finalize, free, free_table, get_autocommit, get_auxdata, get_table, global_recover,
        last_insert_rowid, libversion, libversion_number, malloc, mprintf, open, open16, prepare,
        prepare16, profile, progress_handler, realloc, reset, result_blob, result_double,
        result_error, result_error16, result_int, result_int64, result_null, result_text,
        result_text16, result_text16be, result_text16le, result_value, rollback_hook,
        set_authorizer, set_auxdata, snprintf, step, table_column_metadata, thread_cleanup,
        total_changes, trace, transfer_bindings, update_hook, user_data, value_blob, value_bytes,
        value_bytes16, value_double, value_int, value_int64, value_numeric_type, value_text,
        value_text16, value_text16be, value_text16le, value_type, vmprintf, overload_function,
        prepare_v2, prepare16_v2, clear_bindings, create_module_v2, bind_zeroblob, blob_bytes,
        blob_close, blob_open, blob_read, blob_write, create_collation_v2, file_control,
        memory_highwater, memory_used, mutex_alloc, mutex_enter, mutex_free, mutex_leave,
        mutex_try, open_v2, release_memory, result_error_nomem, result_error_toobig, sleep,
        soft_heap_limit, vfs_find, vfs_register, vfs_unregister, result_zeroblob,
        result_error_code, test_control, randomness, context_db_handle, extended_result_codes,
        limit, next_stmt, sql, status, backup_finish, backup_init, backup_pagecount,
        backup_remaining, backup_step, compileoption_get, compileoption_used, create_function_v2,
        db_config, db_mutex, db_status, extended_errcode, log, soft_heap_limit64, sourceid,
        stmt_status, strnicmp, unlock_notify, wal_autocheckpoint, wal_checkpoint, wal_hook,
        blob_reopen, vtab_config, vtab_on_conflict, close_v2, db_filename, db_readonly,
        db_release_memory, errstr, stmt_busy, stmt_readonly, stricmp, uri_boolean, uri_int64,
        uri_parameter, vsnprintf, wal_checkpoint_v2, auto_extension, bind_blob64, bind_text64,
        cancel_auto_extension, load_extension, malloc64, msize, realloc64, reset_auto_extension,
        result_blob64, result_text64, strglob, value_dup, value_free, result_zeroblob64,
        bind_zeroblob64, value_subtype, result_subtype, status64, strlike, db_cacheflush,
        system_errno, trace_v2, expanded_sql;
        interruptx = c"sqlite3_interrupt",
        xthreadsafe = c"sqlite3_threadsafe"
    )
}

/// Unit tests call SQLite from many modules: load it before any test runs.
#[cfg(test)]
#[used]
#[link_section = ".init_array"]
static LOAD_FOR_TESTS: extern "C" fn() = {
    extern "C" fn load_for_tests() {
        if let Err(e) = ensure() {
            eprintln!("{e}");
            std::process::abort();
        }
    }
    load_for_tests
};

#[cfg(test)]
mod tests {
    use super::*;

    /// Every entry of the table names an exported SQLite function: a wrong
    /// symbol name would leave its entry null and its first call panicking.
    #[test]
    fn every_table_entry_resolves_on_the_system_sqlite() {
        let lib = unsafe { libc::dlopen(c"libsqlite3.so.0".as_ptr(), libc::RTLD_NOW) };
        assert!(!lib.is_null(), "{}", dl_error());
        let api = unsafe { routines(lib) };
        let n = std::mem::size_of::<ffi::sqlite3_api_routines>() / std::mem::size_of::<usize>();
        // SAFETY: the struct is `n` pointer-sized `Option<fn>` fields.
        let entries = unsafe {
            std::slice::from_raw_parts(std::ptr::from_ref(&api).cast::<*const c_void>(), n)
        };
        assert_eq!(n, 216);
        assert!(entries.iter().all(|p| !p.is_null()));
    }

    #[test]
    fn the_loaded_sqlite_is_the_one_the_engine_calls() {
        let loaded = ensure().unwrap();
        let version = unsafe { CStr::from_ptr(ffi::sqlite3_libversion()) };
        assert_eq!(version.to_str().unwrap(), loaded.version);
        assert!(loaded.file.contains("libsqlite3"), "{}", loaded.file);
        assert_eq!(loaded.origin, "library");
        let c = rusqlite::Connection::open_in_memory().unwrap();
        let v: String = c
            .query_row("select sqlite_version()", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v, loaded.version);
    }
}
