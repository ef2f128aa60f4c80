//! SQL of the durable tables. Every function takes a connection (or a
//! transaction) of the store, so callers choose the transaction.

use crate::clock;
use crate::error::{AtPath, CoreError, CoreResult};
use crate::store::durable::{wake_reason, CancelOutcome, DueRun, WaitRow, EPSILON};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

const TERMINAL: [&str; 3] = ["completed", "failed", "cancelled"];

/// Called inside the settlement's transaction: the run's `waits` row is
/// replaced by the one it parks on; a terminal run drops every durable row
/// but its signals (kept as history).
pub fn on_settle(
    tx: &Connection,
    rid: i64,
    status: &str,
    wait: Option<&WaitRow>,
) -> rusqlite::Result<()> {
    tx.prepare_cached("DELETE FROM waits WHERE rid = ?1")?
        .execute([rid])?;
    if TERMINAL.contains(&status) {
        tx.prepare_cached("DELETE FROM timers WHERE rid = ?1")?
            .execute([rid])?;
        tx.prepare_cached("DELETE FROM cancel_requests WHERE rid = ?1")?
            .execute([rid])?;
        return Ok(());
    }
    if let (Some(w), "paused") = (wait, status) {
        tx.prepare_cached(
            "INSERT INTO waits(rid, step_key, wake_at, signal_name, signal_seq, after_sid, module) \
             VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?
        .execute(params![
            rid,
            w.step_key,
            w.wake_at,
            w.signal_name,
            w.signal_seq,
            w.after_sid,
            w.module
        ])?;
    }
    Ok(())
}

/// Called when an attempt takes the lease: the run is no longer parked,
/// and its replay decides its durable waits afresh.
pub fn on_acquire(tx: &Connection, rid: i64) -> rusqlite::Result<()> {
    tx.prepare_cached("DELETE FROM waits WHERE rid = ?1")?
        .execute([rid])?;
    tx.prepare_cached(
        "DELETE FROM pending_interrupts WHERE rid = ?1 AND kind IN ('timer', 'signal')",
    )?
    .execute([rid])
    .map(|_| ())
}

pub fn insert_timer(
    tx: &Connection,
    rid: i64,
    key: &str,
    wake_at: Option<f64>,
) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT OR IGNORE INTO timers(rid, step_key, wake_at, created_at) VALUES(?1, ?2, ?3, ?4)",
    )?
    .execute(params![rid, key, wake_at, crate::time::now()])
    .map(|_| ())
}

/// Removes a satisfied wait's timer; returns when the wait began (wall
/// time), if it had one.
pub fn take_timer(conn: &Connection, rid: i64, key: &str) -> rusqlite::Result<Option<f64>> {
    conn.prepare_cached("DELETE FROM timers WHERE rid = ?1 AND step_key = ?2 RETURNING created_at")?
        .query_row(params![rid, key], |r| r.get(0))
        .optional()
}

pub fn signal_at(
    conn: &Connection,
    rid: i64,
    name: &str,
    seq: i64,
) -> rusqlite::Result<Option<String>> {
    conn.prepare_cached("SELECT value_json FROM signals WHERE rid = ?1 AND name = ?2 AND seq = ?3")?
        .query_row(params![rid, name, seq], |r| r.get(0))
        .optional()
}

/// Signals of `name` after sequence number `seq`, in send order.
pub fn signals_after(
    conn: &Connection,
    rid: i64,
    name: &str,
    seq: i64,
) -> rusqlite::Result<Vec<(i64, String)>> {
    let mut st = conn.prepare_cached(
        "SELECT seq, value_json FROM signals WHERE rid = ?1 AND name = ?2 AND seq > ?3 ORDER BY seq",
    )?;
    let rows = st.query_map(params![rid, name, seq], |r| Ok((r.get(0)?, r.get(1)?)))?;
    rows.collect()
}

pub fn last_signal_id(conn: &Connection, rid: i64) -> rusqlite::Result<i64> {
    conn.prepare_cached("SELECT COALESCE(MAX(sid), 0) FROM signals WHERE rid = ?1")?
        .query_row([rid], |r| r.get(0))
}

