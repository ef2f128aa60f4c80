//! The durable primitives' and the graph tables on PostgreSQL (STORE-2):
//! schema version 2, `DurableStore` and `GraphTx`, and the store hooks
//! that run graph work inside a run's transactions.
//!
//! Every write an attempt makes is fenced on it still owning the run, in
//! the same statement (the `FENCE` CTE) or the same transaction (a
//! `FOR SHARE` read of the run row first), as the journal is (STORE-11).

use crate::clock;
use crate::error::{CoreError, CoreResult};
use crate::store::durable::{
    wake_reason, CancelOutcome, DueRun, DurableStore, Versions, WaitRow, EPSILON,
};
use crate::store::graph::{GraphTx, GraphWork, Row, Thread};
use crate::store::postgres::inner::{insert_run_err, own_insert, PgInner, PgStore};
use crate::store::postgres::sql::{
    exec, insert_run_params, moved, owner, rows, Params, FENCE, INSERT_RUN, TERMINAL,
};
use crate::store::{LeaseCheck, NewRun, RunRow, Settlement};
use crate::time::now;
use deadpool_postgres::GenericClient;
use serde_json::{json, Value};
use tokio_postgres::types::ToSql;

/// OPS-1: the code-version filter of the due queries on runs `r`: `$n`
/// and `$f` the flow names and fingerprints of a `Versions` (parallel
/// arrays), `$m` its mode. `f` is the fingerprint listed for a flow run's
/// name.
macro_rules! pg_version_filter {
    ($n:literal, $f:literal, $m:literal) => {
        concat!(
            " AND (",
            $m,
            "::int = 0 OR (",
            $m,
            "::int = 1 AND COALESCE((SELECT v.fp FROM \
             unnest(",
            $n,
            "::text[], ",
            $f,
            "::text[]) v(name, fp) WHERE v.name = r.name \
             AND r.kind = 'flow' LIMIT 1) = r.fingerprint, true)) OR (",
            $m,
            "::int = 2 \
             AND r.kind = 'flow' AND EXISTS(SELECT 1 FROM unnest(",
            $n,
            "::text[], ",
            $f,
            "::text[]) v(name, fp) WHERE v.name = r.name AND v.fp IS DISTINCT FROM \
             r.fingerprint)))"
        )
    };
}

/// Locks the run row against a takeover for the rest of the transaction;
/// refuses when another attempt owns the run.
async fn fence_tx<C: GenericClient>(store: &PgInner, c: &C, rid: i64) -> CoreResult<()> {
    let found = rows(
        c,
        "SELECT run_id FROM runs WHERE rid = $1 AND lease_owner = $2 \
         FOR SHARE",
        &[&rid, &owner()],
    )
    .await
    .map_err(store.err())?;
    if found.is_empty() {
        return Err(moved(c, rid).await);
    }
    Ok(())
}

impl DurableStore for PgStore {
    fn commit_wait(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        timer: Option<(&str, Option<f64>)>,
    ) -> CoreResult<Option<String>> {
        let (tkey, wake) = match timer {
            Some((k, w)) => (Some(k.to_string()), w),
            None => (None, None),
        };
        let t = now();
        let found = self.retry(async |_| {
            let c = self.client().await?;
            rows(
                &c,
                &format!(
                    "WITH {FENCE}, \
                     j AS (INSERT INTO journal(rid, step_key, value_json) SELECT rid, $3, $4 \
                           FROM f ON CONFLICT DO NOTHING RETURNING 1), \
                     t AS (INSERT INTO timers(rid, step_key, wake_at, created_at) \
                           SELECT rid, $5, $6, $7 FROM f WHERE $5::TEXT IS NOT NULL \
                           ON CONFLICT DO NOTHING RETURNING 1) \
                     SELECT (SELECT run_id FROM f), \
                            (SELECT value_json FROM journal WHERE rid = $1 AND step_key = $3)"
                ),
                &[&rid, &owner(), &key, &value, &tkey, &wake, &t],
            )
            .await
            .map_err(self.err())
        })?;
        let row = &found[0];
        if row.get::<_, Option<String>>(0).is_none() {
            return Err(self.moved_blocking(rid));
        }
        Ok(row.get::<_, Option<String>>(1).filter(|s| s != value))
    }

