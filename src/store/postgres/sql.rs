//! The statements and row conversions every write path shares: the
//! fence, step and span inserts, run rows.

use crate::error::CoreError;
use crate::ids::{encode_id, StoredId};
use crate::store::durable::WaitRow;
use crate::store::postgres::reachability::is_unreachable;
use crate::store::slot::{FLAG_OUTPUT_IN_JOURNAL, FLAG_REPLAYED};
use crate::store::url::PgUrl;
use crate::store::{AgentStateRow, NewRun, RunRow, SpanRecord};
use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;

/// The fence every journal and snapshot write of an attempt carries: `$1`
/// is the run, `$2` this process's owner id, which must hold the lease. The
/// row is locked against a concurrent takeover. The lock is cheap next to
/// the rest of a step; a shared advisory lock would need a fresh snapshot
/// after it (a PL/pgSQL call per step), which measured slower.
pub(super) const FENCE: &str =
    "f AS (SELECT rid, run_id FROM runs WHERE rid = $1 AND lease_owner = $2 FOR SHARE)";

pub(super) const SPAN_COLUMNS: &str =
    "trace_id, rid, span_id, parent, kind, name, started_at, ended_at, \
     status, flags, step_key, attributes_json, error_json, input_tokens, output_tokens, \
     cache_read_tokens, cache_creation_tokens, reasoning_tokens, cost_usd, cost_complete, \
     input_json, output_json";

pub(super) fn store_err(url: &str) -> impl Fn(tokio_postgres::Error) -> CoreError + '_ {
    move |e| {
        if is_unreachable(&e) {
            CoreError::Unavailable(format!(
                "composeai store '{url}': cannot reach the server ({})",
                describe(&e)
            ))
        } else {
            CoreError::Store(format!("composeai store '{url}': {}", describe(&e)))
        }
    }
}

/// The driver's message with the server's detail, never the password (the
/// driver does not echo connection parameters).
pub(super) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.severity(), db.message()),
        None => {
            let mut s = e.to_string();
            let mut src = std::error::Error::source(e);
            while let Some(inner) = src {
                s.push_str(&format!(": {inner}"));
                src = inner.source();
            }
            s
        }
    }
}

/// A failed connection attempt: an outage unless the server refused the
/// login or the database (a wrong URL is not retried).
pub(super) fn connect_failed(url: &PgUrl, e: &tokio_postgres::Error) -> CoreError {
    let refused = e
        .code()
        .is_some_and(|c| c.code().starts_with("28") || c.code() == "3D000");
    if !refused && is_unreachable(e) {
        return CoreError::Unavailable(format!(
            "composeai store '{}': cannot reach the server ({})",
            url.redacted,
            describe(e)
        ));
    }
    cannot_connect(url, describe(e))
}

/// A failed connection attempt, with what to do when the server refused the
/// TLS that `sslmode` asks for.
pub(super) fn cannot_connect(url: &PgUrl, why: String) -> CoreError {
    let hint = if why.contains("server does not support TLS") {
        " -- the server does not accept TLS connections and the URL's sslmode requires TLS: \
         turn on ssl in the server's configuration, or use sslmode=prefer or sslmode=disable"
    } else {
        ""
    };
    CoreError::Store(format!(
        "composeai store '{}': cannot connect ({why}){hint}",
        url.redacted
    ))
}

/// The error of a write refused because run `rid` moved to another owner.
pub(super) async fn moved<C: GenericClient>(c: &C, rid: i64) -> CoreError {
    let run_id = c
        .query_opt("SELECT run_id FROM runs WHERE rid = $1", &[&rid])
        .await
        .ok()
        .flatten()
        .map_or_else(|| format!("#{rid}"), |r| r.get(0));
    crate::store::takeover::moved(&run_id)
}

pub(super) fn id_bytes(id: &str) -> Vec<u8> {
    match encode_id(id) {
        StoredId::Bytes(b) => b.to_vec(),
        StoredId::Text(t) => t.into_bytes(),
    }
}

