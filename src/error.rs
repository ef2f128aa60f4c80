//! Core errors. Each variant maps to one documented Python exception class
//! in `src/py/errors.rs`.

use thiserror::Error;

#[derive(Debug, Clone, Error)]
pub enum CoreError {
    /// Misuse or an unusable store: maps to `composeai.errors.ConfigError`.
    #[error("{0}")]
    Config(String),
    /// A stored value that cannot be decoded: `SerializationError`.
    #[error("{0}")]
    Serialization(String),
    /// The caller's journal access was revoked (abandoned thread or finished
    /// attempt): an internal `BaseException` in Python.
    #[error("journal access revoked: {0}")]
    Revoked(String),
    /// A cancel request reached the attempt (EXT-10): an internal
    /// `BaseException` in Python. Holds the reason (may be empty).
    #[error("run cancelled: {0}")]
    Cancelled(String),
    /// A flow's deadline passed (OPS-12): `composeai.errors.FlowTimeoutError`.
    #[error("{0}")]
    Deadline(String),
    /// The store itself failed (a full disk, a read-only file, a broken
    /// server): `composeai.errors.StoreError`. The message names the store.
    #[error("{0}")]
    Store(String),
    /// The store cannot be reached (a lost, refused or silent server
    /// connection): `composeai.errors.StoreUnavailableError`. Retried by the
    /// PostgreSQL store for up to `COMPOSE_STORE_OUTAGE_SECONDS` first.
    #[error("{0}")]
    Unavailable(String),
    /// A body's calls no longer match its run's journal (issue 27):
    /// `composeai.errors.NondeterminismError`.
    #[error(
        "run '{run_id}' diverged from its journal at '{key}': recorded {recorded}; called \
         {called} -- the body no longer makes the calls this run journaled; nothing new was \
         journaled, and the run resumes once the code that made them is back (or fork it \
         before '{key}' to continue with the new code)"
    )]
    Nondeterminism {
        run_id: String,
        key: String,
        recorded: String,
        called: String,
    },
    /// A replay-only attempt (`composeai.testing.replay`) reached a step its
    /// journal does not hold: the journal ends at this key. An internal
    /// `BaseException` in Python.
    #[error("the journal ends at '{0}'")]
    ReplayEnd(String),
    /// A graph workflow error (EXT-20 …): `composeai.graph`'s classes, by code.
    #[error("{message}")]
    Graph {
        code: String,
        message: String,
        details_json: String,
    },
}

pub type CoreResult<T> = Result<T, CoreError>;

/// Attaches the database path to a SQLite error.
pub trait AtPath<T> {
    fn at(self, path: &str) -> CoreResult<T>;
}

impl<T> AtPath<T> for rusqlite::Result<T> {
    fn at(self, path: &str) -> CoreResult<T> {
        self.map_err(|e| sqlite_error(path, &e))
    }
}

/// A SQLite failure of the store at `path`, its cause in words a person
/// acts on (and SQLite's own message after them).
pub fn sqlite_error(path: &str, e: &rusqlite::Error) -> CoreError {
    use rusqlite::ErrorCode as C;
    let cause = match e.sqlite_error_code() {
        Some(C::DiskFull) => "the disk is full: free space, then resume the run",
        Some(C::ReadOnly) => {
            "the store is read-only (a read-only file system, or no write permission on the file              or its directory): nothing was changed"
        }
        Some(C::NotADatabase) => "the file is not a composeai store",
        Some(C::DatabaseCorrupt) => {
            "the database disk image is malformed: restore it from a backup"
        }
        Some(C::PermissionDenied) => "permission denied on the database file or its directory",
        Some(C::CannotOpen) => "cannot open the database file",
        Some(C::SystemIoFailure) => "an I/O error on the database file",
        _ => return CoreError::Store(format!("composeai store '{path}': {e}")),
    };
    CoreError::Store(format!("composeai store '{path}': {cause} ({e})"))
}
