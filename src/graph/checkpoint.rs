//! Checkpoint encoding and the thread tables (EXT-30, EXT-30a, EXT-31,
//! EXT-32). A checkpoint stores its step's delta; a full snapshot is taken
//! once the deltas since the last one add up to its size, so storage grows
//! with the updates while rebuilding a state reads at most about twice its
//! size.

use super::reduce::{apply, Op, State};
use super::store::GraphTx;
use super::{graph_error, plain_error};
use crate::error::{CoreError, CoreResult};
use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Deltas below this many bytes since the last snapshot never trigger one.
pub const MIN_SNAPSHOT_DELTA: usize = 4096;
/// The longest delta chain, whatever the sizes.
pub const MAX_CHAIN: usize = 1024;

pub fn now_ms() -> i64 {
    (crate::time::now() * 1000.0) as i64
}

fn db(e: rusqlite::Error) -> CoreError {
    CoreError::Store(format!("composeai store (graph tables): {e}"))
}

/// A node waiting for a person (EXT-29).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Pending {
    pub node: String,
    /// The step its execution began in: its journal scope `<node>@<step>`.
    pub step: i64,
    pub payload: Value,
    pub attempt: i64,
}

/// Where a run stands after a checkpoint: what runs next.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Progress {
    pub step: i64,
    pub next: Vec<String>,
    /// Per join (declaration order): the sources finished so far.
    #[serde(default)]
    pub joins: Vec<Vec<String>>,
    #[serde(default)]
    pub pending: Vec<Pending>,
}

impl Progress {
    /// The text a checkpoint row stores: no joins with nothing finished and
    /// no empty pending list (most steps), so rows stay small.
    pub fn stored_text(&self) -> String {
        #[derive(Serialize)]
        struct Stored<'a> {
            step: i64,
            next: &'a [String],
            #[serde(skip_serializing_if = "no_join_progress")]
            joins: &'a [Vec<String>],
            #[serde(skip_serializing_if = "<[Pending]>::is_empty")]
            pending: &'a [Pending],
        }
        serde_json::to_string(&Stored {
            step: self.step,
            next: &self.next,
            joins: &self.joins,
            pending: &self.pending,
        })
        .unwrap_or_default()
    }
}