/// The reason of a pending cancel request (`Some(None)`: no reason given).
pub fn cancel_request(conn: &Connection, rid: i64) -> rusqlite::Result<Option<Option<String>>> {
    conn.prepare_cached("SELECT reason FROM cancel_requests WHERE rid = ?1")?
        .query_row([rid], |r| r.get(0))
        .optional()
}

fn find_run(tx: &Connection, path: &str, run_id: &str) -> CoreResult<(i64, String)> {
    tx.prepare_cached("SELECT rid, status FROM runs WHERE run_id = ?1")
        .and_then(|mut st| {
            st.query_row([run_id], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .at(path)?
        .ok_or_else(|| CoreError::Config(format!("no run found with run_id '{run_id}'")))
}

/// EXT-3: appends a signal in one commit; returns its sequence number.
pub fn send_signal(
    conn: &mut Connection,
    path: &str,
    run_id: &str,
    name: &str,
    value_json: &str,
) -> CoreResult<i64> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .at(path)?;
    let (rid, status) = find_run(&tx, path, run_id)?;
    if TERMINAL.contains(&status.as_str()) {
        return Err(CoreError::Config(format!(
            "run '{run_id}' is {status} -- signals are accepted only by a run that has not \
             finished"
        )));
    }
    let seq: i64 = tx
        .query_row(
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM signals WHERE rid = ?1 AND name = ?2",
            params![rid, name],
            |r| r.get(0),
        )
        .at(path)?;
    tx.execute(
        "INSERT INTO signals(rid, name, seq, value_json, created_at) VALUES(?1, ?2, ?3, ?4, ?5)",
        params![rid, name, seq, value_json, crate::time::now()],
    )
    .at(path)?;
    tx.commit().at(path)?;
    clock::poke();
    Ok(seq)
}

/// EXT-10: cancels a parked (or orphaned) run at once, else records the
/// request for the attempt executing it.
pub fn request_cancel(
    conn: &mut Connection,
    path: &str,
    run_id: &str,
    reason: Option<&str>,
    live: crate::store::LeaseCheck<'_>,
) -> CoreResult<CancelOutcome> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .at(path)?;
    let (rid, status) = find_run(&tx, path, run_id)?;
    let outcome = match status.as_str() {
        "cancelled" => CancelOutcome::AlreadyCancelled,
        "completed" | "failed" => {
            return Err(CoreError::Config(format!(
                "run '{run_id}' is {status} -- only a run that has not finished can be cancelled"
            )))
        }
        _ => {
            let (holder, until): (Option<String>, Option<f64>) = tx
                .query_row(
                    "SELECT lease_owner, lease_until FROM runs WHERE rid = ?1",
                    [rid],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .at(path)?;
            let executing = holder.is_some_and(|h| live(&h, until.unwrap_or(0.0)));
            if executing {
                tx.execute(
                    "INSERT OR REPLACE INTO cancel_requests(rid, reason, created_at) \
                     VALUES(?1, ?2, ?3)",
                    params![rid, reason, crate::time::now()],
                )
                .at(path)?;
                CancelOutcome::Requested
            } else {
                let error = serde_json::json!({
                    "type": "CancelledError",
                    "message": reason.unwrap_or("cancelled"),
                })
                .to_string();
                tx.execute(
                    "UPDATE runs SET status = 'cancelled', error_json = ?1, updated_at = ?2, \
                     lease_owner = NULL, lease_until = NULL WHERE rid = ?3",
                    params![error, crate::time::now(), rid],
                )
                .at(path)?;
                tx.execute_batch(&format!(
                    "DELETE FROM pending_interrupts WHERE rid = {rid}; \
                     DELETE FROM waits WHERE rid = {rid}; DELETE FROM timers WHERE rid = {rid}; \
                     DELETE FROM cancel_requests WHERE rid = {rid};"
                ))
                .at(path)?;
                CancelOutcome::Cancelled
            }
        }
    };
    tx.commit().at(path)?;
    clock::poke();
    Ok(outcome)
}

/// Runs an attempt may have been executing: leased (running, or a resumed
/// `paused` run), or running without a lease. Read through the partial index
/// `runs_active`.
pub const RECOVERABLE_RUNS: &str = "SELECT run_id, kind, name, lease_owner, lease_until FROM runs \
     WHERE lease_owner IS NOT NULL AND status IN ('running', 'paused') \
     UNION ALL SELECT run_id, kind, name, lease_owner, lease_until FROM runs \
     WHERE status = 'running' AND lease_owner IS NULL";

/// EXT-2: parked runs whose timer passed or whose awaited signal arrived,
/// then runs an attempt was executing whose lease holder is dead (a
/// resumed run keeps its `paused` status while it executes); at most
/// `limit`.
pub fn due_runs(
    conn: &Connection,
    now: f64,
    limit: usize,
    live: crate::store::LeaseCheck<'_>,
) -> rusqlite::Result<Vec<DueRun>> {
    // Wake times are journaled to the microsecond.
    let now = now + EPSILON;
    let mut out: Vec<DueRun> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let cap = limit as i64;
    let parked = [
        (
            "timer",
            "SELECT r.run_id, r.kind, r.name, w.module, w.step_key FROM waits w \
             JOIN runs r ON r.rid = w.rid WHERE w.wake_at IS NOT NULL AND w.wake_at <= ?1 AND r.status = 'paused' \
             ORDER BY w.wake_at LIMIT ?2",
        ),
        (
            "signal",
            "SELECT r.run_id, r.kind, r.name, w.module, w.step_key FROM waits w \
             JOIN runs r ON r.rid = w.rid WHERE (w.signal_name IS NOT NULL OR w.after_sid IS NOT NULL) AND ?1 = ?1 \
               AND r.status = 'paused' AND (EXISTS(SELECT 1 FROM signals s WHERE s.rid = w.rid \
                 AND s.name = w.signal_name AND s.seq >= w.signal_seq) \
               OR EXISTS(SELECT 1 FROM signals s WHERE s.rid = w.rid AND s.sid > w.after_sid)) \
             ORDER BY w.rid LIMIT ?2",
        ),
    ];
    for (reason, sql) in parked {
        let mut st = conn.prepare_cached(sql)?;
        let rows = st.query_map(params![now, cap], |r| {
            let step_key: String = r.get(4)?;
            Ok(DueRun {
                run_id: r.get(0)?,
                kind: r.get(1)?,
                name: r.get(2)?,
                reason: if reason == "timer" {
                    wake_reason(&step_key)
                } else {
                    reason
                },
                module: r.get(3)?,
            })
        })?;
        for row in rows {
            let row = row?;
            if out.len() < limit && seen.insert(row.run_id.clone()) {
                out.push(row);
            }
        }
    }
    let mut st = conn.prepare_cached(RECOVERABLE_RUNS)?;
    let mut rows = st.query([])?;
    while let Some(r) = rows.next()? {
        if out.len() >= limit {
            break;
        }
        let holder: Option<String> = r.get(3)?;
        let until: Option<f64> = r.get(4)?;
        if holder.is_some_and(|h| live(&h, until.unwrap_or(0.0))) {
            continue;
        }
        let run_id: String = r.get(0)?;
        if seen.insert(run_id.clone()) {
            out.push(DueRun {
                run_id,
                kind: r.get(1)?,
                name: r.get(2)?,
                reason: "recovered",
                module: None,
            });
        }
    }
    Ok(out)
}

/// The earliest wake time of a parked run after `after`.
pub fn next_wake(conn: &Connection, after: f64) -> rusqlite::Result<Option<f64>> {
    conn.prepare_cached("SELECT MIN(wake_at) FROM waits WHERE wake_at > ?1")?
        .query_row([after + EPSILON], |r| r.get(0))
}

/// What a parked run waits for.
pub fn parked_wait(conn: &Connection, run_id: &str) -> rusqlite::Result<Option<WaitRow>> {
    conn.prepare_cached(
        "SELECT w.step_key, w.wake_at, w.signal_name, w.signal_seq, w.after_sid, w.module \
         FROM waits w JOIN runs r ON r.rid = w.rid WHERE r.run_id = ?1 AND r.status = 'paused'",
    )?
    .query_row([run_id], |r| {
        Ok(WaitRow {
            step_key: r.get(0)?,
            wake_at: r.get(1)?,
            signal_name: r.get(2)?,
            signal_seq: r.get(3)?,
            after_sid: r.get(4)?,
            module: r.get(5)?,
        })
    })
    .optional()
}
