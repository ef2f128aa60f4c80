//! Thread operations outside a run (EXT-30, EXT-31, EXT-32): claiming a
//! thread for one caller, reading its state and history, rewinding,
//! forking, deleting and pruning.

use super::checkpoint::{self, Row, Thread};
use super::{graph_error, plain_error};
use crate::error::CoreResult;
use crate::store::graph::GraphTx;
use crate::store::Store;
use serde_json::{json, Value};

/// What a caller wants to do with a thread it claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    Run,
    Resume,
    Retry,
}

impl Claim {
    pub fn parse(s: &str) -> Option<Claim> {
        match s {
            "run" => Some(Claim::Run),
            "resume" => Some(Claim::Resume),
            "retry" => Some(Claim::Retry),
            _ => None,
        }
    }
}

fn busy(t: &Thread) -> crate::error::CoreError {
    graph_error(
        "thread_busy",
        format!(
            "thread '{}' is in use by another caller ({}) -- wait for it, or open the storage \
             with on_busy=\"wait\"",
            t.thread_id,
            t.owner.as_deref().unwrap_or("?")
        ),
        json!({"thread_id": t.thread_id, "owner": t.owner}),
    )
}

/// The thread's status as a caller sees it: a `running` thread whose
/// holder is gone was interrupted.
fn effective_status(t: &Thread) -> &str {
    if t.status == "running" {
        match &t.owner {
            Some(o) if crate::owner::lease_is_live(o, f64::MAX) => "running",
            _ => "interrupted",
        }
    } else {
        &t.status
    }
}

fn refuse_busy(t: &Thread) -> CoreResult<()> {
    if effective_status(t) == "running" {
        return Err(busy(t));
    }
    Ok(())
}

/// Claims `thread_id` for one operation by this process, in one
/// transaction: refuses a thread of another graph, a busy thread, and an
/// operation its status does not allow. Returns the thread as it was.
pub fn claim(
    store: &dyn Store,
    thread_id: &str,
    graph: &str,
    fingerprint: &str,
    mode: Claim,
    run_id: Option<&str>,
) -> CoreResult<Option<Thread>> {
    let mut before = None;
    store.transact(&mut |tx| {
        before = claim_in(tx, thread_id, graph, fingerprint, mode, run_id)?.0;
        Ok(())
    })?;
    Ok(before)
}

/// `claim` inside a caller's transaction (the one creating the thread's
/// new run, for `run()`); also returns the thread's chain.
pub fn claim_in(
    tx: &dyn GraphTx,
    thread_id: &str,
    graph: &str,
    fingerprint: &str,
    mode: Claim,
    run_id: Option<&str>,
) -> CoreResult<(Option<Thread>, Option<i64>)> {
    let owner = crate::owner::owner_id();
    {
        let now = checkpoint::now_ms();
        let Some(t) = tx.thread(thread_id)? else {
            return match mode {
                Claim::Run => {
                    let chain = tx.ensure_chain(thread_id, None)?;
                    tx.upsert_thread(&Thread {
                        thread_id: thread_id.to_string(),
                        graph: graph.to_string(),
                        fingerprint: fingerprint.to_string(),
                        head: None,
                        version: 0,
                        status: "running".into(),
                        run_id: run_id.map(str::to_string),
                        owner: Some(owner.to_string()),
                        created_at_ms: now,
                        updated_at_ms: now,
                        chain,
                    })?;
                    Ok((None, chain))
                }
                Claim::Resume => Err(graph_error(
                    "resume_invalid",
                    format!("thread '{thread_id}' has no suspended nodes to resume"),
                    json!({"thread_id": thread_id, "expected": []}),
                )),
                Claim::Retry => Err(nothing_to_retry(thread_id)),
            };
        };
        checkpoint::check_graph(&t, graph, fingerprint)?;
        let status = effective_status(&t).to_string();
        match (mode, status.as_str()) {
            (_, "running") => return Err(busy(&t)),
            (Claim::Run, "suspended") | (Claim::Retry, "suspended") => {
                return Err(graph_error(
                    "thread_suspended",
                    format!(
                        "thread '{thread_id}' has nodes waiting for resume() -- answer them with \
                         thread.resume({{node: value}})"
                    ),
                    json!({"thread_id": thread_id}),
                ))
            }
            (Claim::Run, "interrupted" | "failed") => {
                return Err(graph_error(
                    "thread_interrupted",
                    format!(
                        "thread '{thread_id}': its last run did not finish -- call retry() to \
                         continue it"
                    ),
                    json!({"thread_id": thread_id, "run_id": t.run_id}),
                ))
            }
            (Claim::Resume, s) if s != "suspended" => {
                return Err(graph_error(
                    "resume_invalid",
                    format!("thread '{thread_id}' has no suspended nodes to resume"),
                    json!({"thread_id": thread_id, "expected": []}),
                ))
            }
            (Claim::Retry, "idle") => return Err(nothing_to_retry(thread_id)),
            _ => {}
        }
        let mut claimed = t.clone();
        claimed.status = "running".into();
        claimed.owner = Some(owner.to_string());
        if let Some(r) = run_id {
            claimed.run_id = Some(r.to_string());
        }
        claimed.updated_at_ms = now;
        claimed.chain = tx.ensure_chain(thread_id, Some(&t))?;
        tx.upsert_thread(&claimed)?;
        Ok((Some(t), claimed.chain))
    }
}

