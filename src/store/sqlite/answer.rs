//! SQL of `compose answer` on SQLite (see `store::answer`).

use crate::clock;
use crate::error::{AtPath, CoreResult};
use crate::store::answer::{Answered, AnsweredRun};
use crate::store::sqlite::store::SqliteStore;
use crate::store::Store;
use rusqlite::{params, OptionalExtension, TransactionBehavior};

/// Journals `answers` (`(interrupt id, journal key, value JSON)`) for run `run_id` in
/// one transaction, first write wins, and deletes their pending rows;
/// `None` when there is no such run.
pub fn answer_interrupts(
    store: &SqliteStore,
    run_id: &str,
    answers: &[(String, String, String)],
) -> CoreResult<Option<Answered>> {
    let path = store.path().to_string();
    store.with_conn(|c| {
        let tx = c
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .at(&path)?;
        let run = tx
            .query_row(
                "SELECT rid, kind, status, lease_owner IS NOT NULL FROM runs WHERE run_id = ?1",
                [run_id],
                |r| {
                    Ok(AnsweredRun {
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
        for (id, key, value) in answers {
            let key = format!("__interrupt__:{key}");
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
        let due = run.wakes(left) && out.iter().any(|a| a.1);
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