    fn insert_timer(&self, rid: i64, key: &str, wake_at: Option<f64>) -> CoreResult<()> {
        let t = now();
        let found = self.retry(async |_| {
            let c = self.client().await?;
            rows(
                &c,
                &format!(
                    "WITH {FENCE}, \
                     t AS (INSERT INTO timers(rid, step_key, wake_at, created_at) \
                           SELECT rid, $3, $4, $5 FROM f ON CONFLICT DO NOTHING RETURNING 1) \
                     SELECT (SELECT run_id FROM f)"
                ),
                &[&rid, &owner(), &key, &wake_at, &t],
            )
            .await
            .map_err(self.err())
        })?;
        if found[0].get::<_, Option<String>>(0).is_none() {
            return Err(self.moved_blocking(rid));
        }
        Ok(())
    }

    fn take_timer(&self, rid: i64, key: &str) -> CoreResult<Option<f64>> {
        let found = self.retry(async |_| {
            let c = self.client().await?;
            rows(
                &c,
                &format!(
                    "WITH {FENCE}, \
                     d AS (DELETE FROM timers WHERE rid IN (SELECT rid FROM f) \
                           AND step_key = $3 RETURNING created_at) \
                     SELECT (SELECT run_id FROM f), (SELECT created_at FROM d)"
                ),
                &[&rid, &owner(), &key],
            )
            .await
            .map_err(self.err())
        })?;
        let row = &found[0];
        if row.get::<_, Option<String>>(0).is_none() {
            return Err(self.moved_blocking(rid));
        }
        Ok(row.get(1))
    }

    fn signal_at(&self, rid: i64, name: &str, seq: i64) -> CoreResult<Option<String>> {
        self.retry(async |_| {
            let c = self.client().await?;
            rows(
                &c,
                "SELECT value_json FROM signals WHERE rid = $1 AND name = $2 AND seq = $3",
                &[&rid, &name, &seq],
            )
            .await
            .map_err(self.err())
            .map(|r| r.first().map(|r| r.get(0)))
        })
    }

    fn signals_after(&self, rid: i64, name: &str, seq: i64) -> CoreResult<Vec<(i64, String)>> {
        self.retry(async |_| {
            let c = self.client().await?;
            rows(
                &c,
                "SELECT seq, value_json FROM signals WHERE rid = $1 AND name = $2 AND seq > $3 \
                 ORDER BY seq",
                &[&rid, &name, &seq],
            )
            .await
            .map_err(self.err())
            .map(|r| r.iter().map(|r| (r.get(0), r.get(1))).collect())
        })
    }

    fn last_signal_id(&self, rid: i64) -> CoreResult<i64> {
        self.retry(async |_| {
            let c = self.client().await?;
            rows(
                &c,
                "SELECT COALESCE(MAX(sid), 0) FROM signals WHERE rid = $1",
                &[&rid],
            )
            .await
            .map_err(self.err())
            .map(|r| r[0].get(0))
        })
    }

    fn send_signal(&self, run_id: &str, name: &str, value_json: &str) -> CoreResult<i64> {
        let t = now();
        let seq = self.retry(async |retry| {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(self.err())?;
            // The row lock orders concurrent senders of one run.
            let (rid, status) = find_run(self, &tx, run_id).await?;
            if retry {
                // The earlier try may have committed: the signal is found by
                // its time, never sent twice.
                let sent = rows(
                    &tx,
                    "SELECT seq FROM signals WHERE rid = $1 AND name = $2 AND created_at = $3 \
                     AND value_json = $4",
                    &[&rid, &name, &t, &value_json],
                )
                .await
                .map_err(self.err())?;
                if let Some(r) = sent.first() {
                    return Ok(r.get(0));
                }
            }
            if TERMINAL.contains(&status.as_str()) {
                return Err(CoreError::Config(format!(
                    "run '{run_id}' is {status} -- signals are accepted only by a run that has \
                     not finished"
                )));
            }
            let seq: i64 = rows(
                &tx,
                "INSERT INTO signals(rid, name, seq, value_json, created_at) \
                 SELECT $1, $2, COALESCE(MAX(seq), 0) + 1, $3, $4 FROM signals \
                 WHERE rid = $1 AND name = $2 RETURNING seq",
                &[&rid, &name, &value_json, &t],
            )
            .await
            .map_err(self.err())?[0]
                .get(0);
            tx.commit().await.map_err(self.err())?;
            Ok(seq)
        })?;
        clock::poke();
        Ok(seq)
    }