/// The parameters of one span row, in `SPAN_COLUMNS` order.
pub(super) struct SpanParams {
    pub(super) trace_id: String,
    pub(super) rid: Option<i64>,
    pub(super) span_id: Vec<u8>,
    pub(super) parent: Option<Vec<u8>>,
    pub(super) kind: String,
    pub(super) name: String,
    pub(super) started_at: f64,
    pub(super) ended_at: Option<f64>,
    pub(super) status: String,
    pub(super) flags: i32,
    pub(super) step_key: Option<String>,
    pub(super) attributes_json: Option<String>,
    pub(super) error_json: Option<String>,
    pub(super) usage: [Option<i64>; 5],
    pub(super) cost_usd: Option<f64>,
    pub(super) cost_complete: Option<bool>,
    pub(super) input_json: Option<String>,
    pub(super) output_json: Option<String>,
}

impl SpanParams {
    pub(super) fn new(rec: SpanRecord) -> SpanParams {
        let s = rec.span;
        let mut flags = 0;
        if s.replayed {
            flags |= FLAG_REPLAYED as i32;
        }
        let output_json = if rec.output_in_journal {
            flags |= FLAG_OUTPUT_IN_JOURNAL as i32;
            None
        } else {
            s.output_json
        };
        let u = s.usage.as_ref();
        SpanParams {
            trace_id: rec.trace_id,
            rid: rec.rid,
            span_id: id_bytes(&s.span_id),
            parent: s.parent_span_id.as_deref().map(id_bytes),
            kind: s.kind,
            name: s.name,
            started_at: s.started_at,
            ended_at: s.ended_at,
            status: s.status,
            flags,
            step_key: s.step_key,
            attributes_json: s.attributes_json,
            error_json: s.error_json,
            usage: [
                u.map(|u| u.input_tokens),
                u.map(|u| u.output_tokens),
                u.map(|u| u.cache_read_tokens),
                u.map(|u| u.cache_creation_tokens),
                u.map(|u| u.reasoning_tokens),
            ],
            cost_usd: u.and_then(|u| u.cost_usd),
            cost_complete: u.map(|u| u.cost_complete),
            input_json: s.input_json,
            output_json,
        }
    }

    pub(super) fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        vec![
            &self.trace_id,
            &self.rid,
            &self.span_id,
            &self.parent,
            &self.kind,
            &self.name,
            &self.started_at,
            &self.ended_at,
            &self.status,
            &self.flags,
            &self.step_key,
            &self.attributes_json,
            &self.error_json,
            &self.usage[0],
            &self.usage[1],
            &self.usage[2],
            &self.usage[3],
            &self.usage[4],
            &self.cost_usd,
            &self.cost_complete,
            &self.input_json,
            &self.output_json,
        ]
    }
}

/// `$first, $first+1, …` for the span columns.
pub(super) fn span_placeholders(first: usize) -> String {
    (first..first + 22)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A journaled step: fenced (`FENCE`), first write wins, its identity at
/// `$5` (issue 27), with the step's span row (`$6…`) in the same statement
/// when `with_span`. Returns the run
/// id (none: the run moved) and, only when an earlier write won, the stored
/// value. Built once: a step is the hot path.
pub(super) fn step_sql(with_span: bool) -> &'static str {
    static SQL: std::sync::OnceLock<[String; 2]> = std::sync::OnceLock::new();
    &SQL.get_or_init(|| step_sqls(""))[usize::from(with_span)]
}

/// `step_sql` whose span row is left out when a span with its id is
/// already stored: for a retry that may repeat a committed step.
pub(super) fn step_once_sql(with_span: bool) -> &'static str {
    static SQL: std::sync::OnceLock<[String; 2]> = std::sync::OnceLock::new();
    &SQL.get_or_init(|| step_sqls(&format!(" WHERE {}", span_absent(6))))[usize::from(with_span)]
}