fn nothing_to_retry(thread_id: &str) -> crate::error::CoreError {
    graph_error(
        "nothing_to_retry",
        format!("thread '{thread_id}' has no failed or interrupted run to retry"),
        json!({"thread_id": thread_id}),
    )
}

/// Gives a claimed thread back with `status` (a run that failed before or
/// between steps).
pub fn release(store: &dyn Store, thread_id: &str, status: &str) -> CoreResult<()> {
    store.transact(&mut |tx| tx.set_status(thread_id, status))
}

pub fn info(store: &dyn Store, thread_id: &str) -> CoreResult<Option<Thread>> {
    let mut out = None;
    store.read(&mut |c| {
        out = c.thread(thread_id)?;
        Ok(())
    })?;
    Ok(out)
}

/// The state and progress at a thread's head, `None` for a new thread.
pub fn head_state(store: &dyn Store, thread_id: &str) -> CoreResult<Option<(String, String)>> {
    let mut out = None;
    store.read(&mut |c| {
        let Some(t) = c.thread(thread_id)? else {
            return Ok(());
        };
        let Some(head) = t.head else {
            return Ok(());
        };
        if let Some(r) = checkpoint::rebuild(c, &head)? {
            out = Some((
                Value::Object(r.state).to_string(),
                serde_json::to_string(&r.progress).unwrap_or_default(),
            ));
        }
        Ok(())
    })?;
    Ok(out)
}

pub fn history(store: &dyn Store, thread_id: &str, limit: i64) -> CoreResult<Vec<Value>> {
    let mut out = Vec::new();
    store.read(&mut |c| {
        out = c
            .history(thread_id, limit)?
            .iter()
            .map(Row::entry)
            .collect();
        Ok(())
    })?;
    Ok(out)
}

fn not_found(thread_id: &str, checkpoint_id: &str) -> crate::error::CoreError {
    graph_error(
        "checkpoint_not_found",
        format!("thread '{thread_id}' has no checkpoint '{checkpoint_id}'"),
        json!({"thread_id": thread_id, "checkpoint_id": checkpoint_id}),
    )
}

fn unknown_thread(thread_id: &str) -> crate::error::CoreError {
    graph_error(
        "thread_not_found",
        format!("no thread '{thread_id}' in this storage"),
        json!({"thread_id": thread_id}),
    )
}

/// A snapshot copy of `checkpoint_id` (which must belong to `source`) for
/// thread `into`, on its chain.
fn copy_of(
    c: &dyn GraphTx,
    source: &str,
    checkpoint_id: &str,
    (into, chain): (&str, Option<i64>),
    parent: Option<String>,
    version: i64,
    kind: &str,
) -> CoreResult<Row> {
    let row = c
        .get(checkpoint_id)?
        .filter(|r| r.thread_id.as_deref() == Some(source))
        .ok_or_else(|| not_found(source, checkpoint_id))?;
    let rebuilt =
        checkpoint::rebuild(c, checkpoint_id)?.ok_or_else(|| not_found(source, checkpoint_id))?;
    Ok(Row {
        checkpoint_id: checkpoint::new_id(chain, version),
        thread_id: Some(into.to_string()),
        rid: row.rid,
        parent_id: parent,
        version,
        source: kind.into(),
        status: row.status.clone(),
        run_id: row.run_id.clone(),
        step: row.step,
        created_at_ms: checkpoint::now_ms(),
        delta_json: None,
        snapshot_json: Some(Value::Object(rebuilt.state).to_string()),
        meta_json: row.meta_json,
    })
}

fn status_after(row: &Row) -> CoreResult<&'static str> {
    let p = checkpoint::parse_progress(row)?;
    Ok(if p.pending.is_empty() {
        "idle"
    } else {
        "suspended"
    })
}

/// Copies a checkpoint as the thread's new head (history kept).
pub fn rewind(
    store: &dyn Store,
    thread_id: &str,
    graph: &str,
    fingerprint: &str,
    checkpoint_id: &str,
) -> CoreResult<Value> {
    let mut out = Value::Null;
    store.transact(&mut |tx| {
        let mut t = tx
            .thread(thread_id)?
            .ok_or_else(|| not_found(thread_id, checkpoint_id))?;
        checkpoint::check_graph(&t, graph, fingerprint)?;
        refuse_busy(&t)?;
        t.chain = tx.ensure_chain(thread_id, Some(&t))?;
        let row = copy_of(
            tx,
            thread_id,
            checkpoint_id,
            (thread_id, t.chain),
            t.head.clone(),
            t.version + 1,
            "rewind",
        )?;
        tx.insert(&row)?;
        t.head = Some(row.checkpoint_id.clone());
        t.version = row.version;
        t.status = status_after(&row)?.into();
        t.owner = None;
        t.updated_at_ms = checkpoint::now_ms();
        tx.upsert_thread(&t)?;
        out = row.entry();
        Ok(())
    })?;
    Ok(out)
}

