//! Checkpoint encoding and the thread tables (EXT-30, EXT-30a, EXT-31,
//! EXT-32). A checkpoint stores its step's delta; a full snapshot is taken
//! once the deltas since the last one add up to its size, so storage grows
//! with the updates while rebuilding a state reads at most about twice its
//! size.

use super::reduce::{apply, Op, State};
use super::{graph_error, plain_error};
use crate::error::{CoreError, CoreResult};
pub use crate::store::graph::{chain_id, new_id, now_ms, parse_chain_id, GraphTx, Row, Thread};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Deltas below this many bytes since the last snapshot never trigger one.
pub const MIN_SNAPSHOT_DELTA: usize = 4096;
/// The longest delta chain, whatever the sizes.
pub const MAX_CHAIN: usize = 1024;

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

// ---------------------------------------------------------------------------
// Checkpoint ids

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::graph::insert;
    use crate::store::sqlite::graph::tests::{conn, row};

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
