//! Opening a store file: created private to its user, in WAL mode, at
//! the current schema version.

use crate::error::{AtPath, CoreError, CoreResult};
use crate::store::sqlite::migrate;
use crate::store::sqlite::schema::{PAGE_SIZE, SCHEMA_VERSION};
use rusqlite::{Connection, OpenFlags};

/// Opens a connection with the store's pragmas, creating the database file
/// private to its user and bringing the schema to `SCHEMA_VERSION`.
pub fn open_connection(path: &str, full_sync: bool) -> CoreResult<Connection> {
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
        .map_err(|e| config(path, format!("not a readable composeai store ({e})")))?;
    migrate::refuse_foreign(&conn, path, version)?;
    if version == 0 {
        // Only an empty database takes it, so before WAL and the schema.
        conn.execute_batch(&format!("PRAGMA page_size={PAGE_SIZE}"))
            .at(path)?;
    }
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .map_err(|e| config(path, format!("cannot enable WAL ({e})")))?;
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
                .map_err(|e| config(path, format!("cannot create its directory ({e})")))?;
        }
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(p)
        .map_err(|e| config(path, format!("cannot create the database ({e})")))?;
    Ok(())
}

pub(crate) fn config(path: &str, what: String) -> CoreError {
    CoreError::Config(format!("composeai store '{path}': {what}"))
}
