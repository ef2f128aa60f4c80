//! Opening a store file: created private to its user, in WAL mode, at
//! the current schema version.

use crate::error::{AtPath, CoreError, CoreResult};
use crate::store::sqlite::migrate;
use crate::store::sqlite::schema::{PAGE_SIZE, SCHEMA_VERSION};
use rusqlite::{Connection, OpenFlags};
use std::path::Path;

/// Opens a connection with the store's pragmas, creating the database file
/// private to its user and bringing the schema to `SCHEMA_VERSION`. An
/// existing store this process cannot write (a read-only file system, no
/// write permission) opens read-only: everything that only reads works, and
/// a write fails with "the store is read-only".
pub fn open_connection(path: &str, full_sync: bool) -> CoreResult<Connection> {
    match open_writable(path, full_sync) {
        Err(e) if Path::new(path).is_file() && !writable(path) => {
            open_read_only(path).map_err(|_| e)
        }
        other => other,
    }
}

/// Whether this process may write the file at `path` and create the WAL's
/// files beside it.
fn writable(path: &str) -> bool {
    let can_write = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
            // SAFETY: a NUL-terminated path for the duration of the call.
            .is_ok_and(|c| unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0)
    };
    let p = Path::new(path);
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    can_write(p) && can_write(dir)
}

/// A read-only connection to an existing store at the current schema:
/// through the WAL's shared memory when it can be opened, else as an
/// immutable file (nobody can change it: the file system or permissions
/// forbid it).
fn open_read_only(path: &str) -> CoreResult<Connection> {
    let check = |conn: Connection| -> CoreResult<Connection> {
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .at(path)?;
        migrate::refuse_foreign(&conn, path, version)?;
        if version != SCHEMA_VERSION {
            return Err(CoreError::Store(format!(
                "composeai store '{path}': the store is read-only and its schema (version \
                 {version}) predates this composeai (version {SCHEMA_VERSION}) -- open it once \
                 where it can be written to upgrade it"
            )));
        }
        conn.set_prepared_statement_cache_capacity(64);
        Ok(conn)
    };
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    match Connection::open_with_flags(path, flags)
        .at(path)
        .and_then(check)
    {
        Ok(conn) => Ok(conn),
        Err(_) => {
            let uri = format!("file:{}?immutable=1", uri_path(path));
            Connection::open_with_flags(uri, flags | OpenFlags::SQLITE_OPEN_URI)
                .at(path)
                .and_then(check)
        }
    }
}

/// `path` escaped for a `file:` URI.
fn uri_path(path: &str) -> String {
    let abs = std::path::absolute(path).unwrap_or_else(|_| Path::new(path).to_path_buf());
    abs.to_string_lossy()
        .chars()
        .map(|c| match c {
            '%' | '?' | '#' => format!("%{:02X}", c as u32),
            c => c.to_string(),
        })
        .collect()
}

fn open_writable(path: &str, full_sync: bool) -> CoreResult<Connection> {
    create_private_file(path)?;
    // Commits write their WAL frames in one system call (see `wal_vfs`).
    let conn = match crate::store::sqlite::wal_vfs::name() {
        Some(vfs) => Connection::open_with_flags_and_vfs(path, OpenFlags::default(), vfs),
        None => Connection::open(path),
    }
    .at(path)?;
    // A graph run's commits alone use more distinct statements than the
    // default 16: re-preparing evicted ones would cost every step.
    conn.set_prepared_statement_cache_capacity(64);
    conn.busy_timeout(std::time::Duration::from_secs(30))
        .at(path)?;
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .at(path)?;
    migrate::refuse_foreign(&conn, path, version)?;
    if version == 0 {
        // Only an empty database takes it, so before WAL and the schema.
        conn.execute_batch(&format!("PRAGMA page_size={PAGE_SIZE}"))
            .at(path)?;
    }
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .at(path)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(config(
            path,
            format!("cannot enable WAL (journal_mode={mode})"),
        ));
    }
    let sync = if full_sync { "FULL" } else { "NORMAL" };
    conn.execute_batch(&format!(
        "PRAGMA synchronous={sync}; PRAGMA foreign_keys=OFF; PRAGMA temp_store=MEMORY;"
    ))
    .at(path)?;
    migrate::bring_up_to_date(&conn, path, version)?;
    Ok(conn)
}

/// `compose migrate` on a SQLite file: `(version found, version now,
/// latest version)`; a dry run only reads the version.
pub fn migrate_file(path: &str, dry_run: bool) -> CoreResult<(i64, i64, i64)> {
    let found = if std::path::Path::new(path).exists() {
        let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .at(path)?;
        conn.query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| config(path, format!("not a readable composeai store ({e})")))?
    } else {
        0
    };
    if dry_run {
        return Ok((found, found, SCHEMA_VERSION));
    }
    open_connection(path, false)?;
    Ok((found, SCHEMA_VERSION, SCHEMA_VERSION))
}

pub(crate) fn create_private_file(path: &str) -> CoreResult<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let p = std::path::Path::new(path);
    if p.exists() {
        return Ok(());
    }
    if let Some(dir) = p.parent() {
        if !dir.as_os_str().is_empty() && !dir.exists() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| {
                    CoreError::Store(format!(
                        "composeai store '{path}': {} '{}' ({e})",
                        create_cause(&e, "its directory"),
                        dir.display()
                    ))
                })?;
        }
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(p)
        .map_err(|e| {
            CoreError::Store(format!(
                "composeai store '{path}': {} ({e})",
                create_cause(&e, "the database")
            ))
        })?;
    Ok(())
}

/// Why creating `what` failed, in words a person acts on.
fn create_cause(e: &std::io::Error, what: &str) -> String {
    match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => format!("permission denied creating {what}"),
        Some(libc::EROFS) => format!("the file system is read-only: cannot create {what}"),
        Some(libc::ENOSPC) => format!("the disk is full: cannot create {what}"),
        _ => format!("cannot create {what}"),
    }
}

pub(crate) fn config(path: &str, what: String) -> CoreError {
    CoreError::Config(format!("composeai store '{path}': {what}"))
}