    fn request_cancel(
        &self,
        run_id: &str,
        reason: Option<&str>,
        live: LeaseCheck<'_>,
    ) -> CoreResult<CancelOutcome> {
        let outcome = self.retry(async |_| {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(self.err())?;
            let (rid, status) = find_run(self, &tx, run_id).await?;
            let outcome = match status.as_str() {
                "cancelled" => CancelOutcome::AlreadyCancelled,
                "completed" | "failed" => {
                    return Err(CoreError::Config(format!(
                        "run '{run_id}' is {status} -- only a run that has not finished can be \
                         cancelled"
                    )))
                }
                _ => {
                    let row = &rows(
                        &tx,
                        "SELECT lease_owner, lease_until FROM runs WHERE rid = $1",
                        &[&rid],
                    )
                    .await
                    .map_err(self.err())?[0];
                    let holder: Option<String> = row.get(0);
                    let until: Option<f64> = row.get(1);
                    let t = now();
                    if holder.is_some_and(|h| live(&h, until.unwrap_or(0.0))) {
                        exec(
                            &tx,
                            "INSERT INTO cancel_requests(rid, reason, created_at) \
                             VALUES($1, $2, $3) ON CONFLICT (rid) DO UPDATE SET \
                             reason = EXCLUDED.reason, created_at = EXCLUDED.created_at",
                            &[&rid, &reason, &t],
                        )
                        .await
                        .map_err(self.err())?;
                        CancelOutcome::Requested
                    } else {
                        let error = json!({
                            "type": "CancelledError",
                            "message": reason.unwrap_or("cancelled"),
                        })
                        .to_string();
                        exec(
                            &tx,
                            "UPDATE runs SET status = 'cancelled', error_json = $1, \
                             updated_at = $2, lease_owner = NULL, lease_until = NULL \
                             WHERE rid = $3",
                            &[&error, &t, &rid],
                        )
                        .await
                        .map_err(self.err())?;
                        for sql in [
                            "DELETE FROM pending_interrupts WHERE rid = $1",
                            "DELETE FROM waits WHERE rid = $1",
                            "DELETE FROM timers WHERE rid = $1",
                            "DELETE FROM cancel_requests WHERE rid = $1",
                        ] {
                            exec(&tx, sql, &[&rid]).await.map_err(self.err())?;
                        }
                        CancelOutcome::Cancelled
                    }
                }
            };
            tx.commit().await.map_err(self.err())?;
            Ok(outcome)
        })?;
        clock::poke();
        Ok(outcome)
    }

