//! The graph tables as typed operations inside one store transaction
//! (EXT-30 … EXT-33), so the thread logic is the same on every store: the
//! rows, the checkpoint ids a store that clusters a thread's checkpoints
//! gives them, and the `GraphTx` each backend implements.

use crate::error::CoreResult;
use serde_json::{json, Value};

pub fn now_ms() -> i64 {
    (crate::time::now() * 1000.0) as i64
}

/// One checkpoint row, as written.
#[derive(Debug, Clone, Default)]
pub struct Row {
    pub checkpoint_id: String,
    pub thread_id: Option<String>,
    pub rid: Option<i64>,
    pub parent_id: Option<String>,
    pub version: i64,
    pub source: String,
    pub status: String,
    pub run_id: Option<String>,
    pub step: i64,
    pub created_at_ms: i64,
    pub delta_json: Option<String>,
    pub snapshot_json: Option<String>,
    pub meta_json: String,
}

impl Row {
    /// The history entry (EXT-30 `history()`).
    pub fn entry(&self) -> Value {
        json!({
            "id": self.checkpoint_id,
            "parent_id": self.parent_id,
            "version": self.version,
            "source": self.source,
            "status": self.status,
            "run_id": self.run_id,
            "step": self.step,
            "created_at_ms": self.created_at_ms,
        })
    }
}

/// Bits of a `graph_steps` rowid that hold the version; the chain has
/// the 35 above them.
pub const VERSION_BITS: u32 = 28;

pub const MAX_STEP_VERSION: i64 = (1 << VERSION_BITS) - 1;

pub const CHAIN_LIMIT: i64 = 1 << (63 - VERSION_BITS);

/// The rowid of version `version` of a chain in `graph_steps`.
pub fn step_rowid(chain: i64, version: i64) -> i64 {
    (chain << VERSION_BITS) | version
}

/// The id of version `version` of a thread's chain (schema version 9):
/// the chain in 9 hex digits, a dot, the version. Never a ULID, so the id
/// alone says which table holds the row.
pub fn chain_id(chain: i64, version: i64) -> String {
    format!("{chain:09x}.{version}")
}

/// `(chain, version)` of an id `chain_id` wrote (exactly that spelling).
pub fn parse_chain_id(id: &str) -> Option<(i64, i64)> {
    let (c, v) = id.split_once('.')?;
    let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
    if c.len() != 9 || !c.bytes().all(hex) {
        return None;
    }
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) || (v.len() > 1 && v.starts_with('0'))
    {
        return None;
    }
    let chain = i64::from_str_radix(c, 16).ok()?;
    let version: i64 = v.parse().ok()?;
    let fits = chain < CHAIN_LIMIT && (1..=MAX_STEP_VERSION).contains(&version);
    fits.then_some((chain, version))
}

/// A new checkpoint's id: on its thread's chain when the store keeps one
/// (and the chain has room), else a ULID.
pub fn new_id(chain: Option<i64>, version: i64) -> String {
    match chain {
        Some(c) if (1..=MAX_STEP_VERSION).contains(&version) => chain_id(c, version),
        _ => crate::ids::new_ulid(),
    }
}

#[derive(Debug, Clone, Default)]
pub struct Thread {
    pub thread_id: String,
    pub graph: String,
    pub fingerprint: String,
    pub head: Option<String>,
    pub version: i64,
    pub status: String,
    pub run_id: Option<String>,
    pub owner: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// The key of the thread's rows in `graph_steps` (SQLite), once given.
    pub chain: Option<i64>,
}

impl Thread {
    pub fn to_json(&self) -> Value {
        json!({
            "thread_id": self.thread_id,
            "graph": self.graph,
            "status": self.status,
            "version": self.version,
            "head": self.head,
            "run_id": self.run_id,
            "created_at_ms": self.created_at_ms,
            "updated_at_ms": self.updated_at_ms,
        })
    }
}

/// The graph tables, seen from inside one transaction of the store.
pub trait GraphTx {
    fn insert(&self, r: &Row) -> CoreResult<()>;
    fn get(&self, checkpoint_id: &str) -> CoreResult<Option<Row>>;
    /// The newest checkpoint of a thread-less run.
    fn run_head(&self, rid: i64) -> CoreResult<Option<Row>>;
    fn thread(&self, thread_id: &str) -> CoreResult<Option<Thread>>;
    fn threads(&self, graph: Option<&str>) -> CoreResult<Vec<Thread>>;
    fn upsert_thread(&self, t: &Thread) -> CoreResult<()>;
    /// The key a store that clusters a thread's checkpoints gives them
    /// (`t`: the stored thread, `None` for one not yet stored, whose row
    /// `upsert_thread` then writes with it); `None` on other stores, whose
    /// checkpoints have ULIDs.
    fn ensure_chain(&self, _thread_id: &str, _t: Option<&Thread>) -> CoreResult<Option<i64>> {
        Ok(None)
    }
    /// Moves a thread's head; a status other than `running` releases it.
    fn set_head(&self, thread_id: &str, head: &str, version: i64, status: &str) -> CoreResult<()>;
    fn set_status(&self, thread_id: &str, status: &str) -> CoreResult<()>;
    fn audit(
        &self,
        thread_id: &str,
        actor: Option<&str>,
        action: &str,
        checkpoint_id: Option<&str>,
    ) -> CoreResult<()>;
    fn audit_entries(&self, thread_id: &str, limit: i64) -> CoreResult<Vec<Value>>;
    /// The thread's checkpoints, newest first.
    fn history(&self, thread_id: &str, limit: i64) -> CoreResult<Vec<Row>>;
    /// Deletes a thread and its checkpoints; true when it existed.
    fn delete_thread(&self, thread_id: &str) -> CoreResult<bool>;
    /// Deletes every thread not updated since `before_ms` and not running.
    fn prune(&self, before_ms: i64) -> CoreResult<Vec<String>>;
    /// Drops a run's pending interrupts (its waiting nodes were answered).
    fn delete_pending(&self, rid: i64) -> CoreResult<()>;
}

/// Work on the graph tables inside a store transaction.
pub type GraphWork<'a> = dyn FnMut(&dyn GraphTx) -> CoreResult<()> + 'a;
