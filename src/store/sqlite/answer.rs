//! `compose answer` on SQLite: `AnswerTx` on a connection, and the
//! transaction `store::answer::answer_in` runs in.

use crate::clock;
use crate::error::{AtPath, CoreError, CoreResult};
use crate::store::answer::{answer_in, AnswerOutcome, AnswerTx, AnsweredRun};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

fn db(e: rusqlite::Error) -> CoreError {
    CoreError::Store(format!("composeai store (answers): {e}"))
}

impl AnswerTx for Connection {
    fn answered_run(&self, run_id: &str) -> CoreResult<Option<AnsweredRun>> {
        self.query_row(
            "SELECT rid, kind, status, lease_owner IS NOT NULL, args_json FROM runs \
             WHERE run_id = ?1",
            [run_id],
            |r| {
                Ok(AnsweredRun {
                    rid: r.get(0)?,
                    kind: r.get(1)?,
                    status: r.get(2)?,
                    leased: r.get(3)?,
                    args_json: r.get(4)?,
                })
            },
        )
        .optional()
        .map_err(db)
    }

    fn journal_value(&self, rid: i64, step_key: &str) -> CoreResult<Option<String>> {
        self.query_row(
            "SELECT value_json FROM journal WHERE rid = ?1 AND step_key = ?2",
            params![rid, step_key],
            |r| r.get(0),
        )
        .optional()
        .map_err(db)
    }

    fn insert_journal(&self, rid: i64, step_key: &str, value_json: &str) -> CoreResult<()> {
        self.execute(
            "INSERT INTO journal(rid, step_key, value_json) VALUES(?1, ?2, ?3)",
            params![rid, step_key, value_json],
        )
        .map(|_| ())
        .map_err(db)
    }

    fn delete_pending_row(&self, rid: i64, interrupt_id: &str) -> CoreResult<bool> {
        self.execute(
            "DELETE FROM pending_interrupts WHERE rid = ?1 AND interrupt_id = ?2",
            params![rid, interrupt_id],
        )
        .map(|n| n > 0)
        .map_err(db)
    }

    fn pending_left(&self, rid: i64) -> CoreResult<i64> {
        self.query_row(
            "SELECT COUNT(*) FROM pending_interrupts WHERE rid = ?1",
            [rid],
            |r| r.get(0),
        )
        .map_err(db)
    }

    fn make_due(&self, rid: i64, step_key: &str, wake_at: f64) -> CoreResult<()> {
        self.execute(
            "INSERT OR IGNORE INTO waits(rid, step_key, wake_at) VALUES(?1, ?2, ?3)",
            params![rid, step_key, wake_at],
        )
        .map(|_| ())
        .map_err(db)
    }
}

/// Runs `answer_in` in one immediate transaction on the store's writer
/// connection `c` (database `path`), committed only when the answers were
/// journaled.
pub fn answer_interrupts(
    c: &mut Connection,
    path: &str,
    run_id: &str,
    answers: &[(String, String)],
    at: Option<&str>,
) -> CoreResult<AnswerOutcome> {
    let tx = c
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .at(path)?;
    let outcome = answer_in(&*tx, run_id, answers, at, clock::now())?;
    if matches!(outcome, AnswerOutcome::Answered(_)) {
        tx.commit().at(path)?;
    }
    Ok(outcome)
}