    fn due_runs(
        &self,
        now: f64,
        limit: usize,
        live: LeaseCheck<'_>,
        versions: Versions<'_>,
    ) -> CoreResult<Vec<DueRun>> {
        let now = now + EPSILON;
        let cap = limit as i64;
        let mode = versions.mode();
        let names: Vec<&str> = versions.pairs().iter().map(|p| p.0.as_str()).collect();
        let fps: Vec<&str> = versions.pairs().iter().map(|p| p.1.as_str()).collect();
        let timer_params: [&(dyn ToSql + Sync); 5] = [&now, &cap, &names, &fps, &mode];
        let signal_params: [&(dyn ToSql + Sync); 4] = [&cap, &names, &fps, &mode];
        let leased_params: [&(dyn ToSql + Sync); 3] = [&names, &fps, &mode];
        let (timers, signals, leased) = self.retry(async |_| {
            let c = self.client().await?;
            let timers = rows(
                &c,
                concat!(
                    "SELECT r.run_id, r.kind, r.name, w.module, w.step_key FROM waits w \
                     JOIN runs r ON r.rid = w.rid WHERE w.wake_at IS NOT NULL \
                     AND w.wake_at <= $1 AND r.status = 'paused'",
                    pg_version_filter!("$3", "$4", "$5"),
                    " ORDER BY w.wake_at LIMIT $2"
                ),
                &timer_params,
            );
            let signals = rows(
                &c,
                concat!(
                    "SELECT r.run_id, r.kind, r.name, w.module FROM waits w \
                     JOIN runs r ON r.rid = w.rid \
                     WHERE (w.signal_name IS NOT NULL OR w.after_sid IS NOT NULL) \
                       AND r.status = 'paused' AND (EXISTS(SELECT 1 FROM signals s \
                         WHERE s.rid = w.rid AND s.name = w.signal_name \
                         AND s.seq >= w.signal_seq) \
                       OR EXISTS(SELECT 1 FROM signals s WHERE s.rid = w.rid \
                         AND s.sid > w.after_sid))",
                    pg_version_filter!("$2", "$3", "$4"),
                    " ORDER BY w.rid LIMIT $1"
                ),
                &signal_params,
            );
            let leased = rows(
                &c,
                concat!(
                    "SELECT run_id, kind, name, lease_owner, lease_until FROM runs r \
                     WHERE lease_owner IS NOT NULL AND status IN ('running', 'paused')",
                    pg_version_filter!("$1", "$2", "$3"),
                    " UNION ALL SELECT run_id, kind, name, lease_owner, lease_until FROM runs r \
                     WHERE status = 'running' AND lease_owner IS NULL",
                    pg_version_filter!("$1", "$2", "$3")
                ),
                &leased_params,
            );
            let (t, s, l) = futures_util::join!(timers, signals, leased);
            let e = self.err();
            Ok::<_, CoreError>((t.map_err(&e)?, s.map_err(&e)?, l.map_err(&e)?))
        })?;
        let mut out: Vec<DueRun> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (reason, found) in [("timer", timers), ("signal", signals)] {
            for r in found {
                let run_id: String = r.get(0);
                if out.len() < limit && seen.insert(run_id.clone()) {
                    out.push(DueRun {
                        run_id,
                        kind: r.get(1),
                        name: r.get(2),
                        reason: if reason == "timer" {
                            wake_reason(r.get::<_, &str>(4))
                        } else {
                            reason
                        },
                        module: r.get(3),
                    });
                }
            }
        }
        for r in leased {
            if out.len() >= limit {
                break;
            }
            let holder: Option<String> = r.get(3);
            let until: Option<f64> = r.get(4);
            if holder.is_some_and(|h| live(&h, until.unwrap_or(0.0))) {
                continue;
            }
            let run_id: String = r.get(0);
            if seen.insert(run_id.clone()) {
                out.push(DueRun {
                    run_id,
                    kind: r.get(1),
                    name: r.get(2),
                    reason: "recovered",
                    module: None,
                });
            }
        }
        Ok(out)
    }

    fn next_wake(&self, after: f64) -> CoreResult<Option<f64>> {
        self.retry(async |_| {
            let c = self.client().await?;
            rows(&c, crate::store::durable::NEXT_WAKE, &[&(after + EPSILON)])
                .await
                .map_err(self.err())
                .map(|r| r[0].get(0))
        })
    }

