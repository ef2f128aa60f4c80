//! The queues on SQLite: every operation is one `IMMEDIATE` transaction,
//! so claims of concurrent workers are serialized by the file's write lock.

use crate::error::{AtPath, CoreResult};
use crate::store::queue::{
    allowance, claim_order, dedup_taken, window, Claimed, Claimer, LeaseHolder, Limits, Placement,
    QueueStats, QueueStore,
};
use crate::store::sqlite::store::SqliteStore;
use crate::store::{NewRun, RunRow, Store};
use crate::time::now;
use rusqlite::{params, OptionalExtension, TransactionBehavior};

pub fn enqueue(s: &SqliteStore, new: &NewRun, p: &Placement) -> CoreResult<RunRow> {
    let path = s.path().to_string();
    let t = now();
    let rid = s.with_conn(|c| {
        let tx = c
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .at(&path)?;
        if let Some(d) = &p.dedup_id {
            let held: Option<(String, String)> = tx
                .prepare_cached(
                    "SELECT r.run_id, r.status FROM queue_runs q JOIN runs r ON r.rid = q.rid \
                     WHERE q.queue = ?1 AND q.dedup_id = ?2 \
                     AND r.status IN ('queued', 'running') LIMIT 1",
                )
                .and_then(|mut st| {
                    st.query_row(params![p.queue, d], |r| Ok((r.get(0)?, r.get(1)?)))
                        .optional()
                })
                .at(&path)?;
            if let Some((run_id, status)) = held {
                return Err(dedup_taken(d, &p.queue, &run_id, &status));
            }
        }
        tx.prepare_cached(
            "INSERT INTO runs(run_id, kind, name, status, created_at, updated_at, trace_id, \
             fingerprint, args_json, budget_json, module) \
             VALUES(?1, ?2, ?3, 'queued', ?4, ?4, ?5, ?6, ?7, ?8, ?9)",
        )
        .and_then(|mut st| {
            st.execute(params![
                new.run_id,
                new.kind,
                new.name,
                t,
                new.trace_id,
                new.fingerprint,
                new.args_json,
                new.budget_json,
                new.module
            ])
        })
        .map_err(|e| match e {
            rusqlite::Error::SqliteFailure(f, _)
                if f.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                crate::error::CoreError::Config(format!(
                    "a run with run_id '{}' already exists",
                    new.run_id
                ))
            }
            e => crate::error::CoreError::Store(format!("composeai store '{path}': {e}")),
        })?;
        let rid = tx.last_insert_rowid();
        tx.prepare_cached(
            "INSERT INTO queue_runs(rid, queue, priority, dedup_id, enqueued_at) \
             VALUES(?1, ?2, ?3, ?4, ?5)",
        )
        .and_then(|mut st| st.execute(params![rid, p.queue, p.priority, p.dedup_id, t]))
        .at(&path)?;
        tx.commit().at(&path)?;
        Ok(rid)
    })?;
    Ok(RunRow::inserted(new, rid, "queued", t))
}

pub fn claim(
    s: &SqliteStore,
    queue: &str,
    limits: &Limits,
    room: i64,
    by: &Claimer<'_>,
) -> CoreResult<Vec<Claimed>> {
    let path = s.path().to_string();
    let flows = serde_json::to_string(by.flows)
        .map_err(|e| crate::error::CoreError::Store(e.to_string()))?;
    s.with_conn(|c| {
        let tx = c
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .at(&path)?;
        let t = now();
        let running: i64 = if limits.concurrency.is_some() {
            tx.prepare_cached(
                "SELECT COUNT(*) FROM runs r JOIN queue_runs q ON q.rid = r.rid \
                 WHERE r.status = 'running' AND q.queue = ?1",
            )
            .and_then(|mut st| st.query_row([queue], |r| r.get(0)))
            .at(&path)?
        } else {
            0
        };
        let started: i64 = if limits.rate_limit.is_some() {
            tx.prepare_cached(
                "SELECT COUNT(*) FROM queue_runs WHERE queue = ?1 AND started_at > ?2 \
                 AND started_at IS NOT NULL",
            )
            .and_then(|mut st| st.query_row(params![queue, t - window(limits)], |r| r.get(0)))
            .at(&path)?
        } else {
            0
        };
        let n = allowance(limits, room, running, started);
        if n == 0 {
            return Ok(Vec::new());
        }
        let picked: Vec<(i64, Claimed)> = {
            let mut st = tx
                .prepare_cached(&format!(
                    "SELECT q.rid, r.run_id, r.kind, r.name FROM queue_runs q \
                     JOIN runs r ON r.rid = q.rid \
                     WHERE q.queue = ?1 AND q.started_at IS NULL AND r.status = 'queued' \
                     AND r.name IN (SELECT value FROM json_each(?3)) \
                     ORDER BY {} LIMIT ?2",
                    claim_order(limits)
                ))
                .at(&path)?;
            let rows = st
                .query_map(params![queue, n, flows], |r| {
                    Ok((
                        r.get(0)?,
                        Claimed {
                            run_id: r.get(1)?,
                            kind: r.get(2)?,
                            name: r.get(3)?,
                        },
                    ))
                })
                .at(&path)?;
            rows.collect::<rusqlite::Result<_>>().at(&path)?
        };
        for (rid, _) in &picked {
            tx.prepare_cached(
                "UPDATE runs SET status = 'running', lease_owner = ?1, lease_until = ?2, \
                 updated_at = ?3 WHERE rid = ?4",
            )
            .and_then(|mut st| st.execute(params![by.owner, by.lease_until, t, rid]))
            .at(&path)?;
            tx.prepare_cached("UPDATE queue_runs SET started_at = ?1 WHERE rid = ?2")
                .and_then(|mut st| st.execute(params![t, rid]))
                .at(&path)?;
        }
        tx.commit().at(&path)?;
        Ok(picked.into_iter().map(|(_, c)| c).collect())
    })
}

