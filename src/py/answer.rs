//! `compose answer` (and the web UI's Approve / Deny): answers to a run's
//! interrupts journaled outside any attempt, so no process has to execute
//! the run to record them.
//!
//! In one transaction, per answer: the journal row `__interrupt__:<id>` is
//! inserted first-write-wins (as `resume(answers=...)` does, FLOW-43) and
//! the interrupt's pending row deleted. When that leaves a parked `flow`
//! run with nothing pending and no lease, the run gets a `waits` row due
//! now, so `due_runs` lists it and a `compose worker` continues it (on
//! PostgreSQL the row's insert trigger also sends the worker's wake-up
//! hint). Taking the lease on the run deletes that row again, like any
//! other wait.

use super::errors::IntoPy;
use super::store::PyStore;
use crate::durable::clock;
use crate::error::{AtPath, CoreResult};
use crate::runtime::block_on;
use pyo3::prelude::*;
use rusqlite::{params, OptionalExtension, TransactionBehavior};

/// `(interrupt_id, stored, value_json)`: whether this answer was stored,
/// and the value the journal holds for the interrupt now.
type AnswerTuple = (String, bool, String);

/// What a run looked like when it was answered.
struct RunState {
    rid: i64,
    kind: String,
    status: String,
    leased: bool,
}

/// Whether an answered run is due for a worker: a parked flow that waits
/// for nothing else and that no attempt is executing.
fn wakes(run: &RunState, left: i64) -> bool {
    run.kind == "flow" && run.status == "paused" && !run.leased && left == 0
}

fn answer_sqlite(
    store: &crate::store::sqlite::SqliteStore,
    run_id: &str,
    answers: &[(String, String)],
) -> CoreResult<Option<(Vec<AnswerTuple>, bool)>> {
    let path = crate::store::Store::path(store).to_string();
    store.with_conn(|c| {
        let tx = c
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .at(&path)?;
        let run = tx
            .query_row(
                "SELECT rid, kind, status, lease_owner IS NOT NULL FROM runs WHERE run_id = ?1",
                [run_id],
                |r| {
                    Ok(RunState {
                        rid: r.get(0)?,
                        kind: r.get(1)?,
                        status: r.get(2)?,
                        leased: r.get(3)?,
                    })
                },
            )
            .optional()
            .at(&path)?;
        let Some(run) = run else {
            return Ok(None);
        };
        let mut out = Vec::with_capacity(answers.len());
        for (id, value) in answers {
            let key = format!("__interrupt__:{id}");
            let stored = tx
                .execute(
                    "INSERT OR IGNORE INTO journal(rid, step_key, value_json) VALUES(?1, ?2, ?3)",
                    params![run.rid, key, value],
                )
                .at(&path)?
                == 1;
            let now: String = tx
                .query_row(
                    "SELECT value_json FROM journal WHERE rid = ?1 AND step_key = ?2",
                    params![run.rid, key],
                    |r| r.get(0),
                )
                .at(&path)?;
            tx.execute(
                "DELETE FROM pending_interrupts WHERE rid = ?1 AND interrupt_id = ?2",
                params![run.rid, id],
            )
            .at(&path)?;
            out.push((id.clone(), stored, now));
        }
        let left: i64 = tx
            .query_row(
                "SELECT COUNT(*) FROM pending_interrupts WHERE rid = ?1",
                [run.rid],
                |r| r.get(0),
            )
            .at(&path)?;
        let due = wakes(&run, left) && out.iter().any(|a| a.1);
        if due {
            tx.execute(
                "INSERT OR IGNORE INTO waits(rid, step_key, wake_at) VALUES(?1, ?2, ?3)",
                params![run.rid, format!("__interrupt__:{}", out[0].0), clock::now()],
            )
            .at(&path)?;
        }
        tx.commit().at(&path)?;
        Ok(Some((out, due)))
    })
}

fn answer_postgres(
    store: &crate::store::postgres::PgStore,
    run_id: &str,
    answers: &[(String, String)],
) -> CoreResult<Option<(Vec<AnswerTuple>, bool)>> {
    block_on(async {
        let mut c = store.client().await?;
        let err = store.err();
        let tx = c.transaction().await.map_err(&err)?;
        // The row lock orders this against a concurrent claim or settlement.
        let found = tx
            .query(
                "SELECT rid, kind, status, lease_owner IS NOT NULL FROM runs \
                 WHERE run_id = $1 FOR UPDATE",
                &[&run_id],
            )
            .await
            .map_err(&err)?;
        let Some(r) = found.first() else {
            return Ok(None);
        };
        let run = RunState {
            rid: r.get(0),
            kind: r.get(1),
            status: r.get(2),
            leased: r.get(3),
        };
        let mut out = Vec::with_capacity(answers.len());
        for (id, value) in answers {
            let key = format!("__interrupt__:{id}");
            let stored = tx
                .execute(
                    "INSERT INTO journal(rid, step_key, value_json) VALUES($1, $2, $3) \
                     ON CONFLICT DO NOTHING",
                    &[&run.rid, &key, value],
                )
                .await
                .map_err(&err)?
                == 1;
            let now: String = tx
                .query_one(
                    "SELECT value_json FROM journal WHERE rid = $1 AND step_key = $2",
                    &[&run.rid, &key],
                )
                .await
                .map_err(&err)?
                .get(0);
            tx.execute(
                "DELETE FROM pending_interrupts WHERE rid = $1 AND interrupt_id = $2",
                &[&run.rid, id],
            )
            .await
            .map_err(&err)?;
            out.push((id.clone(), stored, now));
        }
        let left: i64 = tx
            .query_one(
                "SELECT COUNT(*) FROM pending_interrupts WHERE rid = $1",
                &[&run.rid],
            )
            .await
            .map_err(&err)?
            .get(0);
        let due = wakes(&run, left) && out.iter().any(|a| a.1);
        if due {
            tx.execute(
                "INSERT INTO waits(rid, step_key, wake_at) VALUES($1, $2, $3) \
                 ON CONFLICT DO NOTHING",
                &[
                    &run.rid,
                    &format!("__interrupt__:{}", out[0].0),
                    &clock::now(),
                ],
            )
            .await
            .map_err(&err)?;
        }
        tx.commit().await.map_err(&err)?;
        Ok(Some((out, due)))
    })
}

/// Journals `answers` (`(interrupt id, value JSON)`, ids already resolved)
/// for run `run_id` in one transaction, first write wins, and deletes their
/// pending rows. Returns `None` when there is no such run, else
/// `([(id, stored, value_json)], due)`: `due` when the run is now due for
/// a worker.
#[pyfunction]
pub fn answer_interrupts(
    py: Python<'_>,
    store: &PyStore,
    run_id: &str,
    answers: Vec<(String, String)>,
) -> PyResult<Option<(Vec<AnswerTuple>, bool)>> {
    let found = py
        .allow_threads(|| match (&store.sqlite, &store.pg) {
            (Some(s), _) => answer_sqlite(s, run_id, &answers),
            (None, Some(pg)) => answer_postgres(pg, run_id, &answers),
            (None, None) => Ok(None),
        })
        .py_err()?;
    if found.as_ref().is_some_and(|f| f.1) {
        // A worker of this process blocked in `wait_for_work` looks again.
        clock::poke();
    }
    Ok(found)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(answer_interrupts, m)?)
}