    fn expire_runs(
        &self,
        now: f64,
        error_of: crate::store::durable::DeadlineError<'_>,
    ) -> CoreResult<Vec<String>> {
        // A retry after a lost commit reply finds those runs failed already.
        let expired = self.retry(async |_| {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(self.err())?;
            // Workers expiring at once each take the rows no other holds.
            let due = rows(
                &tx,
                &format!(
                    "{} FOR UPDATE SKIP LOCKED",
                    crate::store::durable::EXPIRED_RUNS
                ),
                &[&(now + EPSILON)],
            )
            .await
            .map_err(self.err())?;
            let t = crate::time::now();
            let mut ids = Vec::with_capacity(due.len());
            for row in &due {
                let (rid, run_id, name, deadline): (i64, String, String, f64) =
                    (row.get(0), row.get(1), row.get(2), row.get(3));
                exec(
                    &tx,
                    "UPDATE runs SET status = 'failed', error_json = $1, updated_at = $2, \
                     lease_owner = NULL, lease_until = NULL WHERE rid = $3",
                    &[&error_of(&name, &run_id, deadline), &t, &rid],
                )
                .await
                .map_err(self.err())?;
                for sql in [
                    "DELETE FROM pending_interrupts WHERE rid = $1",
                    "DELETE FROM waits WHERE rid = $1",
                    "DELETE FROM timers WHERE rid = $1",
                    "DELETE FROM cancel_requests WHERE rid = $1",
                ] {
                    exec(&tx, sql, &[&rid]).await.map_err(self.err())?;
                }
                ids.push(run_id);
            }
            tx.commit().await.map_err(self.err())?;
            Ok::<_, CoreError>(ids)
        })?;
        if !expired.is_empty() {
            clock::poke();
        }
        Ok(expired)
    }

    fn parked_wait(&self, run_id: &str) -> CoreResult<Option<WaitRow>> {
        self.retry(async |_| {
            let c = self.client().await?;
            rows(
                &c,
                "SELECT w.step_key, w.wake_at, w.signal_name, w.signal_seq, w.after_sid, \
                 w.module FROM waits w JOIN runs r ON r.rid = w.rid \
                 WHERE r.run_id = $1 AND r.status = 'paused'",
                &[&run_id],
            )
            .await
            .map_err(self.err())
            .map(|r| {
                r.first().map(|r| WaitRow {
                    step_key: r.get(0),
                    wake_at: r.get(1),
                    signal_name: r.get(2),
                    signal_seq: r.get(3),
                    after_sid: r.get(4),
                    module: r.get(5),
                })
            })
        })
    }

    fn change_marker(&self) -> CoreResult<i64> {
        // Any commit on the server moves the WAL insert position.
        self.retry(async |_| {
            let c = self.client().await?;
            rows(
                &c,
                "SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::BIGINT",
                &[],
            )
            .await
            .map_err(self.err())
            .map(|r| r[0].get(0))
        })
    }

    fn release_leases(&self, owner: &str) -> CoreResult<usize> {
        self.retry(async |_| {
            let c = self.client().await?;
            exec(
                &c,
                "UPDATE runs SET status = 'running', lease_owner = NULL, lease_until = NULL \
                 WHERE lease_owner = $1",
                &[&owner],
            )
            .await
            .map_err(self.err())
            .map(|n| n as usize)
        })
    }
}

/// The run's `(rid, status)`, its row locked for the transaction.
async fn find_run<C: GenericClient>(
    store: &PgInner,
    c: &C,
    run_id: &str,
) -> CoreResult<(i64, String)> {
    rows(
        c,
        "SELECT rid, status FROM runs WHERE run_id = $1 FOR UPDATE",
        &[&run_id],
    )
    .await
    .map_err(store.err())?
    .first()
    .map(|r| (r.get(0), r.get(1)))
    .ok_or_else(|| CoreError::Config(format!("no run found with run_id '{run_id}'")))
}

// ---------------------------------------------------------------------------
// Graph tables

/// The graph tables on one client or transaction of the store.
pub(super) struct PgGraph<'a, C: GenericClient> {
    pub(super) c: &'a C,
    pub(super) store: &'a PgInner,
}

const ROW_COLUMNS: &str = "checkpoint_id, thread_id, rid, parent_id, version, source, status, \
     run_id, step, created_at_ms, delta_json, snapshot_json, meta_json";

const THREAD_COLUMNS: &str = "t.thread_id, t.graph, t.fingerprint, \
     (SELECT c.checkpoint_id FROM graph_checkpoints c WHERE c.thread_id = t.thread_id \
      ORDER BY c.version DESC LIMIT 1), \
     coalesce((SELECT c.version FROM graph_checkpoints c WHERE c.thread_id = t.thread_id \
      ORDER BY c.version DESC LIMIT 1), 0), \
     t.status, t.run_id, t.owner, t.created_at_ms, t.updated_at_ms";

