//! The queues on PostgreSQL. A claim picks rows `FOR UPDATE SKIP LOCKED`,
//! so concurrent workers take different runs without waiting on each
//! other; when a global concurrency or a rate limit must be counted, the
//! count and the claim run under a transaction-scoped advisory lock of the
//! queue, so two workers never both fill the last slot.

use crate::error::{CoreError, CoreResult};
use crate::runtime::block_on;
use crate::store::postgres::inner::{insert_run_err, PgStore};
use crate::store::queue::{
    allowance, claim_order, dedup_taken, window, Claimed, Claimer, LeaseHolder, Limits, Placement,
    QueueStats, QueueStore,
};
use crate::store::{NewRun, RunRow};
use crate::time::now;

/// The advisory lock key of a queue (per schema: schemas are separate
/// stores on one server).
fn lock_key(s: &PgStore, queue: &str) -> String {
    format!("composeai.queue.{}.{queue}", s.schema())
}

pub fn enqueue(s: &PgStore, new: &NewRun, p: &Placement) -> CoreResult<RunRow> {
    let t = now();
    let rid: i64 = block_on(async {
        let mut c = s.client().await?;
        let tx = c.transaction().await.map_err(s.err())?;
        if let Some(d) = &p.dedup_id {
            // Serializes enqueues of one dedup id, so two cannot both pass
            // the check below.
            tx.execute(
                "SELECT pg_advisory_xact_lock(hashtext($1))",
                &[&format!("{}.dedup.{d}", lock_key(s, &p.queue))],
            )
            .await
            .map_err(s.err())?;
            let held = tx
                .query_opt(
                    "SELECT r.run_id, r.status FROM queue_runs q JOIN runs r ON r.rid = q.rid \
                     WHERE q.queue = $1 AND q.dedup_id = $2 \
                     AND r.status IN ('queued', 'running') LIMIT 1",
                    &[&p.queue, d],
                )
                .await
                .map_err(s.err())?;
            if let Some(row) = held {
                return Err(dedup_taken(d, &p.queue, row.get(0), row.get(1)));
            }
        }
        let row = tx
            .query_one(
                "WITH r AS (INSERT INTO runs(run_id, kind, name, status, created_at, updated_at, \
                 trace_id, fingerprint, args_json, budget_json, module) \
                 VALUES($1, $2, $3, 'queued', $4, $4, $5, $6, $7, $8, $12) RETURNING rid) \
                 INSERT INTO queue_runs(rid, queue, priority, dedup_id, enqueued_at) \
                 SELECT rid, $9, $10, $11, $4 FROM r RETURNING rid",
                &[
                    &new.run_id,
                    &new.kind,
                    &new.name,
                    &t,
                    &new.trace_id,
                    &new.fingerprint,
                    &new.args_json,
                    &new.budget_json,
                    &p.queue,
                    &p.priority,
                    &p.dedup_id,
                    &new.module,
                ],
            )
            .await
            .map_err(insert_run_err(s, new))?;
        tx.commit().await.map_err(s.err())?;
        Ok::<_, CoreError>(row.get(0))
    })?;
    Ok(RunRow::inserted(new, rid, "queued", t))
}