pub fn stats(s: &SqliteStore, t: f64) -> CoreResult<Vec<QueueStats>> {
    let path = s.path().to_string();
    s.with_conn(|c| {
        let mut st = c
            .prepare_cached(
                "SELECT q.queue, \
                   SUM(q.started_at IS NULL AND r.status = 'queued'), \
                   SUM(q.started_at IS NOT NULL AND r.status = 'running'), \
                   SUM(r.status = 'completed' AND r.updated_at >= ?1), \
                   MIN(CASE WHEN q.started_at IS NULL AND r.status = 'queued' \
                       THEN q.enqueued_at END) \
                 FROM queue_runs q JOIN runs r ON r.rid = q.rid \
                 GROUP BY q.queue ORDER BY q.queue",
            )
            .at(&path)?;
        let rows = st
            .query_map([t - 3600.0], |r| {
                Ok(QueueStats {
                    queue: r.get(0)?,
                    queued: r.get(1)?,
                    running: r.get(2)?,
                    completed_last_hour: r.get(3)?,
                    oldest_queued_at: r.get(4)?,
                })
            })
            .at(&path)?;
        rows.collect::<rusqlite::Result<_>>().at(&path)
    })
}

pub fn lease_holders(s: &SqliteStore) -> CoreResult<Vec<LeaseHolder>> {
    let path = s.path().to_string();
    s.with_conn(|c| {
        let mut st = c
            .prepare_cached(
                "SELECT lease_owner, COUNT(*), MAX(lease_until) FROM runs \
                 WHERE lease_owner IS NOT NULL AND lease_until IS NOT NULL \
                 GROUP BY lease_owner ORDER BY MAX(lease_until) DESC",
            )
            .at(&path)?;
        let rows = st
            .query_map([], |r| {
                Ok(LeaseHolder {
                    owner: r.get(0)?,
                    runs: r.get(1)?,
                    lease_until: r.get(2)?,
                })
            })
            .at(&path)?;
        rows.collect::<rusqlite::Result<_>>().at(&path)
    })
}

/// Claim times of `queue` after `since`, oldest first, at most `limit`.
pub fn recent_starts(s: &SqliteStore, queue: &str, since: f64, limit: i64) -> CoreResult<Vec<f64>> {
    let path = s.path().to_string();
    s.with_conn(|c| {
        let mut st = c
            .prepare_cached(
                "SELECT started_at FROM queue_runs WHERE queue = ?1 AND started_at > ?2 \
                 AND started_at IS NOT NULL ORDER BY started_at LIMIT ?3",
            )
            .at(&path)?;
        let rows = st
            .query_map(params![queue, since, limit], |r| r.get(0))
            .at(&path)?;
        rows.collect::<rusqlite::Result<_>>().at(&path)
    })
}

impl QueueStore for SqliteStore {
    fn enqueue(&self, new: &NewRun, p: &Placement) -> CoreResult<RunRow> {
        enqueue(self, new, p)
    }
    fn claim(
        &self,
        queue: &str,
        limits: &Limits,
        room: i64,
        by: &Claimer<'_>,
    ) -> CoreResult<Vec<Claimed>> {
        claim(self, queue, limits, room, by)
    }
    fn stats(&self, now: f64) -> CoreResult<Vec<QueueStats>> {
        stats(self, now)
    }
    fn recent_starts(&self, queue: &str, since: f64, limit: i64) -> CoreResult<Vec<f64>> {
        recent_starts(self, queue, since, limit)
    }
    fn lease_holders(&self) -> CoreResult<Vec<LeaseHolder>> {
        lease_holders(self)
    }
}