fn read_row(r: &tokio_postgres::Row) -> Row {
    Row {
        checkpoint_id: r.get(0),
        thread_id: r.get(1),
        rid: r.get(2),
        parent_id: r.get(3),
        version: r.get(4),
        source: r.get(5),
        status: r.get(6),
        run_id: r.get(7),
        step: r.get(8),
        created_at_ms: r.get(9),
        delta_json: r.get(10),
        snapshot_json: r.get(11),
        meta_json: r.get(12),
    }
}

fn read_thread(r: &tokio_postgres::Row) -> Thread {
    Thread {
        thread_id: r.get(0),
        graph: r.get(1),
        fingerprint: r.get(2),
        head: r.get(3),
        version: r.get(4),
        status: r.get(5),
        run_id: r.get(6),
        owner: r.get(7),
        created_at_ms: r.get(8),
        updated_at_ms: r.get(9),
        chain: None,
    }
}

fn now_ms() -> i64 {
    crate::store::graph::now_ms()
}

impl<C: GenericClient> PgGraph<'_, C> {
    pub(super) fn query(&self, sql: &str, p: &Params<'_>) -> CoreResult<Vec<tokio_postgres::Row>> {
        self.store
            .bounded_blocking(async { rows(self.c, sql, p).await.map_err(self.store.err()) })
    }

    pub(super) fn run(&self, sql: &str, p: &Params<'_>) -> CoreResult<u64> {
        self.store
            .bounded_blocking(async { exec(self.c, sql, p).await.map_err(self.store.err()) })
    }
}