fn no_join_progress(joins: &&[Vec<String>]) -> bool {
    joins.iter().all(Vec::is_empty)
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

// ---------------------------------------------------------------------------
// Checkpoint ids

/// Bits of a `graph_steps` rowid that hold the version; the chain has
/// the 35 above them.
const VERSION_BITS: u32 = 28;
const MAX_STEP_VERSION: i64 = (1 << VERSION_BITS) - 1;
const CHAIN_LIMIT: i64 = 1 << (63 - VERSION_BITS);

/// The rowid of version `version` of a chain in `graph_steps`.
fn step_rowid(chain: i64, version: i64) -> i64 {
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

pub fn insert(tx: &Connection, r: &Row) -> CoreResult<()> {
    if let Some((chain, version)) = parse_chain_id(&r.checkpoint_id) {
        return insert_step(tx, chain, version, r);
    }
    tx.prepare_cached(
        "INSERT INTO graph_checkpoints(checkpoint_id, thread_id, rid, parent_id, version, source, \
         status, run_id, step, created_at_ms, delta_json, snapshot_json, meta_json) \
         VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    )
    .and_then(|mut st| {
        st.execute(params![
            r.checkpoint_id,
            r.thread_id,
            r.rid,
            r.parent_id,
            r.version,
            r.source,
            r.status,
            r.run_id,
            r.step,
            r.created_at_ms,
            r.delta_json,
            r.snapshot_json,
            r.meta_json
        ])
    })
    .map_err(db)?;
    Ok(())
}

/// A row of `graph_steps`: the previous version as parent is implied
/// (stored NULL), no parent at all is an empty text past version 1.
fn insert_step(tx: &Connection, chain: i64, version: i64, r: &Row) -> CoreResult<()> {
    let parent = match &r.parent_id {
        Some(p) if version > 1 && *p == chain_id(chain, version - 1) => None,
        Some(p) => Some(p.as_str()),
        None if version == 1 => None,
        None => Some(""),
    };
    tx.prepare_cached(
        "INSERT INTO graph_steps(ckpt, parent_id, source, status, run_id, step, created_at_ms, \
         delta_json, snapshot_json, meta_json) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )
    .and_then(|mut st| {
        st.execute(params![
            step_rowid(chain, version),
            parent,
            r.source,
            r.status,
            r.run_id.as_deref().map(crate::ids::encode_id),
            r.step,
            r.created_at_ms,
            r.delta_json,
            r.snapshot_json,
            r.meta_json
        ])
    })
    .map_err(db)?;
    Ok(())
}

const STEP_COLUMNS: &str = "s.ckpt, s.parent_id, s.source, s.status, s.run_id, s.step, \
     s.created_at_ms, s.delta_json, s.snapshot_json, s.meta_json";

fn read_step(thread_id: Option<String>, r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    let rowid: i64 = r.get(0)?;
    let (chain, version) = (rowid >> VERSION_BITS, rowid & MAX_STEP_VERSION);
    let parent_id = match r.get::<_, Option<String>>(1)? {
        None if version > 1 => Some(chain_id(chain, version - 1)),
        Some(p) if !p.is_empty() => Some(p),
        _ => None,
    };
    Ok(Row {
        checkpoint_id: chain_id(chain, version),
        thread_id,
        rid: None,
        parent_id,
        version,
        source: r.get(2)?,
        status: r.get(3)?,
        run_id: crate::ids::read_id(r.get_ref(4)?),
        step: r.get(5)?,
        created_at_ms: r.get(6)?,
        delta_json: r.get(7)?,
        snapshot_json: r.get(8)?,
        meta_json: r.get(9)?,
    })
}

fn get_step(conn: &Connection, chain: i64, version: i64) -> CoreResult<Option<Row>> {
    conn.prepare_cached(&format!(
        "SELECT {STEP_COLUMNS}, (SELECT t.thread_id FROM graph_threads t WHERE t.chain = ?2) \
         FROM graph_steps s WHERE s.ckpt = ?1"
    ))
    .and_then(|mut st| {
        st.query_row(params![step_rowid(chain, version), chain], |r| {
            read_step(r.get(10)?, r)
        })
        .optional()
    })
    .map_err(db)
}

const ROW_COLUMNS: &str = "checkpoint_id, thread_id, rid, parent_id, version, source, status, \
     run_id, step, created_at_ms, delta_json, snapshot_json, meta_json";

fn read_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok(Row {
        checkpoint_id: r.get(0)?,
        thread_id: r.get(1)?,
        rid: r.get(2)?,
        parent_id: r.get(3)?,
        version: r.get(4)?,
        source: r.get(5)?,
        status: r.get(6)?,
        run_id: r.get(7)?,
        step: r.get(8)?,
        created_at_ms: r.get(9)?,
        delta_json: r.get(10)?,
        snapshot_json: r.get(11)?,
        meta_json: r.get(12)?,
    })
}

pub fn get(conn: &Connection, checkpoint_id: &str) -> CoreResult<Option<Row>> {
    if let Some((chain, version)) = parse_chain_id(checkpoint_id) {
        return get_step(conn, chain, version);
    }
    conn.prepare_cached(&format!(
        "SELECT {ROW_COLUMNS} FROM graph_checkpoints WHERE checkpoint_id = ?1"
    ))
    .and_then(|mut st| st.query_row([checkpoint_id], read_row).optional())
    .map_err(db)
}

/// The newest checkpoint of a thread-less run.
pub fn run_head(conn: &Connection, rid: i64) -> CoreResult<Option<Row>> {
    conn.prepare_cached(&format!(
        "SELECT {ROW_COLUMNS} FROM graph_checkpoints WHERE rid = ?1 AND thread_id IS NULL \
         ORDER BY version DESC LIMIT 1"
    ))
    .and_then(|mut st| st.query_row([rid], read_row).optional())
    .map_err(db)
}

/// A state rebuilt at a checkpoint, with what the snapshot policy needs
/// to continue the chain.
#[derive(Debug, Clone)]
pub struct Rebuilt {
    pub row: Row,
    pub state: State,
    pub progress: Progress,
    pub snapshot_bytes: usize,
    pub delta_bytes: usize,
    pub chain: usize,
}

fn corrupt(id: &str, what: &str) -> CoreError {
    plain_error(
        "checkpoint_corrupt",
        format!("checkpoint '{id}' cannot be read: {what}"),
    )
}

pub fn parse_progress(row: &Row) -> CoreResult<Progress> {
    serde_json::from_str(&row.meta_json).map_err(|e| corrupt(&row.checkpoint_id, &e.to_string()))
}

/// Rebuilds the state at `checkpoint_id` from the nearest snapshot before
/// it, applying the deltas in between.
pub fn rebuild(conn: &dyn GraphTx, checkpoint_id: &str) -> CoreResult<Option<Rebuilt>> {
    let Some(head) = conn.get(checkpoint_id)? else {
        return Ok(None);
    };
    let mut chain: Vec<Row> = Vec::new();
    let mut cur = head.clone();
    loop {
        if cur.snapshot_json.is_some() {
            break;
        }
        let parent = cur
            .parent_id
            .clone()
            .ok_or_else(|| corrupt(&cur.checkpoint_id, "no snapshot before it"))?;
        let next = conn
            .get(&parent)?
            .ok_or_else(|| corrupt(&cur.checkpoint_id, "its parent is missing"))?;
        chain.push(std::mem::replace(&mut cur, next));
    }
    let snapshot = cur.snapshot_json.as_deref().unwrap_or("{}");
    let mut state: State =
        serde_json::from_str(snapshot).map_err(|e| corrupt(&cur.checkpoint_id, &e.to_string()))?;
    let mut delta_bytes = 0;
    for row in chain.iter().rev() {
        let delta = row.delta_json.as_deref().unwrap_or("[]");
        delta_bytes += delta.len();
        let ops: Vec<Value> =
            serde_json::from_str(delta).map_err(|e| corrupt(&row.checkpoint_id, &e.to_string()))?;
        for op in ops {
            let op = Op::from_json(&op).ok_or_else(|| corrupt(&row.checkpoint_id, "bad delta"))?;
            apply(&mut state, op)?;
        }
    }
    let progress = parse_progress(&head)?;
    Ok(Some(Rebuilt {
        row: head,
        state,
        progress,
        snapshot_bytes: snapshot.len(),
        delta_bytes,
        chain: chain.len(),
    }))
}

/// Whether the next checkpoint should be a snapshot.
pub fn wants_snapshot(snapshot_bytes: usize, delta_bytes: usize, chain: usize) -> bool {
    delta_bytes >= snapshot_bytes.max(MIN_SNAPSHOT_DELTA) || chain >= MAX_CHAIN
}

// ---------------------------------------------------------------------------
// Threads

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

/// A thread's head is its newest checkpoint: steps of a running thread add
/// checkpoints without rewriting the thread row. The newest of its chain
/// and the newest of the rows from before schema version 9 are read; the
/// higher version is the head.
const THREAD_COLUMNS: &str = "t.thread_id, t.graph, t.fingerprint, t.status, t.run_id, t.owner, \
     t.created_at_ms, t.updated_at_ms, t.chain, \
     (SELECT s.ckpt FROM graph_steps s WHERE s.ckpt BETWEEN t.chain << 28 AND \
      (t.chain << 28) + 268435455 ORDER BY s.ckpt DESC LIMIT 1), \
     (SELECT c.checkpoint_id FROM graph_checkpoints c WHERE c.thread_id = t.thread_id \
      ORDER BY c.version DESC LIMIT 1), \
     (SELECT c.version FROM graph_checkpoints c WHERE c.thread_id = t.thread_id \
      ORDER BY c.version DESC LIMIT 1)";

fn read_thread(r: &rusqlite::Row<'_>) -> rusqlite::Result<Thread> {
    let chain: Option<i64> = r.get(8)?;
    let newest = r
        .get::<_, Option<i64>>(9)?
        .map(|rowid| rowid & MAX_STEP_VERSION);
    let old_head: Option<String> = r.get(10)?;
    let old_version: Option<i64> = r.get(11)?;
    let (head, version) = match (chain, newest) {
        (Some(c), Some(v)) if old_version.is_none_or(|o| v >= o) => (Some(chain_id(c, v)), v),
        _ => (old_head, old_version.unwrap_or(0)),
    };
    Ok(Thread {
        thread_id: r.get(0)?,
        graph: r.get(1)?,
        fingerprint: r.get(2)?,
        head,
        version,
        status: r.get(3)?,
        run_id: r.get(4)?,
        owner: r.get(5)?,
        created_at_ms: r.get(6)?,
        updated_at_ms: r.get(7)?,
        chain,
    })
}

pub fn thread(conn: &Connection, thread_id: &str) -> CoreResult<Option<Thread>> {
    conn.prepare_cached(&format!(
        "SELECT {THREAD_COLUMNS} FROM graph_threads t WHERE t.thread_id = ?1"
    ))
    .and_then(|mut st| st.query_row([thread_id], read_thread).optional())
    .map_err(db)
}

pub fn threads(conn: &Connection, graph: Option<&str>) -> CoreResult<Vec<Thread>> {
    let mut st = conn
        .prepare(&format!(
            "SELECT {THREAD_COLUMNS} FROM graph_threads t WHERE ?1 IS NULL OR t.graph = ?1 \
             ORDER BY t.updated_at_ms DESC, t.thread_id"
        ))
        .map_err(db)?;
    let rows = st.query_map([graph], read_thread).map_err(db)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(db)
}

/// Refuses a thread made by another graph or another structure.
pub fn check_graph(t: &Thread, graph: &str, fingerprint: &str) -> CoreResult<()> {
    if t.graph != graph || t.fingerprint != fingerprint {
        let why = if t.graph != graph {
            format!("it belongs to graph '{}'", t.graph)
        } else {
            "it was made by a graph of a different structure".to_string()
        };
        return Err(graph_error(
            "workflow_mismatch",
            format!(
                "thread '{}' cannot be used by graph '{graph}': {why}",
                t.thread_id
            ),
            json!({"thread_id": t.thread_id, "graph": t.graph, "expected": graph}),
        ));
    }
    Ok(())
}

/// Inserts or updates a thread row. An existing row's chain is left as it
/// is (naming the column would rewrite its index page): `ensure_chain`
/// gives an older thread its chain.
pub fn upsert_thread(tx: &Connection, t: &Thread) -> CoreResult<()> {
    tx.prepare_cached(
        "INSERT INTO graph_threads(thread_id, graph, fingerprint, head, version, status, run_id, \
         owner, created_at_ms, updated_at_ms, chain) \
         VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) \
         ON CONFLICT(thread_id) DO UPDATE SET head = ?4, version = ?5, status = ?6, run_id = ?7, \
         owner = ?8, updated_at_ms = ?10",
    )
    .and_then(|mut st| {
        st.execute(params![
            t.thread_id,
            t.graph,
            t.fingerprint,
            t.head,
            t.version,
            t.status,
            t.run_id,
            t.owner,
            t.created_at_ms,
            t.updated_at_ms,
            t.chain
        ])
    })
    .map_err(db)?;
    Ok(())
}

/// The chain of thread `t` (`None`: a thread not yet stored), giving a
/// stored thread without one its chain now.
pub fn ensure_chain(tx: &Connection, thread_id: &str, t: Option<&Thread>) -> CoreResult<i64> {
    if let Some(c) = t.and_then(|t| t.chain) {
        return Ok(c);
    }
    let chain = loop {
        let c = rand::random::<i64>().rem_euclid(CHAIN_LIMIT);
        let taken = tx
            .prepare_cached("SELECT 1 FROM graph_threads WHERE chain = ?1")
            .and_then(|mut st| st.exists([c]))
            .map_err(db)?;
        if !taken {
            break c;
        }
    };
    if t.is_some() {
        tx.prepare_cached("UPDATE graph_threads SET chain = ?2 WHERE thread_id = ?1")
            .and_then(|mut st| st.execute(params![thread_id, chain]))
            .map_err(db)?;
    }
    Ok(chain)
}

/// Moves a thread's head (a step of the run that holds it).
pub fn set_head(
    tx: &Connection,
    thread_id: &str,
    head: &str,
    version: i64,
    status: &str,
) -> CoreResult<()> {
    let release = status != "running";
    tx.prepare_cached(
        "UPDATE graph_threads SET head = ?2, version = ?3, status = ?4, updated_at_ms = ?5, \
         owner = CASE WHEN ?6 THEN NULL ELSE owner END WHERE thread_id = ?1",
    )
    .and_then(|mut st| st.execute(params![thread_id, head, version, status, now_ms(), release]))
    .map_err(db)?;
    Ok(())
}

pub fn set_status(tx: &Connection, thread_id: &str, status: &str) -> CoreResult<()> {
    tx.prepare_cached(
        "UPDATE graph_threads SET status = ?2, owner = NULL, updated_at_ms = ?3 WHERE thread_id = ?1",
    )
    .and_then(|mut st| st.execute(params![thread_id, status, now_ms()]))
    .map_err(db)?;
    Ok(())
}

pub fn audit(
    tx: &Connection,
    thread_id: &str,
    actor: Option<&str>,
    action: &str,
    checkpoint_id: Option<&str>,
) -> CoreResult<()> {
    tx.prepare_cached(
        "INSERT INTO graph_audit(thread_id, actor, action, checkpoint_id, at_ms) \
         VALUES(?1, ?2, ?3, ?4, ?5)",
    )
    .and_then(|mut st| st.execute(params![thread_id, actor, action, checkpoint_id, now_ms()]))
    .map_err(db)?;
    Ok(())
}

pub fn audit_entries(conn: &Connection, thread_id: &str, limit: i64) -> CoreResult<Vec<Value>> {
    let mut st = conn
        .prepare_cached(
            "SELECT thread_id, actor, action, checkpoint_id, at_ms FROM graph_audit \
             WHERE thread_id = ?1 ORDER BY aid DESC LIMIT ?2",
        )
        .map_err(db)?;
    let rows = st
        .query_map(params![thread_id, limit], |r| {
            Ok(json!({
                "thread_id": r.get::<_, String>(0)?,
                "actor": r.get::<_, Option<String>>(1)?,
                "action": r.get::<_, String>(2)?,
                "checkpoint_id": r.get::<_, Option<String>>(3)?,
                "at_ms": r.get::<_, i64>(4)?,
            }))
        })
        .map_err(db)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(db)
}

fn thread_chain(conn: &Connection, thread_id: &str) -> CoreResult<Option<i64>> {
    conn.prepare_cached("SELECT chain FROM graph_threads WHERE thread_id = ?1")
        .and_then(|mut st| {
            st.query_row([thread_id], |r| r.get::<_, Option<i64>>(0))
                .optional()
        })
        .map(Option::flatten)
        .map_err(db)
}

/// The thread's checkpoints, newest first (by version, across its chain
/// and its rows from before schema version 9).
pub fn history(conn: &Connection, thread_id: &str, limit: i64) -> CoreResult<Vec<Row>> {
    let mut out = Vec::new();
    if let Some(chain) = thread_chain(conn, thread_id)? {
        let mut st = conn
            .prepare_cached(&format!(
                "SELECT {STEP_COLUMNS} FROM graph_steps s WHERE s.ckpt BETWEEN ?1 AND ?2 \
                 ORDER BY s.ckpt DESC LIMIT ?3"
            ))
            .map_err(db)?;
        let (low, high) = (step_rowid(chain, 0), step_rowid(chain, MAX_STEP_VERSION));
        let rows = st
            .query_map(params![low, high, limit], |r| {
                read_step(Some(thread_id.to_string()), r)
            })
            .map_err(db)?;
        out = rows.collect::<rusqlite::Result<Vec<_>>>().map_err(db)?;
    }
    let mut st = conn
        .prepare_cached(&format!(
            "SELECT {ROW_COLUMNS} FROM graph_checkpoints WHERE thread_id = ?1 \
             ORDER BY version DESC LIMIT ?2"
        ))
        .map_err(db)?;
    let rows = st
        .query_map(params![thread_id, limit], read_row)
        .map_err(db)?;
    out.extend(rows.collect::<rusqlite::Result<Vec<_>>>().map_err(db)?);
    out.sort_by_key(|r| std::cmp::Reverse(r.version));
    if let Ok(n) = usize::try_from(limit) {
        out.truncate(n);
    }
    Ok(out)
}

/// Deletes a thread and its checkpoints; true when it existed.
pub fn delete_thread(tx: &Connection, thread_id: &str) -> CoreResult<bool> {
    if let Some(chain) = thread_chain(tx, thread_id)? {
        tx.execute(
            "DELETE FROM graph_steps WHERE ckpt BETWEEN ?1 AND ?2",
            [step_rowid(chain, 0), step_rowid(chain, MAX_STEP_VERSION)],
        )
        .map_err(db)?;
    }
    tx.execute(
        "DELETE FROM graph_checkpoints WHERE thread_id = ?1",
        [thread_id],
    )
    .map_err(db)?;
    let n = tx
        .execute(
            "DELETE FROM graph_threads WHERE thread_id = ?1",
            [thread_id],
        )
        .map_err(db)?;
    Ok(n > 0)
}

/// Deletes every thread not updated since `before_ms` (not one a live
/// run holds); returns their ids.
pub fn prune(tx: &Connection, before_ms: i64) -> CoreResult<Vec<String>> {
    let ids: Vec<String> = {
        let mut st = tx
            .prepare(
                "SELECT thread_id FROM graph_threads WHERE updated_at_ms < ?1 \
                 AND status != 'running' ORDER BY thread_id",
            )
            .map_err(db)?;
        let rows = st.query_map([before_ms], |r| r.get(0)).map_err(db)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(db)?
    };
    for id in &ids {
        delete_thread(tx, id)?;
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_snapshot_policy_keeps_deltas_within_the_snapshot_size() {
        assert!(!wants_snapshot(100, 10, 3));
        assert!(!wants_snapshot(100, 4000, 3));
        assert!(wants_snapshot(100, 4096, 3));
        assert!(!wants_snapshot(50_000, 40_000, 10));
        assert!(wants_snapshot(50_000, 50_000, 10));
        assert!(wants_snapshot(1 << 30, 0, MAX_CHAIN));
    }

    #[test]
    fn stored_progress_leaves_out_only_what_is_empty() {
        let mut p = Progress {
            step: 2,
            next: vec!["b".into()],
            joins: vec![Vec::new(), Vec::new()],
            pending: Vec::new(),
        };
        assert_eq!(p.stored_text(), r#"{"step":2,"next":["b"]}"#);
        let read: Progress = serde_json::from_str(&p.stored_text()).unwrap();
        assert_eq!((read.step, read.next.clone()), (2, p.next.clone()));
        assert!(read.joins.is_empty() && read.pending.is_empty());
        p.joins[1].push("a".into());
        p.pending.push(Pending {
            node: "ask".into(),
            step: 1,
            payload: serde_json::json!({"q": 1}),
            attempt: 1,
        });
        let read: Progress = serde_json::from_str(&p.stored_text()).unwrap();
        assert_eq!(read, p, "progress is kept whole when there is some");
    }

    #[test]
    fn chain_ids_round_trip_and_nothing_else_parses_as_one() {
        let top = CHAIN_LIMIT - 1;
        for (chain, version) in [(0, 1), (0x1f, 12), (top, MAX_STEP_VERSION)] {
            let id = chain_id(chain, version);
            assert_eq!(parse_chain_id(&id), Some((chain, version)), "{id}");
            assert_eq!(step_rowid(chain, version) >> VERSION_BITS, chain);
        }
        assert_eq!(chain_id(0x1f, 12), "00000001f.12");
        for other in [
            "01J9ZQ6W3K8V5X2N4M7P0R1T3Y",
            "00000001f.0",
            "00000001f.012",
            "00000001F.12",
            "0000001f.12",
            "fffffffff.1",
            "00000001f.268435456",
            "00000001f.",
            "bogus",
        ] {
            assert_eq!(parse_chain_id(other), None, "{other}");
        }
        assert_eq!(new_id(Some(0x1f), 12), "00000001f.12");
        assert_eq!(new_id(Some(0x1f), MAX_STEP_VERSION + 1).len(), 26);
        assert_eq!(new_id(None, 1).len(), 26);
        // The thread read spells the rowid layout out in SQL.
        assert!(THREAD_COLUMNS.contains(&format!("t.chain << {VERSION_BITS}")));
        assert!(THREAD_COLUMNS.contains(&format!("+ {MAX_STEP_VERSION} ")));
    }

    #[test]
    fn a_chain_keeps_its_rows_in_version_order_with_implied_parents() {
        let c = conn();
        let chain = ensure_chain(&c, "t", None).unwrap();
        upsert_thread(
            &c,
            &Thread {
                thread_id: "t".into(),
                graph: "g".into(),
                fingerprint: "f".into(),
                status: "idle".into(),
                chain: Some(chain),
                ..Default::default()
            },
        )
        .unwrap();
        let mut first = row(&chain_id(chain, 1), None, None, Some("{}"));
        first.version = 1;
        first.run_id = Some(crate::ids::new_ulid());
        insert(&c, &first).unwrap();
        let mut second = row(
            &chain_id(chain, 2),
            Some(&first.checkpoint_id),
            Some("[]"),
            None,
        );
        second.version = 2;
        insert(&c, &second).unwrap();
        let mut copy = row(
            &chain_id(chain, 3),
            Some("01J9ZQ6W3K8V5X2N4M7P0R1T3Y"),
            None,
            Some("{}"),
        );
        copy.version = 3;
        insert(&c, &copy).unwrap();
        let stored: Vec<Option<String>> = c
            .prepare("SELECT parent_id FROM graph_steps ORDER BY ckpt")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(
            stored,
            [None, None, Some("01J9ZQ6W3K8V5X2N4M7P0R1T3Y".to_string())],
            "parents that are the previous version are implied"
        );
        let read = get(&c, &second.checkpoint_id).unwrap().unwrap();
        assert_eq!(read.parent_id, Some(first.checkpoint_id.clone()));
        assert_eq!(read.thread_id.as_deref(), Some("t"));
        let read = get(&c, &first.checkpoint_id).unwrap().unwrap();
        assert_eq!((read.parent_id, read.run_id), (None, first.run_id.clone()));
        let t = thread(&c, "t").unwrap().unwrap();
        assert_eq!(
            (t.head.clone(), t.version),
            (Some(copy.checkpoint_id.clone()), 3)
        );
        let versions: Vec<i64> = history(&c, "t", 2)
            .unwrap()
            .iter()
            .map(|r| r.version)
            .collect();
        assert_eq!(versions, [3, 2]);
        assert_eq!(ensure_chain(&c, "t", Some(&t)).unwrap(), chain);
        assert!(delete_thread(&c, "t").unwrap());
        assert!(get(&c, &first.checkpoint_id).unwrap().is_none());
    }

    fn conn() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(super::super::schema::GRAPH_SCHEMA).unwrap();
        super::super::schema::apply_steps(&c, ":memory:").unwrap();
        c
    }

    fn row(id: &str, parent: Option<&str>, delta: Option<&str>, snap: Option<&str>) -> Row {
        Row {
            checkpoint_id: id.into(),
            thread_id: Some("t".into()),
            parent_id: parent.map(str::to_string),
            source: "step".into(),
            status: "running".into(),
            delta_json: delta.map(str::to_string),
            snapshot_json: snap.map(str::to_string),
            meta_json: r#"{"step":1,"next":["b"],"joins":[],"pending":[]}"#.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_state_is_rebuilt_from_the_nearest_snapshot_and_the_deltas_after_it() {
        let mut c = conn();
        let tx = c.transaction().unwrap();
        insert(&tx, &row("c1", None, None, Some(r#"{"n":0,"log":["a"]}"#))).unwrap();
        insert(
            &tx,
            &row(
                "c2",
                Some("c1"),
                Some(r#"[["set","n",1],["extend","log",["b"]]]"#),
                None,
            ),
        )
        .unwrap();
        insert(
            &tx,
            &row("c3", Some("c2"), Some(r#"[["extend","log",["c"]]]"#), None),
        )
        .unwrap();
        insert(
            &tx,
            &row("c4", Some("c3"), None, Some(r#"{"n":9,"log":[]}"#)),
        )
        .unwrap();
        insert(
            &tx,
            &row("c5", Some("c4"), Some(r#"[["set","n",10]]"#), None),
        )
        .unwrap();
        tx.commit().unwrap();
        let r = rebuild(&c, "c3").unwrap().unwrap();
        assert_eq!(
            Value::Object(r.state),
            json!({"n": 1, "log": ["a", "b", "c"]})
        );
        assert_eq!(
            (r.chain, r.progress.next.clone()),
            (2, vec!["b".to_string()])
        );
        let r = rebuild(&c, "c5").unwrap().unwrap();
        assert_eq!(Value::Object(r.state), json!({"n": 10, "log": []}));
        assert_eq!(r.chain, 1);
        assert!(rebuild(&c, "nope").unwrap().is_none());
    }

    #[test]
    fn a_broken_chain_is_reported_not_guessed() {
        let mut c = conn();
        let tx = c.transaction().unwrap();
        insert(&tx, &row("c2", Some("gone"), Some("[]"), None)).unwrap();
        tx.commit().unwrap();
        let err = rebuild(&c, "c2").unwrap_err();
        assert!(err.to_string().contains("parent is missing"), "{err}");
    }
}
