//! `compose answer` (and the web UI's Approve / Deny): a run's interrupt
//! answers journaled outside any attempt, so no process has to execute the
//! run to record them. The logic is written once here over `AnswerTx`,
//! which each backend implements on its transaction.
//!
//! In one transaction, per answer: the journal row `__interrupt__:<key>` is
//! inserted first-write-wins (as `resume(answers=...)` does, FLOW-43) and
//! the interrupt's pending row deleted. The key is the interrupt id for a
//! flow or agent; a graph node's id repeats each time the node suspends, so
//! its key also names the checkpoint of the suspension it answers, read in
//! the same transaction (a thread-less run's newest checkpoint, or the head
//! of the thread the run is suspended in). When that leaves a parked run
//! with nothing pending and no lease, the run gets a `waits` row due now, so
//! `due_runs` lists it and a `compose worker` continues it (on PostgreSQL
//! the row's insert trigger also sends the worker's wake-up hint). Taking
//! the lease on the run deletes that row again, like any other wait.

use crate::error::CoreResult;
use crate::store::durable::ANSWERED_WAIT;
use crate::store::graph::GraphTx;

/// `(interrupt_id, stored, value_json)`: whether this answer was stored,
/// and the value the journal holds for the interrupt now.
pub type AnswerTuple = (String, bool, String);

/// The answers of one call and whether the run is now due for a worker.
pub type Answered = (Vec<AnswerTuple>, bool);

/// What one call did. Anything but `Answered` stores nothing.
#[derive(Debug, PartialEq)]
pub enum AnswerOutcome {
    NoRun,
    Answered(Answered),
    /// A graph run is no longer paused at the suspension the caller saw:
    /// where it is paused now (`None`: it is being continued, or not
    /// paused at all).
    Superseded(Option<String>),
    /// This interrupt is neither pending nor answered any more.
    NotPending(String),
}

/// What a run looked like when it was answered (its row locked against a
/// concurrent claim where the store locks rows).
pub struct AnsweredRun {
    pub rid: i64,
    pub kind: String,
    pub status: String,
    pub leased: bool,
    pub args_json: Option<String>,
}

impl AnsweredRun {
    /// Whether the answered run is due for a worker: a parked flow,
    /// standalone agent or graph that waits for nothing else (`left` pending
    /// interrupts) and that no attempt is executing.
    pub fn wakes(&self, left: i64) -> bool {
        matches!(self.kind.as_str(), "flow" | "agent" | "graph")
            && self.status == "paused"
            && !self.leased
            && left == 0
    }
}

/// The rows `answer_in` reads and writes, inside one transaction.
pub trait AnswerTx: GraphTx {
    fn answered_run(&self, run_id: &str) -> CoreResult<Option<AnsweredRun>>;
    fn journal_value(&self, rid: i64, step_key: &str) -> CoreResult<Option<String>>;
    fn insert_journal(&self, rid: i64, step_key: &str, value_json: &str) -> CoreResult<()>;
    /// Deletes one pending interrupt; whether it was there.
    fn delete_pending_row(&self, rid: i64, interrupt_id: &str) -> CoreResult<bool>;
    fn pending_left(&self, rid: i64) -> CoreResult<i64>;
    /// A `waits` row due at `wake_at` (kept when one exists).
    fn make_due(&self, rid: i64, step_key: &str, wake_at: f64) -> CoreResult<()>;
}

/// The thread a graph run was started in, from its stored arguments
/// (`{"input": ..., "thread": id}`).
fn thread_of(args_json: Option<&str>) -> Option<String> {
    let args: serde_json::Value = serde_json::from_str(args_json?).ok()?;
    args.get("thread")?.as_str().map(str::to_string)
}

/// The checkpoint graph run `run_id` is suspended at: the head of its
/// thread while the thread is suspended in this run, else (thread-less)
/// the run's newest checkpoint; `None` when there is none.
pub fn suspension_head(
    tx: &dyn GraphTx,
    run_id: &str,
    rid: i64,
    args_json: Option<&str>,
) -> CoreResult<Option<String>> {
    if let Some(thread_id) = thread_of(args_json) {
        return Ok(tx.thread(&thread_id)?.and_then(|t| {
            let ours = t.run_id.as_deref() == Some(run_id) && t.status == "suspended";
            if ours {
                t.head
            } else {
                None
            }
        }));
    }
    Ok(tx.run_head(rid)?.map(|r| r.checkpoint_id))
}

/// The journal key (after `__interrupt__:`) of an answer to graph interrupt
/// `node:<name>` given from outside for the suspension at checkpoint `head`.
pub fn graph_answer_key(interrupt_id: &str, head: &str) -> String {
    format!("{interrupt_id}@{head}")
}

/// Journals `answers` (`(interrupt id, value JSON)`, ids already resolved)
/// for run `run_id` inside `tx`. A graph answer is keyed by the suspension
/// read here; `at` is the checkpoint the caller saw the interrupt at. The
/// caller commits only an `Answered` outcome.
pub fn answer_in(
    tx: &dyn AnswerTx,
    run_id: &str,
    answers: &[(String, String)],
    at: Option<&str>,
    now: f64,
) -> CoreResult<AnswerOutcome> {
    let Some(run) = tx.answered_run(run_id)? else {
        return Ok(AnswerOutcome::NoRun);
    };
    let mut head = None;
    if run.kind == "graph" {
        // An answer belongs to the question the caller saw: a node that was
        // resumed and suspended again may ask something else (another
        // amount, another draft), so an answer given for an earlier
        // suspension is refused rather than carried over to the new one.
        // A run an attempt holds is being continued right now: whatever it
        // is answered with, an answer journaled here would reach nothing.
        if run.status != "paused" || run.leased {
            return Ok(AnswerOutcome::Superseded(None));
        }
        let Some(now_at) = suspension_head(tx, run_id, run.rid, run.args_json.as_deref())? else {
            return Ok(AnswerOutcome::Superseded(None));
        };
        if at.is_some_and(|a| a != now_at) {
            return Ok(AnswerOutcome::Superseded(Some(now_at)));
        }
        head = Some(now_at);
    }
    let mut out = Vec::with_capacity(answers.len());
    for (id, value) in answers {
        let key = match &head {
            Some(h) => format!("__interrupt__:{}", graph_answer_key(id, h)),
            None => format!("__interrupt__:{id}"),
        };
        let was_pending = tx.delete_pending_row(run.rid, id)?;
        if let Some(earlier) = tx.journal_value(run.rid, &key)? {
            out.push((id.clone(), false, earlier));
            continue;
        }
        if !was_pending {
            return Ok(AnswerOutcome::NotPending(id.clone()));
        }
        tx.insert_journal(run.rid, &key, value)?;
        out.push((id.clone(), true, value.clone()));
    }
    let left = tx.pending_left(run.rid)?;
    let due = run.wakes(left) && out.iter().any(|a| a.1);
    if due {
        tx.make_due(run.rid, &format!("{ANSWERED_WAIT}{}", out[0].0), now)?;
    }
    Ok(AnswerOutcome::Answered((out, due)))
}