/// `[bare, with span]` step statements; `span_filter` guards the span row.
pub(super) fn step_sqls(span_filter: &str) -> [String; 2] {
    let sql = |span: &str| {
        format!(
            "WITH {FENCE}, \
             j AS (INSERT INTO journal(rid, step_key, value_json, ident) \
                   SELECT rid, $3, $4, $5 FROM f ON CONFLICT DO NOTHING RETURNING 1){span} \
             SELECT (SELECT run_id FROM f), CASE WHEN EXISTS (SELECT 1 FROM j) THEN NULL \
                    ELSE (SELECT value_json FROM journal WHERE rid = $1 AND step_key = $3) END"
        )
    };
    [
        sql(""),
        sql(&format!(
            ", s AS (INSERT INTO spans({SPAN_COLUMNS}) SELECT {} FROM f{span_filter})",
            span_placeholders(6)
        )),
    ]
}

/// No span row with the id of the span whose columns start at `$first` is
/// stored. There is no unique index on span ids (schema 4): the trace's
/// index finds them, at a cost in the trace's spans that only a retry pays.
pub(super) fn span_absent(first: usize) -> String {
    format!(
        "NOT EXISTS (SELECT 1 FROM spans WHERE trace_id = ${first} AND span_id = ${})",
        first + 2
    )
}

/// Inserts a span unless another owner holds its run, or the run was
/// released after this process's lease of it was taken over (spans of no
/// run are always written; those of a run this process settled may trail).
pub(super) fn span_insert_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| span_insert_sqls(""))
}

/// `span_insert_sql` that stores nothing when the span is stored already.
pub(super) fn span_insert_once_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| span_insert_sqls(&format!(" AND {}", span_absent(1))))
}

pub(super) fn span_insert_sqls(filter: &str) -> String {
    format!(
        "INSERT INTO spans({SPAN_COLUMNS}) SELECT {} WHERE ($2::BIGINT IS NULL OR EXISTS (\
         SELECT 1 FROM runs WHERE rid = $2 AND (lease_owner = $23 OR (lease_owner IS NULL \
         AND NOT EXISTS (SELECT 1 FROM lease_takeovers t WHERE t.rid = $2 AND t.owner = $23))))){filter}",
        span_placeholders(1)
    )
}

pub(super) fn owner() -> &'static str {
    crate::owner::owner_id()
}

/// A run row read with `RUN_COLUMNS` first.
pub(super) fn read_run(r: &tokio_postgres::Row) -> RunRow {
    RunRow {
        rid: r.get(0),
        run_id: r.get(1),
        kind: r.get(2),
        name: r.get(3),
        status: r.get(4),
        created_at: r.get(5),
        updated_at: r.get(6),
        trace_id: r.get(7),
        fingerprint: r.get(8),
        args_json: r.get(9),
        output_json: r.get(10),
        error_json: r.get(11),
        budget_json: r.get(12),
        deadline: None,
        module: r.get(13),
    }
}

pub(super) const RUN_COLUMNS: &str =
    "rid, run_id, kind, name, status, created_at, updated_at, trace_id, \
     fingerprint, args_json, output_json, error_json, budget_json, module";

/// Inserts a `running` run held by `$9` until `$10`, returning its rid;
/// `INSERT_RUN_PARAMS` are its parameters.
pub(super) const INSERT_RUN: &str = "INSERT INTO runs(run_id, kind, name, status, created_at, \
     updated_at, trace_id, fingerprint, args_json, budget_json, lease_owner, lease_until, \
     deadline, module) VALUES($1, $2, $3, 'running', $4, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
     RETURNING rid";

/// `INSERT_RUN` that inserts nothing (and returns no row) when the run id
/// is taken (OPS-10).
pub(super) const INSERT_RUN_KEYED: &str = "INSERT INTO runs(run_id, kind, name, status, \
     created_at, updated_at, trace_id, fingerprint, args_json, budget_json, lease_owner, \
     lease_until, deadline, module) \
     VALUES($1, $2, $3, 'running', $4, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
     ON CONFLICT (run_id) DO NOTHING RETURNING rid";

