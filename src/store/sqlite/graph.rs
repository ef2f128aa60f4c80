//! The graph tables on SQLite (EXT-30, EXT-30a, EXT-31, EXT-32): threads,
//! their checkpoints (a thread's in `graph_steps`, clustered by chain) and
//! the audit trail, and `GraphTx` on a connection.

use crate::error::{CoreError, CoreResult};
use crate::store::graph::{
    chain_id, now_ms, parse_chain_id, step_rowid, GraphTx, Row, Thread, CHAIN_LIMIT,
    MAX_STEP_VERSION, VERSION_BITS,
};
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::{json, Value};

impl GraphTx for Connection {
    fn insert(&self, r: &Row) -> CoreResult<()> {
        insert(self, r)
    }
    fn get(&self, checkpoint_id: &str) -> CoreResult<Option<Row>> {
        get(self, checkpoint_id)
    }
    fn run_head(&self, rid: i64) -> CoreResult<Option<Row>> {
        run_head(self, rid)
    }
    fn thread(&self, thread_id: &str) -> CoreResult<Option<Thread>> {
        thread(self, thread_id)
    }
    fn threads(&self, graph: Option<&str>) -> CoreResult<Vec<Thread>> {
        threads(self, graph)
    }
    fn upsert_thread(&self, t: &Thread) -> CoreResult<()> {
        upsert_thread(self, t)
    }
    fn ensure_chain(&self, thread_id: &str, t: Option<&Thread>) -> CoreResult<Option<i64>> {
        ensure_chain(self, thread_id, t).map(Some)
    }
    fn set_head(&self, thread_id: &str, head: &str, version: i64, status: &str) -> CoreResult<()> {
        set_head(self, thread_id, head, version, status)
    }
    fn set_status(&self, thread_id: &str, status: &str) -> CoreResult<()> {
        set_status(self, thread_id, status)
    }
    fn audit(
        &self,
        thread_id: &str,
        actor: Option<&str>,
        action: &str,
        checkpoint_id: Option<&str>,
    ) -> CoreResult<()> {
        audit(self, thread_id, actor, action, checkpoint_id)
    }
    fn audit_entries(&self, thread_id: &str, limit: i64) -> CoreResult<Vec<Value>> {
        audit_entries(self, thread_id, limit)
    }
    fn history(&self, thread_id: &str, limit: i64) -> CoreResult<Vec<Row>> {
        history(self, thread_id, limit)
    }
    fn delete_thread(&self, thread_id: &str) -> CoreResult<bool> {
        delete_thread(self, thread_id)
    }
    fn prune(&self, before_ms: i64) -> CoreResult<Vec<String>> {
        prune(self, before_ms)
    }
    fn delete_pending(&self, rid: i64) -> CoreResult<()> {
        self.execute("DELETE FROM pending_interrupts WHERE rid = ?1", [rid])
            .map(|_| ())
            .map_err(|e| crate::error::CoreError::Store(format!("composeai store: {e}")))
    }
}

fn db(e: rusqlite::Error) -> CoreError {
    CoreError::Store(format!("composeai store (graph tables): {e}"))
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
pub(crate) mod tests {
    use super::*;
    use crate::store::graph::new_id;

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

    pub(crate) fn conn() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(crate::store::sqlite::graph_schema::GRAPH_SCHEMA)
            .unwrap();
        crate::store::sqlite::graph_schema::apply_steps(&c, ":memory:").unwrap();
        c
    }

    pub(crate) fn row(
        id: &str,
        parent: Option<&str>,
        delta: Option<&str>,
        snap: Option<&str>,
    ) -> Row {
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
}