impl<C: GenericClient> GraphTx for PgGraph<'_, C> {
    fn insert(&self, r: &Row) -> CoreResult<()> {
        self.run(
            &format!(
                "INSERT INTO graph_checkpoints({ROW_COLUMNS}) \
                 VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) \
                 ON CONFLICT (checkpoint_id) DO NOTHING"
            ),
            &[
                &r.checkpoint_id,
                &r.thread_id,
                &r.rid,
                &r.parent_id,
                &r.version,
                &r.source,
                &r.status,
                &r.run_id,
                &r.step,
                &r.created_at_ms,
                &r.delta_json,
                &r.snapshot_json,
                &r.meta_json,
            ],
        )
        .map(|_| ())
    }

    fn get(&self, checkpoint_id: &str) -> CoreResult<Option<Row>> {
        Ok(self
            .query(
                &format!("SELECT {ROW_COLUMNS} FROM graph_checkpoints WHERE checkpoint_id = $1"),
                &[&checkpoint_id],
            )?
            .first()
            .map(read_row))
    }

    fn run_head(&self, rid: i64) -> CoreResult<Option<Row>> {
        Ok(self
            .query(
                &format!(
                    "SELECT {ROW_COLUMNS} FROM graph_checkpoints WHERE rid = $1 \
                     AND thread_id IS NULL ORDER BY version DESC LIMIT 1"
                ),
                &[&rid],
            )?
            .first()
            .map(read_row))
    }

    fn thread(&self, thread_id: &str) -> CoreResult<Option<Thread>> {
        Ok(self
            .query(
                &format!("SELECT {THREAD_COLUMNS} FROM graph_threads t WHERE t.thread_id = $1"),
                &[&thread_id],
            )?
            .first()
            .map(read_thread))
    }

    fn threads(&self, graph: Option<&str>) -> CoreResult<Vec<Thread>> {
        Ok(self
            .query(
                &format!(
                    "SELECT {THREAD_COLUMNS} FROM graph_threads t \
                     WHERE $1::TEXT IS NULL OR t.graph = $1 \
                     ORDER BY t.updated_at_ms DESC, t.thread_id"
                ),
                &[&graph],
            )?
            .iter()
            .map(read_thread)
            .collect())
    }

    fn upsert_thread(&self, t: &Thread) -> CoreResult<()> {
        self.run(
            "INSERT INTO graph_threads(thread_id, graph, fingerprint, head, version, status, \
             run_id, owner, created_at_ms, updated_at_ms) \
             VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
             ON CONFLICT(thread_id) DO UPDATE SET head = $4, version = $5, status = $6, \
             run_id = $7, owner = $8, updated_at_ms = $10",
            &[
                &t.thread_id,
                &t.graph,
                &t.fingerprint,
                &t.head,
                &t.version,
                &t.status,
                &t.run_id,
                &t.owner,
                &t.created_at_ms,
                &t.updated_at_ms,
            ],
        )
        .map(|_| ())
    }

    fn set_head(&self, thread_id: &str, head: &str, version: i64, status: &str) -> CoreResult<()> {
        let release = status != "running";
        self.run(
            "UPDATE graph_threads SET head = $2, version = $3, status = $4, updated_at_ms = $5, \
             owner = CASE WHEN $6 THEN NULL ELSE owner END WHERE thread_id = $1",
            &[&thread_id, &head, &version, &status, &now_ms(), &release],
        )
        .map(|_| ())
    }

    fn set_status(&self, thread_id: &str, status: &str) -> CoreResult<()> {
        self.run(
            "UPDATE graph_threads SET status = $2, owner = NULL, updated_at_ms = $3 \
             WHERE thread_id = $1",
            &[&thread_id, &status, &now_ms()],
        )
        .map(|_| ())
    }

    fn audit(
        &self,
        thread_id: &str,
        actor: Option<&str>,
        action: &str,
        checkpoint_id: Option<&str>,
    ) -> CoreResult<()> {
        self.run(
            "INSERT INTO graph_audit(thread_id, actor, action, checkpoint_id, at_ms) \
             VALUES($1, $2, $3, $4, $5)",
            &[&thread_id, &actor, &action, &checkpoint_id, &now_ms()],
        )
        .map(|_| ())
    }

    fn audit_entries(&self, thread_id: &str, limit: i64) -> CoreResult<Vec<Value>> {
        Ok(self
            .query(
                "SELECT thread_id, actor, action, checkpoint_id, at_ms FROM graph_audit \
                 WHERE thread_id = $1 ORDER BY aid DESC LIMIT $2",
                &[&thread_id, &limit],
            )?
            .iter()
            .map(|r| {
                json!({
                    "thread_id": r.get::<_, String>(0),
                    "actor": r.get::<_, Option<String>>(1),
                    "action": r.get::<_, String>(2),
                    "checkpoint_id": r.get::<_, Option<String>>(3),
                    "at_ms": r.get::<_, i64>(4),
                })
            })
            .collect())
    }

    fn history(&self, thread_id: &str, limit: i64) -> CoreResult<Vec<Row>> {
        Ok(self
            .query(
                &format!(
                    "SELECT {ROW_COLUMNS} FROM graph_checkpoints WHERE thread_id = $1 \
                     ORDER BY version DESC LIMIT $2"
                ),
                &[&thread_id, &limit],
            )?
            .iter()
            .map(read_row)
            .collect())
    }

    fn delete_thread(&self, thread_id: &str) -> CoreResult<bool> {
        self.run(
            "DELETE FROM graph_checkpoints WHERE thread_id = $1",
            &[&thread_id],
        )?;
        Ok(self.run(
            "DELETE FROM graph_threads WHERE thread_id = $1",
            &[&thread_id],
        )? > 0)
    }

    fn prune(&self, before_ms: i64) -> CoreResult<Vec<String>> {
        let ids: Vec<String> = self
            .query(
                "SELECT thread_id FROM graph_threads WHERE updated_at_ms < $1 \
                 AND status != 'running' ORDER BY thread_id",
                &[&before_ms],
            )?
            .iter()
            .map(|r| r.get(0))
            .collect();
        for id in &ids {
            self.delete_thread(id)?;
        }
        Ok(ids)
    }

    fn delete_pending(&self, rid: i64) -> CoreResult<()> {
        self.run("DELETE FROM pending_interrupts WHERE rid = $1", &[&rid])
            .map(|_| ())
    }
}

// ---------------------------------------------------------------------------
// The store hooks that carry graph work