pub fn claim(
    s: &PgStore,
    queue: &str,
    limits: &Limits,
    room: i64,
    by: &Claimer<'_>,
) -> CoreResult<Vec<Claimed>> {
    let claim_sql = format!(
        "WITH c AS (SELECT q.rid FROM queue_runs q JOIN runs r ON r.rid = q.rid \
           WHERE q.queue = $1 AND q.started_at IS NULL AND r.status = 'queued' \
           AND r.name = ANY($6) \
           ORDER BY {} LIMIT $2 FOR UPDATE OF q, r SKIP LOCKED), \
         u AS (UPDATE runs SET status = 'running', lease_owner = $3, lease_until = $4, \
           updated_at = $5 FROM c WHERE runs.rid = c.rid \
           RETURNING runs.rid, runs.run_id, runs.kind, runs.name) \
         UPDATE queue_runs SET started_at = $5 FROM u WHERE queue_runs.rid = u.rid \
         RETURNING u.run_id, u.kind, u.name, u.rid, queue_runs.priority",
        claim_order(limits)
    );
    block_on(async {
        let mut c = s.client().await?;
        let tx = c.transaction().await.map_err(s.err())?;
        let mut n = room;
        if limits.counted() {
            tx.execute(
                "SELECT pg_advisory_xact_lock(hashtext($1))",
                &[&lock_key(s, queue)],
            )
            .await
            .map_err(s.err())?;
            let counts = tx
                .query_one(
                    "SELECT (SELECT COUNT(*) FROM runs r JOIN queue_runs q ON q.rid = r.rid \
                       WHERE r.status = 'running' AND q.queue = $1 AND $3), \
                     (SELECT COUNT(*) FROM queue_runs WHERE queue = $1 AND started_at > $2 \
                       AND started_at IS NOT NULL AND $4)",
                    &[
                        &queue,
                        &(now() - window(limits)),
                        &limits.concurrency.is_some(),
                        &limits.rate_limit.is_some(),
                    ],
                )
                .await
                .map_err(s.err())?;
            n = allowance(limits, room, counts.get(0), counts.get(1));
        }
        if n == 0 {
            tx.rollback().await.map_err(s.err())?;
            return Ok(Vec::new());
        }
        // Read under the lock: a run settled before the count finished
        // before this claim starts.
        let t = now();
        let rows = tx
            .query(
                &claim_sql,
                &[&queue, &n, &by.owner, &by.lease_until, &t, &by.flows],
            )
            .await
            .map_err(s.err())?;
        tx.commit().await.map_err(s.err())?;
        let mut out: Vec<((i64, i64), Claimed)> = rows
            .iter()
            .map(|r| {
                let rid: i64 = r.get(3);
                let priority: i64 = if limits.priority { r.get(4) } else { 0 };
                (
                    (priority, rid),
                    Claimed {
                        run_id: r.get(0),
                        kind: r.get(1),
                        name: r.get(2),
                    },
                )
            })
            .collect();
        // RETURNING does not keep the pick order: the worker starts runs in
        // the order handed out.
        out.sort_by_key(|(order, _)| *order);
        Ok(out.into_iter().map(|(_, c)| c).collect())
    })
}

pub fn stats(s: &PgStore, t: f64) -> CoreResult<Vec<QueueStats>> {
    block_on(async {
        let c = s.client().await?;
        let rows = c
            .query(
                "SELECT q.queue, \
                   COUNT(*) FILTER (WHERE q.started_at IS NULL AND r.status = 'queued'), \
                   COUNT(*) FILTER (WHERE q.started_at IS NOT NULL AND r.status = 'running'), \
                   COUNT(*) FILTER (WHERE r.status = 'completed' AND r.updated_at >= $1), \
                   MIN(q.enqueued_at) FILTER (WHERE q.started_at IS NULL AND r.status = 'queued') \
                 FROM queue_runs q JOIN runs r ON r.rid = q.rid \
                 GROUP BY q.queue ORDER BY q.queue",
                &[&(t - 3600.0)],
            )
            .await
            .map_err(s.err())?;
        Ok(rows
            .iter()
            .map(|r| QueueStats {
                queue: r.get(0),
                queued: r.get(1),
                running: r.get(2),
                completed_last_hour: r.get(3),
                oldest_queued_at: r.get(4),
            })
            .collect())
    })
}

pub fn lease_holders(s: &PgStore) -> CoreResult<Vec<LeaseHolder>> {
    block_on(async {
        let c = s.client().await?;
        let rows = c
            .query(
                "SELECT lease_owner, COUNT(*), MAX(lease_until) FROM runs \
                 WHERE lease_owner IS NOT NULL AND lease_until IS NOT NULL \
                 GROUP BY lease_owner ORDER BY MAX(lease_until) DESC",
                &[],
            )
            .await
            .map_err(s.err())?;
        Ok(rows
            .iter()
            .map(|r| LeaseHolder {
                owner: r.get(0),
                runs: r.get(1),
                lease_until: r.get(2),
            })
            .collect())
    })
}

pub fn recent_starts(s: &PgStore, queue: &str, since: f64, limit: i64) -> CoreResult<Vec<f64>> {
    block_on(async {
        let c = s.client().await?;
        let rows = c
            .query(
                "SELECT started_at FROM queue_runs WHERE queue = $1 AND started_at > $2 \
                 AND started_at IS NOT NULL ORDER BY started_at LIMIT $3",
                &[&queue, &since, &limit],
            )
            .await
            .map_err(s.err())?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    })
}

impl QueueStore for PgStore {
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
