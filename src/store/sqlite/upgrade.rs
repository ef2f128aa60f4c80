//! Code versions and checked upgrades on SQLite (OPS-1, OPS-3):
//! `UpgradeTx` on a connection, the transaction `store::upgrade::upgrade_in`
//! runs in, and the two reads `compose versions` and `compose upgrade` make.

use crate::error::{AtPath, CoreError, CoreResult};
use crate::store::upgrade::{
    upgrade_in, Candidate, UpgradeOutcome, UpgradeRequest, UpgradeSeen, UpgradeTx, VersionRow,
    DIVERGED, UPGRADE_KEY,
};
use crate::store::LeaseCheck;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

fn db(e: rusqlite::Error) -> CoreError {
    CoreError::Store(format!("composeai store (upgrade): {e}"))
}

impl UpgradeTx for Connection {
    fn upgrade_seen(&self, run_id: &str) -> CoreResult<Option<UpgradeSeen>> {
        self.query_row(
            "SELECT rid, status, fingerprint, error_json, lease_owner, lease_until FROM runs \
             WHERE run_id = ?1",
            [run_id],
            |r| {
                Ok(UpgradeSeen {
                    rid: r.get(0)?,
                    status: r.get(1)?,
                    fingerprint: r.get(2)?,
                    error_json: r.get(3)?,
                    holder: r.get(4)?,
                    until: r.get(5)?,
                })
            },
        )
        .optional()
        .map_err(db)
    }

    fn journal_rows(&self, rid: i64) -> CoreResult<i64> {
        self.query_row("SELECT COUNT(*) FROM journal WHERE rid = ?1", [rid], |r| {
            r.get(0)
        })
        .map_err(db)
    }

    fn upgrade_rows(&self, rid: i64) -> CoreResult<i64> {
        self.query_row(
            "SELECT COUNT(*) FROM journal WHERE rid = ?1 AND substr(step_key, 1, ?2) = ?3",
            params![rid, UPGRADE_KEY.len() as i64, UPGRADE_KEY],
            |r| r.get(0),
        )
        .map_err(db)
    }

    fn restamp(&self, rid: i64, to: &str, status: Option<&str>, at: f64) -> CoreResult<()> {
        match status {
            None => self.execute(
                "UPDATE runs SET fingerprint = ?1, updated_at = ?2 WHERE rid = ?3",
                params![to, at, rid],
            ),
            Some(status) => self.execute(
                "UPDATE runs SET fingerprint = ?1, updated_at = ?2, status = ?3, \
                 error_json = NULL, output_json = NULL WHERE rid = ?4",
                params![to, at, status, rid],
            ),
        }
        .map(|_| ())
        .map_err(db)
    }
}

/// Runs `upgrade_in` in one immediate transaction on the store's writer
/// connection `c` (database `path`), committed only when the run was
/// re-stamped.
pub fn upgrade_run(
    c: &mut Connection,
    path: &str,
    req: &UpgradeRequest<'_>,
    live: LeaseCheck<'_>,
) -> CoreResult<UpgradeOutcome> {
    let tx = c
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .at(path)?;
    let outcome = upgrade_in(&*tx, req, live)?;
    if matches!(outcome, UpgradeOutcome::Upgraded(_)) {
        tx.commit().at(path)?;
        crate::clock::poke();
    }
    Ok(outcome)
}

/// Per flow and fingerprint, the flow runs not settled yet.
pub fn code_versions(c: &Connection) -> rusqlite::Result<Vec<VersionRow>> {
    let mut st = c.prepare_cached(
        "SELECT name, fingerprint, SUM(status = 'queued'), SUM(status = 'running'), \
         SUM(status = 'paused'), MAX(created_at) FROM runs \
         WHERE kind = 'flow' AND status IN ('queued', 'running', 'paused') \
         GROUP BY name, fingerprint ORDER BY name, MAX(created_at) DESC",
    )?;
    let rows = st.query_map([], |r| {
        Ok(VersionRow {
            flow: r.get(0)?,
            fingerprint: r.get(1)?,
            queued: r.get(2)?,
            running: r.get(3)?,
            paused: r.get(4)?,
            newest: r.get(5)?,
        })
    })?;
    rows.collect()
}

/// The runs of `flows` an upgrade to their fingerprints considers.
pub fn candidates(
    c: &Connection,
    flows: &[(String, String)],
    since: Option<f64>,
) -> rusqlite::Result<Vec<Candidate>> {
    let flows = serde_json::Value::Object(
        flows
            .iter()
            .map(|(n, f)| (n.clone(), serde_json::Value::String(f.clone())))
            .collect(),
    )
    .to_string();
    let mut st = c.prepare_cached(
        "SELECT r.run_id, r.name, r.status, r.fingerprint, q.queue FROM runs r \
         JOIN json_each(?1) f ON f.key = r.name LEFT JOIN queue_runs q ON q.rid = r.rid \
         WHERE r.kind = 'flow' AND r.created_at >= ?2 \
           AND ((r.status IN ('queued', 'running', 'paused') AND r.fingerprint IS NOT f.value) \
             OR (r.status = 'failed' AND CASE WHEN json_valid(r.error_json) \
               THEN json_extract(r.error_json, '$.type') END = ?3)) \
         ORDER BY r.created_at, r.rid",
    )?;
    let rows = st.query_map(params![flows, since.unwrap_or(f64::MIN), DIVERGED], |r| {
        Ok(Candidate {
            run_id: r.get(0)?,
            flow: r.get(1)?,
            status: r.get(2)?,
            fingerprint: r.get(3)?,
            queue: r.get(4)?,
        })
    })?;
    rows.collect()
}