/// Starts `new_thread_id` from a checkpoint of `thread_id`.
pub fn fork(
    store: &dyn Store,
    thread_id: &str,
    graph: &str,
    fingerprint: &str,
    checkpoint_id: &str,
    new_thread_id: &str,
) -> CoreResult<Value> {
    let mut out = Value::Null;
    store.transact(&mut |tx| {
        let t = tx
            .thread(thread_id)?
            .ok_or_else(|| not_found(thread_id, checkpoint_id))?;
        checkpoint::check_graph(&t, graph, fingerprint)?;
        if tx.thread(new_thread_id)?.is_some() {
            return Err(graph_error(
                "thread_exists",
                format!("cannot fork into thread '{new_thread_id}': it exists"),
                json!({"thread_id": new_thread_id}),
            ));
        }
        let chain = tx.ensure_chain(new_thread_id, None)?;
        let row = copy_of(
            tx,
            thread_id,
            checkpoint_id,
            (new_thread_id, chain),
            Some(checkpoint_id.to_string()),
            1,
            "fork",
        )?;
        tx.insert(&row)?;
        let now = checkpoint::now_ms();
        tx.upsert_thread(&Thread {
            thread_id: new_thread_id.to_string(),
            graph: graph.to_string(),
            fingerprint: fingerprint.to_string(),
            head: Some(row.checkpoint_id.clone()),
            version: 1,
            status: status_after(&row)?.into(),
            run_id: row.run_id.clone(),
            owner: None,
            created_at_ms: now,
            updated_at_ms: now,
            chain,
        })?;
        out = row.entry();
        Ok(())
    })?;
    Ok(out)
}

/// Deletes a thread and its checkpoints; false when there was none.
pub fn delete(
    store: &dyn Store,
    thread_id: &str,
    graph: &str,
    fingerprint: &str,
) -> CoreResult<bool> {
    let mut existed = false;
    store.transact(&mut |tx| {
        if let Some(t) = tx.thread(thread_id)? {
            checkpoint::check_graph(&t, graph, fingerprint)?;
            refuse_busy(&t)?;
        }
        existed = tx.delete_thread(thread_id)?;
        Ok(())
    })?;
    Ok(existed)
}

/// Rewinds by thread id alone (the CLI, which has no graph object).
pub fn rewind_any(store: &dyn Store, thread_id: &str, checkpoint_id: &str) -> CoreResult<Value> {
    let t = info(store, thread_id)?.ok_or_else(|| unknown_thread(thread_id))?;
    rewind(store, thread_id, &t.graph, &t.fingerprint, checkpoint_id)
}

pub fn prune(store: &dyn Store, before_ms: i64) -> CoreResult<Vec<String>> {
    let mut out = Vec::new();
    store.transact(&mut |tx| {
        out = tx.prune(before_ms)?;
        Ok(())
    })?;
    Ok(out)
}

pub fn list(store: &dyn Store, graph: Option<&str>) -> CoreResult<Vec<Value>> {
    let mut out = Vec::new();
    store.read(&mut |c| {
        out = c
            .threads(graph)?
            .iter()
            .map(|t| {
                let mut v = t.to_json();
                v["status"] = json!(effective_status(t));
                v
            })
            .collect();
        Ok(())
    })?;
    Ok(out)
}

pub fn history_any(store: &dyn Store, thread_id: &str, limit: i64) -> CoreResult<Vec<Value>> {
    if info(store, thread_id)?.is_none() {
        return Err(unknown_thread(thread_id));
    }
    history(store, thread_id, limit)
}

pub fn add_audit(
    store: &dyn Store,
    thread_id: &str,
    actor: Option<&str>,
    action: &str,
    checkpoint_id: Option<&str>,
) -> CoreResult<()> {
    store.transact(&mut |tx| tx.audit(thread_id, actor, action, checkpoint_id))
}

pub fn audit(store: &dyn Store, thread_id: &str, limit: i64) -> CoreResult<Vec<Value>> {
    let mut out = Vec::new();
    store.read(&mut |c| {
        out = c.audit_entries(thread_id, limit)?;
        Ok(())
    })?;
    Ok(out)
}

/// Checks resume values against a thread's waiting nodes before anything
/// is claimed (EXT-29: nothing runs, the thread keeps waiting).
pub fn check_resume(store: &dyn Store, thread_id: &str, names: &[String]) -> CoreResult<()> {
    let pending = match head_state(store, thread_id)? {
        Some((_, progress)) => {
            serde_json::from_str::<checkpoint::Progress>(&progress)
                .map_err(|e| plain_error("checkpoint_corrupt", e.to_string()))?
                .pending
        }
        None => Vec::new(),
    };
    super::exec::check_answers(&pending, names)
}
