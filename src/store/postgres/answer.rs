//! `compose answer` on PostgreSQL: `AnswerTx` on a transaction, and the
//! transaction `store::answer::answer_in` runs in.

use crate::clock;
use crate::error::CoreResult;
use crate::store::answer::{answer_in, AnswerOutcome, AnswerTx, AnsweredRun};
use crate::store::postgres::ext::PgGraph;
use crate::store::postgres::inner::PgStore;
use deadpool_postgres::GenericClient;

impl<C: GenericClient> AnswerTx for PgGraph<'_, C> {
    fn answered_run(&self, run_id: &str) -> CoreResult<Option<AnsweredRun>> {
        // The row lock orders this against a concurrent claim or settlement.
        Ok(self
            .query(
                "SELECT rid, kind, status, lease_owner IS NOT NULL, args_json FROM runs \
                 WHERE run_id = $1 FOR UPDATE",
                &[&run_id],
            )?
            .first()
            .map(|r| AnsweredRun {
                rid: r.get(0),
                kind: r.get(1),
                status: r.get(2),
                leased: r.get(3),
                args_json: r.get(4),
            }))
    }

    fn journal_value(&self, rid: i64, step_key: &str) -> CoreResult<Option<String>> {
        Ok(self
            .query(
                "SELECT value_json FROM journal WHERE rid = $1 AND step_key = $2",
                &[&rid, &step_key],
            )?
            .first()
            .map(|r| r.get(0)))
    }

    fn insert_journal(&self, rid: i64, step_key: &str, value_json: &str) -> CoreResult<()> {
        self.run(
            "INSERT INTO journal(rid, step_key, value_json) VALUES($1, $2, $3)",
            &[&rid, &step_key, &value_json],
        )
        .map(|_| ())
    }

    fn delete_pending_row(&self, rid: i64, interrupt_id: &str) -> CoreResult<bool> {
        self.run(
            "DELETE FROM pending_interrupts WHERE rid = $1 AND interrupt_id = $2",
            &[&rid, &interrupt_id],
        )
        .map(|n| n > 0)
    }

    fn pending_left(&self, rid: i64) -> CoreResult<i64> {
        Ok(self
            .query(
                "SELECT COUNT(*) FROM pending_interrupts WHERE rid = $1",
                &[&rid],
            )?
            .first()
            .map_or(0, |r| r.get(0)))
    }

    fn make_due(&self, rid: i64, step_key: &str, wake_at: f64) -> CoreResult<()> {
        self.run(
            "INSERT INTO waits(rid, step_key, wake_at) VALUES($1, $2, $3) ON CONFLICT DO NOTHING",
            &[&rid, &step_key, &wake_at],
        )
        .map(|_| ())
    }
}

impl PgStore {
    /// Runs `answer_in` in one transaction, committed only when the answers
    /// were journaled.
    pub fn answer_interrupts(
        &self,
        run_id: &str,
        answers: &[(String, String)],
        at: Option<&str>,
    ) -> CoreResult<AnswerOutcome> {
        // The answers are journaled first-write-wins: a repeated try
        // stores each once.
        self.retry_blocking(|_| {
            let mut c = self.bounded_blocking(self.client())?;
            let tx = self.bounded_blocking(async { c.transaction().await.map_err(self.err()) })?;
            let outcome = answer_in(
                &PgGraph {
                    c: &tx,
                    store: &self.inner,
                },
                run_id,
                answers,
                at,
                clock::now(),
            )?;
            if matches!(outcome, AnswerOutcome::Answered(_)) {
                self.bounded_blocking(async { tx.commit().await.map_err(self.err()) })?;
            }
            Ok(outcome)
        })
    }
}