impl PgStore {
    /// One try of a transaction: `body` on a fresh transaction, then the
    /// commit, each statement bounded in time. The graph work it calls is
    /// plain writes of staged rows (checkpoints are keyed by id, so a try
    /// repeated after a lost commit reply stores each once).
    fn in_tx<T>(
        &self,
        body: &mut dyn FnMut(&deadpool_postgres::Transaction<'_>) -> CoreResult<T>,
    ) -> CoreResult<T> {
        let mut c = self.bounded_blocking(self.client())?;
        let tx = self.bounded_blocking(async { c.transaction().await.map_err(self.err()) })?;
        let out = body(&tx)?;
        self.bounded_blocking(async { tx.commit().await.map_err(self.err()) })?;
        Ok(out)
    }

    pub(super) fn create_run_in(
        &self,
        new: &NewRun,
        owner: &str,
        lease_until: f64,
        work: &mut GraphWork<'_>,
        drain: bool,
    ) -> CoreResult<RunRow> {
        let spans = if drain { self.take_spans() } else { Vec::new() };
        let t = now();
        let rid = self.retry_blocking(|retry| {
            self.in_tx(&mut |tx| {
                if retry {
                    if let Some(rid) = self.bounded_blocking(own_insert(self, tx, new))? {
                        return Ok(rid);
                    }
                }
                let row = self.bounded_blocking(async {
                    if retry {
                        self.write_spans_once(tx, &spans).await?;
                    } else {
                        self.write_spans(tx, &spans).await?;
                    }
                    rows(
                        tx,
                        INSERT_RUN,
                        &insert_run_params(new, &t, &owner, &lease_until),
                    )
                    .await
                    .map_err(insert_run_err(self, new))
                })?;
                work(&PgGraph { c: tx, store: self })?;
                Ok(row[0].get(0))
            })
        })?;
        Ok(RunRow::inserted(new, rid, "running", t))
    }

    /// A settlement with `work` in its transaction.
    pub(super) fn settle_in(
        &self,
        rid: i64,
        owner: &str,
        s: &Settlement,
        work: &mut GraphWork<'_>,
    ) -> CoreResult<()> {
        // As on SQLite: the spans are stored when the run returns (OBS-5).
        let spans = self.take_spans();
        let t = now();
        self.retry_blocking(|retry| {
            self.in_tx(&mut |tx| {
                self.bounded_blocking(self.settle_tx(tx, rid, owner, s, &spans, t, retry))?;
                work(&PgGraph { c: tx, store: self })
            })
        })
    }

    pub(super) fn commit_in(
        &self,
        rid: i64,
        entries: &[(String, String)],
        work: &mut GraphWork<'_>,
    ) -> CoreResult<()> {
        // Journal rows are first-write-wins: a repeated try stores each once.
        self.retry_blocking(|_| {
            self.in_tx(&mut |tx| {
                self.bounded_blocking(async {
                    fence_tx(self, tx, rid).await?;
                    let st = tx
                        .prepare_cached(
                            "INSERT INTO journal(rid, step_key, value_json) VALUES($1, $2, $3) \
                             ON CONFLICT DO NOTHING",
                        )
                        .await
                        .map_err(self.err())?;
                    let inserts = entries.iter().map(|(k, v)| {
                        let st = st.clone();
                        async move { tx.execute(&st, &[&rid, k, v]).await }
                    });
                    for r in futures_util::future::join_all(inserts).await {
                        r.map_err(self.err())?;
                    }
                    Ok::<_, CoreError>(())
                })?;
                work(&PgGraph { c: tx, store: self })
            })
        })
    }

    pub(super) fn transact_in(&self, work: &mut GraphWork<'_>) -> CoreResult<()> {
        let spans = self.take_spans();
        self.retry_blocking(|retry| {
            self.in_tx(&mut |tx| {
                self.bounded_blocking(async {
                    if retry {
                        self.write_spans_once(tx, &spans).await
                    } else {
                        self.write_spans(tx, &spans).await
                    }
                })?;
                work(&PgGraph { c: tx, store: self })
            })
        })
    }

    pub(super) fn read_in(&self, work: &mut GraphWork<'_>) -> CoreResult<()> {
        self.retry_blocking(|_| {
            let c = self.bounded_blocking(self.client())?;
            work(&PgGraph { c: &c, store: self })
        })
    }
}