/// The parameters of `INSERT_RUN`.
pub(super) fn insert_run_params<'a>(
    new: &'a NewRun,
    t: &'a f64,
    owner: &'a &str,
    lease_until: &'a f64,
) -> [&'a (dyn ToSql + Sync); 12] {
    [
        &new.run_id,
        &new.kind,
        &new.name,
        t,
        &new.trace_id,
        &new.fingerprint,
        &new.args_json,
        &new.budget_json,
        owner,
        lease_until,
        &new.deadline,
        &new.module,
    ]
}

pub(super) async fn write_agent_state<C: GenericClient>(
    c: &C,
    rid: i64,
    a: &AgentStateRow,
    at: f64,
) -> Result<u64, tokio_postgres::Error> {
    c.execute(
        &format!(
            "WITH {FENCE} INSERT INTO agent_state(rid, scope_key, messages_json, \
             partial_results_json, turn, updated_at) SELECT rid, $3, $4, $5, $6, $7 FROM f \
             ON CONFLICT (rid, scope_key) DO UPDATE SET messages_json = EXCLUDED.messages_json, \
             partial_results_json = EXCLUDED.partial_results_json, turn = EXCLUDED.turn, \
             updated_at = EXCLUDED.updated_at"
        ),
        &[
            &rid,
            &owner(),
            &a.scope_key,
            &a.messages_json,
            &a.partial_results_json,
            &a.turn,
            &at,
        ],
    )
    .await
}

/// In a settlement's transaction: the run's `waits` row is replaced by the
/// one it parks on; a terminal run drops every durable row but its signals.
pub(super) async fn on_settle<C: GenericClient>(
    c: &C,
    rid: i64,
    status: &str,
    wait: Option<&WaitRow>,
) -> Result<(), tokio_postgres::Error> {
    exec(c, "DELETE FROM waits WHERE rid = $1", &[&rid]).await?;
    if TERMINAL.contains(&status) {
        exec(c, "DELETE FROM timers WHERE rid = $1", &[&rid]).await?;
        exec(c, "DELETE FROM cancel_requests WHERE rid = $1", &[&rid]).await?;
        return Ok(());
    }
    if let (Some(w), "paused") = (wait, status) {
        exec(
            c,
            "INSERT INTO waits(rid, step_key, wake_at, signal_name, signal_seq, after_sid, module) \
             VALUES($1, $2, $3, $4, $5, $6, $7)",
            &[
                &rid,
                &w.step_key,
                &w.wake_at,
                &w.signal_name,
                &w.signal_seq,
                &w.after_sid,
                &w.module,
            ],
        )
        .await?;
    }
    Ok(())
}

/// In an acquiring transaction: the run is no longer parked, and its
/// replay decides its durable waits afresh.
pub(super) async fn on_acquire<C: GenericClient>(
    c: &C,
    rid: i64,
) -> Result<(), tokio_postgres::Error> {
    exec(c, "DELETE FROM waits WHERE rid = $1", &[&rid]).await?;
    exec(
        c,
        "DELETE FROM pending_interrupts WHERE rid = $1 AND kind IN ('timer', 'signal')",
        &[&rid],
    )
    .await
    .map(|_| ())
}

/// The durable rows deleted with a run.
pub(super) const DELETE_DURABLE: [&str; 3] = [
    "DELETE FROM timers WHERE rid = $1",
    "DELETE FROM signals WHERE rid = $1",
    "DELETE FROM waits WHERE rid = $1",
];

pub(super) const TERMINAL: [&str; 3] = ["completed", "failed", "cancelled"];

pub(super) type Params<'a> = [&'a (dyn ToSql + Sync)];

pub(super) async fn rows<C: GenericClient>(
    c: &C,
    sql: &str,
    p: &Params<'_>,
) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    let st = c.prepare_cached(sql).await?;
    c.query(&st, p).await
}

pub(super) async fn exec<C: GenericClient>(
    c: &C,
    sql: &str,
    p: &Params<'_>,
) -> Result<u64, tokio_postgres::Error> {
    let st = c.prepare_cached(sql).await?;
    c.execute(&st, p).await
}
