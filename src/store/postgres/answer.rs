//! SQL of `compose answer` on PostgreSQL (see `store::answer`).

use crate::clock;
use crate::error::CoreResult;
use crate::runtime::block_on;
use crate::store::answer::{Answered, AnsweredRun};
use crate::store::postgres::inner::PgStore;

impl PgStore {
    /// Journals `answers` (`(interrupt id, journal key, value JSON)`) for run `run_id`
    /// in one transaction, first write wins, and deletes their pending
    /// rows; `None` when there is no such run.
    pub fn answer_interrupts(
        &self,
        run_id: &str,
        answers: &[(String, String, String)],
    ) -> CoreResult<Option<Answered>> {
        block_on(async {
            let mut c = self.client().await?;
            let err = self.err();
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
            let run = AnsweredRun {
                rid: r.get(0),
                kind: r.get(1),
                status: r.get(2),
                leased: r.get(3),
            };
            let mut out = Vec::with_capacity(answers.len());
            for (id, key, value) in answers {
                let key = format!("__interrupt__:{key}");
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
            let due = run.wakes(left) && out.iter().any(|a| a.1);
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
}
