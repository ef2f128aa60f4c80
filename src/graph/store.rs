//! The graph tables as typed operations inside one store transaction
//! (EXT-30 … EXT-33), so the thread logic is the same on every store.
//! The SQLite statements are in `checkpoint`; the PostgreSQL ones in
//! `crate::store::postgres_ext`.

use super::checkpoint::{self, Row, Thread};
use crate::error::CoreResult;
use rusqlite::Connection;
use serde_json::Value;

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

impl GraphTx for Connection {
    fn insert(&self, r: &Row) -> CoreResult<()> {
        checkpoint::insert(self, r)
    }
    fn get(&self, checkpoint_id: &str) -> CoreResult<Option<Row>> {
        checkpoint::get(self, checkpoint_id)
    }
    fn run_head(&self, rid: i64) -> CoreResult<Option<Row>> {
        checkpoint::run_head(self, rid)
    }
    fn thread(&self, thread_id: &str) -> CoreResult<Option<Thread>> {
        checkpoint::thread(self, thread_id)
    }
    fn threads(&self, graph: Option<&str>) -> CoreResult<Vec<Thread>> {
        checkpoint::threads(self, graph)
    }
    fn upsert_thread(&self, t: &Thread) -> CoreResult<()> {
        checkpoint::upsert_thread(self, t)
    }
    fn ensure_chain(&self, thread_id: &str, t: Option<&Thread>) -> CoreResult<Option<i64>> {
        checkpoint::ensure_chain(self, thread_id, t).map(Some)
    }
    fn set_head(&self, thread_id: &str, head: &str, version: i64, status: &str) -> CoreResult<()> {
        checkpoint::set_head(self, thread_id, head, version, status)
    }
    fn set_status(&self, thread_id: &str, status: &str) -> CoreResult<()> {
        checkpoint::set_status(self, thread_id, status)
    }
    fn audit(
        &self,
        thread_id: &str,
        actor: Option<&str>,
        action: &str,
        checkpoint_id: Option<&str>,
    ) -> CoreResult<()> {
        checkpoint::audit(self, thread_id, actor, action, checkpoint_id)
    }
    fn audit_entries(&self, thread_id: &str, limit: i64) -> CoreResult<Vec<Value>> {
        checkpoint::audit_entries(self, thread_id, limit)
    }
    fn history(&self, thread_id: &str, limit: i64) -> CoreResult<Vec<Row>> {
        checkpoint::history(self, thread_id, limit)
    }
    fn delete_thread(&self, thread_id: &str) -> CoreResult<bool> {
        checkpoint::delete_thread(self, thread_id)
    }
    fn prune(&self, before_ms: i64) -> CoreResult<Vec<String>> {
        checkpoint::prune(self, before_ms)
    }
    fn delete_pending(&self, rid: i64) -> CoreResult<()> {
        self.execute("DELETE FROM pending_interrupts WHERE rid = ?1", [rid])
            .map(|_| ())
            .map_err(|e| crate::error::CoreError::Store(format!("composeai store: {e}")))
    }
}
