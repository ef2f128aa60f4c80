//! Code versions and checked upgrades on PostgreSQL (OPS-1, OPS-3):
//! `UpgradeTx` on a transaction (the run row locked `FOR UPDATE`, so a
//! concurrent claim or a second upgrade waits for it), the transaction
//! `store::upgrade::upgrade_in` runs in, and the reads of `compose versions`
//! and `compose upgrade`.

use crate::error::CoreResult;
use crate::runtime::block_on;
use crate::store::postgres::ext::PgGraph;
use crate::store::postgres::inner::PgStore;
use crate::store::upgrade::{
    upgrade_in, Candidate, UpgradeOutcome, UpgradeRequest, UpgradeSeen, UpgradeTx, VersionRow,
    DIVERGED, UPGRADE_KEY,
};
use crate::store::LeaseCheck;
use deadpool_postgres::GenericClient;

impl<C: GenericClient> UpgradeTx for PgGraph<'_, C> {
    fn upgrade_seen(&self, run_id: &str) -> CoreResult<Option<UpgradeSeen>> {
        Ok(self
            .query(
                "SELECT rid, status, fingerprint, error_json, lease_owner, lease_until FROM runs \
                 WHERE run_id = $1 FOR UPDATE",
                &[&run_id],
            )?
            .first()
            .map(|r| UpgradeSeen {
                rid: r.get(0),
                status: r.get(1),
                fingerprint: r.get(2),
                error_json: r.get(3),
                holder: r.get(4),
                until: r.get(5),
            }))
    }

    fn journal_rows(&self, rid: i64) -> CoreResult<i64> {
        Ok(self
            .query("SELECT COUNT(*) FROM journal WHERE rid = $1", &[&rid])?
            .first()
            .map_or(0, |r| r.get(0)))
    }

    fn upgrade_rows(&self, rid: i64) -> CoreResult<i64> {
        Ok(self
            .query(
                "SELECT COUNT(*) FROM journal WHERE rid = $1 AND starts_with(step_key, $2)",
                &[&rid, &UPGRADE_KEY],
            )?
            .first()
            .map_or(0, |r| r.get(0)))
    }

    fn restamp(&self, rid: i64, to: &str, status: Option<&str>, at: f64) -> CoreResult<()> {
        match status {
            None => self.run(
                "UPDATE runs SET fingerprint = $1, updated_at = $2 WHERE rid = $3",
                &[&to, &at, &rid],
            ),
            Some(status) => self.run(
                "UPDATE runs SET fingerprint = $1, updated_at = $2, status = $3, \
                 error_json = NULL, output_json = NULL WHERE rid = $4",
                &[&to, &at, &status, &rid],
            ),
        }
        .map(|_| ())
    }
}

impl PgStore {
    /// Runs `upgrade_in` in one transaction, committed only when the run was
    /// re-stamped.
    pub fn upgrade_run(
        &self,
        req: &UpgradeRequest<'_>,
        live: LeaseCheck<'_>,
    ) -> CoreResult<UpgradeOutcome> {
        let mut c = block_on(self.client())?;
        let tx = block_on(c.transaction()).map_err(self.err())?;
        let outcome = upgrade_in(
            &PgGraph {
                c: &tx,
                store: &self.inner,
            },
            req,
            live,
        )?;
        if matches!(outcome, UpgradeOutcome::Upgraded(_)) {
            block_on(tx.commit()).map_err(self.err())?;
            crate::clock::poke();
        }
        Ok(outcome)
    }

    /// Per flow and fingerprint, the flow runs not settled yet.
    pub fn code_versions(&self) -> CoreResult<Vec<VersionRow>> {
        block_on(async {
            let c = self.client().await?;
            let rows = c
                .query(
                    "SELECT name, fingerprint, COUNT(*) FILTER (WHERE status = 'queued'), \
                     COUNT(*) FILTER (WHERE status = 'running'), \
                     COUNT(*) FILTER (WHERE status = 'paused'), MAX(created_at) FROM runs \
                     WHERE kind = 'flow' AND status IN ('queued', 'running', 'paused') \
                     GROUP BY name, fingerprint ORDER BY name, MAX(created_at) DESC",
                    &[],
                )
                .await
                .map_err(self.err())?;
            Ok(rows
                .iter()
                .map(|r| VersionRow {
                    flow: r.get(0),
                    fingerprint: r.get(1),
                    queued: r.get(2),
                    running: r.get(3),
                    paused: r.get(4),
                    newest: r.get(5),
                })
                .collect())
        })
    }

    /// The runs of `flows` an upgrade to their fingerprints considers.
    pub fn upgrade_candidates(
        &self,
        flows: &[(String, String)],
        since: Option<f64>,
    ) -> CoreResult<Vec<Candidate>> {
        let names: Vec<&str> = flows.iter().map(|f| f.0.as_str()).collect();
        let fps: Vec<&str> = flows.iter().map(|f| f.1.as_str()).collect();
        let since = since.unwrap_or(f64::MIN);
        block_on(async {
            let c = self.client().await?;
            let rows = c
                .query(
                    "SELECT r.run_id, r.name, r.status, r.fingerprint, q.queue FROM runs r \
                     JOIN unnest($1::text[], $2::text[]) f(name, fp) ON f.name = r.name \
                     LEFT JOIN queue_runs q ON q.rid = r.rid \
                     WHERE r.kind = 'flow' AND r.created_at >= $3 \
                       AND ((r.status IN ('queued', 'running', 'paused') \
                           AND r.fingerprint IS DISTINCT FROM f.fp) \
                         OR (r.status = 'failed' AND CASE WHEN r.error_json LIKE '{%' \
                           THEN (r.error_json::jsonb ->> 'type') END = $4)) \
                     ORDER BY r.created_at, r.rid",
                    &[&names, &fps, &since, &DIVERGED],
                )
                .await
                .map_err(self.err())?;
            Ok(rows
                .iter()
                .map(|r| Candidate {
                    run_id: r.get(0),
                    flow: r.get(1),
                    status: r.get(2),
                    fingerprint: r.get(3),
                    queue: r.get(4),
                })
                .collect())
        })
    }
}
