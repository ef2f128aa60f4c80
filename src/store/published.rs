//! What a run publishes for readers outside it (OPS-21, OPS-22), the run
//! listing other processes read (OPS-20), and retention (OPS-23): the
//! operations each backend implements behind `PublishStore`.

use crate::error::CoreResult;
use crate::store::query::{RunFilter, RunSummary};

/// The journal key a fork keeps its origin under (issue 27): a fork that
/// has not journaled its `at` key still borrows its source's journal.
pub const FORK_KEY: &str = "__fork__";

/// What a journaled publishing step writes with its journal row.
#[derive(Debug, Clone, PartialEq)]
pub enum Published<'a> {
    /// The latest value of an event key.
    Event { key: &'a str, value: &'a str },
    /// One value appended to a stream.
    Append { key: &'a str, value: &'a str },
    /// The end of a stream.
    Close { key: &'a str },
}

/// Values of a stream after a position, and whether it is closed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreamChunk {
    /// `(sequence number, value JSON)` in order.
    pub values: Vec<(i64, String)>,
    /// Whether the stream was closed (no value follows the ones stored).
    pub closed: bool,
}

/// A run of a listing with what the run row does not hold.
#[derive(Debug, Clone)]
pub struct ListedRun {
    pub summary: RunSummary,
    /// Ids of the run's pending interrupts.
    pub pending: Vec<String>,
    /// The queue the run was started on.
    pub queue: Option<String>,
    /// The run this one was forked from.
    pub parent_id: Option<String>,
}

/// Which runs a prune deletes.
#[derive(Debug, Clone)]
pub struct PruneFilter {
    /// Runs last updated before this time (Unix seconds).
    pub older_than: f64,
    /// Settled statuses only: `completed`, `failed`, `cancelled`.
    pub statuses: Vec<String>,
    pub name: Option<String>,
    pub kind: Option<String>,
    /// Runs deleted per transaction.
    pub batch: usize,
}

/// Statuses a prune may delete: a queued, running or paused run is never
/// deleted.
pub const SETTLED: [&str; 3] = ["completed", "failed", "cancelled"];

/// Runs deleted per transaction when the caller names no batch size: small
/// enough that the write lock is held for milliseconds.
pub const PRUNE_BATCH: usize = 200;

pub trait PublishStore {
    /// Journals `value` under `key` (first write wins) and, when the key
    /// was not journaled yet, writes `item`, in one transaction fenced on
    /// this process owning run `rid`; returns the stored value when an
    /// earlier write won (nothing is then written).
    fn commit_published(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        ident: Option<&str>,
        item: &Published<'_>,
    ) -> CoreResult<Option<String>>;

    /// Appends `values` to stream `key` of run `rid` in one transaction,
    /// fenced on this process owning the run, with no journal row (an
    /// agent's text deltas).
    fn append_stream(&self, rid: i64, key: &str, values: &[String]) -> CoreResult<()>;

    /// The latest value of event `key` of run `rid`.
    fn event(&self, rid: i64, key: &str) -> CoreResult<Option<String>>;

    /// Every event of run `rid`: `(key, latest value JSON)` by key.
    fn events(&self, rid: i64) -> CoreResult<Vec<(String, String)>>;

    /// Values of stream `key` of run `rid` after sequence number `after`,
    /// at most `limit`.
    fn stream_after(&self, rid: i64, key: &str, after: i64, limit: i64) -> CoreResult<StreamChunk>;

    /// Runs matching `f`, newest first, with their usage, pending
    /// interrupts, queue and fork origin, reading no journal or span rows
    /// beyond the listed runs'.
    fn list_runs(&self, f: &RunFilter, matching: Option<&str>) -> CoreResult<Vec<ListedRun>>;

    /// Deletes the runs `f` selects with every row that belongs to them,
    /// `f.batch` runs per transaction, never a run that is not settled nor
    /// the source of a fork that still borrows from it; returns how many
    /// were deleted (with `dry_run`, how many would be, deleting nothing).
    fn prune_runs(&self, f: &PruneFilter, dry_run: bool) -> CoreResult<u64>;

    /// Returns the store's free pages to the file system (SQLite `VACUUM`;
    /// a server store reclaims space itself). Returns the bytes before and
    /// after, when the store is a file.
    fn compact(&self) -> CoreResult<Option<(u64, u64)>>;
}

/// The run a fork's journaled origin (`FORK_KEY`) names.
pub fn fork_origin(origin_json: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(origin_json).ok()?;
    v.get("run_id")?.as_str().map(str::to_string)
}

/// This process's publications: readers in the process wait on it, since
/// a commit on the process's own connection does not change the store's
/// change marker.
struct Announcements {
    count: parking_lot::Mutex<u64>,
    changed: parking_lot::Condvar,
}

fn announcements() -> &'static Announcements {
    static A: std::sync::OnceLock<Announcements> = std::sync::OnceLock::new();
    A.get_or_init(|| Announcements {
        count: parking_lot::Mutex::new(0),
        changed: parking_lot::Condvar::new(),
    })
}

/// Tells this process's readers that something was published.
pub fn announce() {
    let a = announcements();
    *a.count.lock() += 1;
    a.changed.notify_all();
}

/// The count of this process's publications so far.
pub fn announced() -> u64 {
    *announcements().count.lock()
}

/// Sleeps until this process publishes after `seen` (`announced()`), or
/// `limit` passed; whether it published.
pub fn await_announcement(seen: u64, limit: std::time::Duration) -> bool {
    let a = announcements();
    let mut count = a.count.lock();
    let _ = a.changed.wait_while_for(&mut count, |c| *c == seen, limit);
    *count != seen
}
