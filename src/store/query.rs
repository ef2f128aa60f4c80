//! Queries behind the `compose` CLI (OBS-30 … OBS-35).
//!
//! Every function takes a connection opened by
//! `sqlite::open_connection` on an existing store. None of them writes the
//! engine's tables; `search_runs` maintains the derived full-text index
//! (`span_fts`), which the engine never reads or writes.

use super::sqlite::{read_pending, read_run_row};
use super::{InterruptRow, RunRow, UsageRow};
use crate::ids::read_id;
use crate::trace::RenderSpan;
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{params, Connection, OptionalExtension, ToSql, Transaction, TransactionBehavior};
use std::collections::HashMap;

const RUN_COLUMNS: &str = "rid, run_id, kind, name, status, created_at, updated_at, trace_id, \
     fingerprint, args_json, output_json, error_json, budget_json";

/// A `runs` row with the usage of its `llm` spans (OBS-31).
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub run: RunRow,
    /// Σ(input + output tokens) over the run's `llm` spans.
    pub tokens: i64,
    /// Σ of the non-null `cost_usd`; `None` when no call was priced.
    pub cost_usd: Option<f64>,
    /// Every `llm` span's cost is complete (true when there are none).
    pub cost_complete: bool,
}

/// Filters of `compose runs`.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    pub status: Option<String>,
    pub kind: Option<String>,
    /// Keeps runs with `created_at >= since` (Unix seconds).
    pub since: Option<f64>,
    /// Keeps runs listed after the run `(created_at, run_id)` in the
    /// newest-first order: the next page of a listing.
    pub before: Option<(f64, String)>,
    pub limit: i64,
}

/// Runs matching `f`, newest first, with their usage.
pub fn list_runs(conn: &Connection, f: &RunFilter) -> rusqlite::Result<Vec<RunSummary>> {
    select_runs(conn, f, None)
}

/// `list_runs`, optionally keeping only the runs owning a span that matches
/// the FTS5 query `matching` (the index must be current, see `index_spans`).
fn select_runs(
    conn: &Connection,
    f: &RunFilter,
    matching: Option<&str>,
) -> rusqlite::Result<Vec<RunSummary>> {
    let fts = if matching.is_some() {
        "AND rid IN (SELECT s.rid FROM span_fts JOIN spans s ON s.sid = span_fts.rowid \
         WHERE span_fts MATCH ?5)"
    } else {
        "AND ?5 IS NULL"
    };
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs \
         WHERE (?1 IS NULL OR status = ?1) AND (?2 IS NULL OR kind = ?2) \
           AND (?3 IS NULL OR created_at >= ?3) {fts} \
           AND (?6 IS NULL OR created_at < ?6 OR (created_at = ?6 \
             AND rid < (SELECT b.rid FROM runs b WHERE b.run_id = ?7))) \
         ORDER BY created_at DESC, rid DESC LIMIT ?4"
    );
    let (before_at, before_id) = f.before.clone().unzip();
    let runs: Vec<RunRow> = conn
        .prepare_cached(&sql)?
        .query_map(
            params![
                f.status,
                f.kind,
                f.since,
                f.limit.max(0),
                matching,
                before_at,
                before_id
            ],
            read_run_row,
        )?
        .collect::<rusqlite::Result<_>>()?;
    runs.into_iter()
        .map(|run| {
            let (tokens, cost_usd, cost_complete) = run_usage(conn, &run)?;
            Ok(RunSummary {
                run,
                tokens,
                cost_usd,
                cost_complete,
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Full-text search (`compose runs -q`, OBS-31)
// ---------------------------------------------------------------------------

/// The derived full-text index. `span_fts` is contentless (the text lives in
/// `spans`/`journal` already): its rowid is `spans.sid`, `name` the span name
/// and `content` the input JSON and output JSON joined by a space.
/// `span_fts_state` remembers the last indexed span (its sid and id), so each
/// search indexes only what was written since. The engine never touches
/// either table; they are created on first use by `compose runs -q`.
const FTS_SCHEMA: &str = "\
    CREATE VIRTUAL TABLE IF NOT EXISTS span_fts USING fts5(name, content, content=''); \
    CREATE TABLE IF NOT EXISTS span_fts_state(\
        id INTEGER PRIMARY KEY CHECK (id = 1), \
        last_sid INTEGER NOT NULL, \
        last_span_id BLOB\
    );";

/// Spans indexed per transaction, so a first search over a large store does
/// not hold the write lock for long.
const FTS_BATCH: i64 = 5000;

/// SQL for a span's output JSON: the column, or the journal value it
/// references (`FLAG_OUTPUT_IN_JOURNAL`).
const OUTPUT_JSON: &str = "CASE WHEN s.flags & 2 THEN (SELECT j.value_json FROM journal j \
     WHERE j.rid = s.rid AND j.step_key = s.step_key) ELSE s.output_json END";

/// Why `search_runs` did not return rows.
#[derive(Debug)]
pub enum SearchError {
    /// FTS5 is not compiled into this SQLite.
    Unavailable,
    /// The query is not valid FTS5 syntax: SQLite's message.
    Syntax(String),
    Sql(rusqlite::Error),
}

impl From<rusqlite::Error> for SearchError {
    fn from(e: rusqlite::Error) -> Self {
        SearchError::Sql(e)
    }
}

impl std::fmt::Display for SearchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SearchError::Unavailable => f.write_str("FTS5 is not available"),
            SearchError::Syntax(m) => f.write_str(m),
            SearchError::Sql(e) => write!(f, "{e}"),
        }
    }
}

fn is_missing_fts5(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(_, Some(m)) if m.contains("no such module"))
}

/// The stored id of a span as bytes (a 16-byte ULID blob or legacy text).
fn id_bytes(v: ValueRef<'_>) -> Option<Vec<u8>> {
    match v {
        ValueRef::Blob(b) | ValueRef::Text(b) => Some(b.to_vec()),
        _ => None,
    }
}

/// Brings `span_fts` up to date with `spans`: indexes every span written
/// since the last call, in batches of `FTS_BATCH` (one transaction each,
/// index and watermark together). Returns `false` when FTS5 is unavailable.
///
/// Spans are never updated, only inserted and (with their run) deleted, and
/// `sid` only grows while the highest row exists. So the index is current
/// when it holds every span above the watermark, unless the watermark span
/// itself is gone or replaced (its run was deleted, and SQLite may hand its
/// sid to a new span): then the index is rebuilt from scratch. Entries of
/// other deleted spans stay behind; searches join `spans`, so they never
/// match.
pub fn index_spans(conn: &Connection) -> rusqlite::Result<bool> {
    loop {
        let tx = Transaction::new_unchecked(conn, TransactionBehavior::Immediate)?;
        match tx.execute_batch(FTS_SCHEMA) {
            Err(e) if is_missing_fts5(&e) => return Ok(false),
            other => other?,
        }
        let state: Option<(i64, Option<Vec<u8>>)> = tx
            .query_row(
                "SELECT last_sid, last_span_id FROM span_fts_state WHERE id = 1",
                [],
                |r| Ok((r.get(0)?, id_bytes(r.get_ref(1)?))),
            )
            .optional()?;
        let mut from = 0;
        if let Some((last_sid, last_id)) = &state {
            let current: Option<Option<Vec<u8>>> = tx
                .query_row(
                    "SELECT span_id FROM spans WHERE sid = ?1",
                    [*last_sid],
                    |r| Ok(id_bytes(r.get_ref(0)?)),
                )
                .optional()?;
            if current.as_ref() == Some(last_id) {
                from = *last_sid;
            } else {
                tx.execute("INSERT INTO span_fts(span_fts) VALUES('delete-all')", [])?;
            }
        }
        // The last span of this batch.
        let top: Option<(i64, Option<Vec<u8>>)> = tx
            .query_row(
                "SELECT sid, span_id FROM (SELECT sid, span_id FROM spans WHERE sid > ?1 \
                 ORDER BY sid LIMIT ?2) ORDER BY sid DESC LIMIT 1",
                params![from, FTS_BATCH],
                |r| Ok((r.get(0)?, id_bytes(r.get_ref(1)?))),
            )
            .optional()?;
        let Some((to, to_id)) = top else {
            if state.is_some() && from == 0 {
                tx.execute("DELETE FROM span_fts_state", [])?;
            }
            tx.commit()?;
            return Ok(true);
        };
        tx.execute(
            &format!(
                "INSERT INTO span_fts(rowid, name, content) \
                 SELECT sid, name, CASE WHEN input_json IS NULL AND output_json IS NULL \
                   THEN NULL ELSE COALESCE(input_json, '') || ' ' || COALESCE(output_json, '') \
                 END FROM (SELECT s.sid, s.name, s.input_json, {OUTPUT_JSON} AS output_json \
                   FROM spans s WHERE s.sid > ?1 AND s.sid <= ?2)"
            ),
            params![from, to],
        )?;
        tx.execute(
            "INSERT OR REPLACE INTO span_fts_state(id, last_sid, last_span_id) VALUES(1, ?1, ?2)",
            params![to, to_id],
        )?;
        tx.commit()?;
    }
}

/// `list_runs` restricted to the runs owning a span whose name or payload
/// matches the FTS5 query `q` (OBS-31). Indexes new spans first.
pub fn search_runs(
    conn: &Connection,
    f: &RunFilter,
    q: &str,
) -> Result<Vec<RunSummary>, SearchError> {
    if !index_spans(conn)? {
        return Err(SearchError::Unavailable);
    }
    // Parsed on its own first: the run query may never evaluate the MATCH
    // (no run passes the other filters), and a bad query must still fail.
    let probe = conn
        .prepare_cached("SELECT 1 FROM span_fts WHERE span_fts MATCH ?1 LIMIT 1")
        .and_then(|mut st| st.exists([q]));
    probe.map_err(syntax_error)?;
    select_runs(conn, f, Some(q)).map_err(syntax_error)
}

/// A malformed query fails with the generic SQLITE_ERROR code; locking or
/// I/O problems carry their own codes.
fn syntax_error(e: rusqlite::Error) -> SearchError {
    match e {
        rusqlite::Error::SqliteFailure(code, Some(msg)) if code.extended_code == 1 => {
            SearchError::Syntax(msg)
        }
        other => SearchError::Sql(other),
    }
}

/// The spans of the trace `?2` of run `?1`, found through the trace index:
/// under the run's own `-rid`, or under the trace's `traces` row when it
/// has one (written before runs owned their trace, or migrated).
const IN_RUN_TRACE: &str = "s.tid IN (-?1, (SELECT tid FROM traces WHERE trace_id = ?2))";

/// Tokens, cost and completeness over a run's `llm` spans.
///
/// A run's spans are written under its own trace id, so the lookup goes
/// through the indexed trace rather than a scan of every span.
fn run_usage(conn: &Connection, run: &RunRow) -> rusqlite::Result<(i64, Option<f64>, bool)> {
    let Some(trace_id) = run.trace_id.as_deref() else {
        return Ok((0, None, true));
    };
    conn.prepare_cached(&format!(
        "SELECT COALESCE(SUM(COALESCE(s.input_tokens, 0) + COALESCE(s.output_tokens, 0)), 0), \
                SUM(s.cost_usd), COALESCE(MIN(s.cost_complete), 1) \
         FROM spans s WHERE {IN_RUN_TRACE} AND s.rid = ?1 AND s.kind = 'llm'"
    ))?
    .query_row(params![run.rid, trace_id], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)? != 0))
    })
}

/// The outcome of resolving a run id or prefix (OBS-30).
#[derive(Debug, Clone)]
pub enum Resolved {
    Found(Box<RunRow>),
    NotFound,
    /// Several runs share the prefix: their ids, sorted.
    Ambiguous(Vec<String>),
}

/// Text bound as raw bytes (an exclusive upper bound may not be UTF-8).
struct RawText(Vec<u8>);

impl ToSql for RawText {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(ValueRef::Text(&self.0)))
    }
}

/// Resolves `id`: the run with exactly that id, else the single run whose
/// id starts with it (exact, case-sensitive character comparison).
pub fn resolve_run(conn: &Connection, id: &str) -> rusqlite::Result<Resolved> {
    let exact = conn
        .prepare_cached(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?1"))?
        .query_row([id], read_run_row)
        .optional()?;
    if let Some(run) = exact {
        return Ok(Resolved::Found(Box::new(run)));
    }
    // Under the binary collation the ids starting with `id` are exactly
    // those in [id, id || 0xFF): no UTF-8 byte is 0xFF. The range uses the
    // UNIQUE index; `substr` restates the prefix test for clarity.
    let mut upper = id.as_bytes().to_vec();
    upper.push(0xFF);
    let mut ids: Vec<String> = conn
        .prepare_cached(
            "SELECT run_id FROM runs WHERE run_id >= ?1 AND run_id < ?2 \
             AND substr(run_id, 1, ?3) = ?1 ORDER BY run_id",
        )?
        .query_map(
            params![id, RawText(upper), id.chars().count() as i64],
            |r| r.get(0),
        )?
        .collect::<rusqlite::Result<_>>()?;
    match ids.len() {
        0 => Ok(Resolved::NotFound),
        1 => {
            let run_id = ids.pop().unwrap_or_default();
            let run = conn
                .prepare_cached(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?1"))?
                .query_row([&run_id], read_run_row)
                .optional()?;
            Ok(run.map_or(Resolved::NotFound, |r| Resolved::Found(Box::new(r))))
        }
        _ => {
            ids.sort();
            Ok(Resolved::Ambiguous(ids))
        }
    }
}

/// The newest run by `created_at` (`--last`).
pub fn last_run(conn: &Connection) -> rusqlite::Result<Option<RunRow>> {
    conn.prepare_cached(&format!(
        "SELECT {RUN_COLUMNS} FROM runs ORDER BY created_at DESC, rid DESC LIMIT 1"
    ))?
    .query_row([], read_run_row)
    .optional()
}

/// Every stored span of `trace_id`, the trace of run `rid`, ordered by
/// `started_at` then span id.
pub fn trace_spans(
    conn: &Connection,
    rid: i64,
    trace_id: &str,
) -> rusqlite::Result<Vec<RenderSpan>> {
    Ok(read_trace(conn, rid, trace_id, false)?
        .into_iter()
        .map(|s| s.span)
        .collect())
}

/// A stored span with what rendering does not need.
#[derive(Debug, Clone, Default)]
pub struct StoredSpan {
    pub span: RenderSpan,
    /// The run the span belongs to (`None` outside any durable run).
    pub rid: Option<i64>,
    /// The attributes other than `step_key`, encoded.
    pub attributes_json: Option<String>,
    pub input_json: Option<String>,
    /// The output JSON, read from the journal when stored by reference.
    pub output_json: Option<String>,
}

/// Every stored span of `trace_id`, the trace of run `rid`, with its
/// attributes and payloads (the output taken from the journal when stored
/// there), ordered by `started_at` then span id.
pub fn trace_spans_with_payloads(
    conn: &Connection,
    rid: i64,
    trace_id: &str,
) -> rusqlite::Result<Vec<StoredSpan>> {
    read_trace(conn, rid, trace_id, true)
}

fn read_trace(
    conn: &Connection,
    rid: i64,
    trace_id: &str,
    with_payloads: bool,
) -> rusqlite::Result<Vec<StoredSpan>> {
    let payloads = if with_payloads {
        format!("s.rid, s.attributes_json, s.input_json, {OUTPUT_JSON}")
    } else {
        "NULL, NULL, NULL, NULL".to_string()
    };
    let mut st = conn.prepare_cached(&format!(
        "SELECT s.span_id, s.parent, s.kind, s.name, s.started_at, s.ended_at, s.status, \
                s.flags, s.error_json, s.input_tokens, s.output_tokens, s.cache_read_tokens, \
                s.cache_creation_tokens, s.reasoning_tokens, s.cost_usd, s.cost_complete, \
                {payloads} \
         FROM spans s WHERE {IN_RUN_TRACE}"
    ))?;
    let rows = st.query_map(params![rid, trace_id], |r| {
        let flags: i64 = r.get(7)?;
        let error_json: Option<String> = r.get(8)?;
        let (error_type, error_message) = parse_error(error_json.as_deref());
        let input_tokens: Option<i64> = r.get(9)?;
        let output_tokens: Option<i64> = r.get(10)?;
        let cost_usd: Option<f64> = r.get(14)?;
        let cost_complete: Option<i64> = r.get(15)?;
        let has_usage = input_tokens.is_some() || output_tokens.is_some() || cost_usd.is_some();
        let usage = if has_usage {
            Some(UsageRow {
                input_tokens: input_tokens.unwrap_or(0),
                output_tokens: output_tokens.unwrap_or(0),
                cache_read_tokens: r.get::<_, Option<i64>>(11)?.unwrap_or(0),
                cache_creation_tokens: r.get::<_, Option<i64>>(12)?.unwrap_or(0),
                reasoning_tokens: r.get::<_, Option<i64>>(13)?.unwrap_or(0),
                cost_usd,
                cost_complete: cost_complete != Some(0),
            })
        } else {
            None
        };
        Ok(StoredSpan {
            span: RenderSpan {
                span_id: read_id(r.get_ref(0)?).unwrap_or_default(),
                parent_span_id: read_id(r.get_ref(1)?),
                kind: r.get(2)?,
                name: r.get(3)?,
                started_at: r.get(4)?,
                ended_at: r.get(5)?,
                status: r.get(6)?,
                replayed: flags & super::sqlite::FLAG_REPLAYED != 0,
                error_type,
                error_message,
                usage,
            },
            rid: r.get(16)?,
            attributes_json: r.get(17)?,
            input_json: r.get(18)?,
            output_json: r.get(19)?,
        })
    })?;
    let mut spans = rows.collect::<rusqlite::Result<Vec<_>>>()?;
    spans.sort_by(|a, b| {
        a.span
            .started_at
            .total_cmp(&b.span.started_at)
            .then_with(|| a.span.span_id.cmp(&b.span.span_id))
    });
    Ok(spans)
}

/// The `llm` spans of run `run` (in its trace, owned by it), with payloads,
/// ordered by `started_at` then span id (`compose export`, OBS-35).
pub fn run_llm_spans(conn: &Connection, run: &RunRow) -> rusqlite::Result<Vec<StoredSpan>> {
    let Some(trace_id) = run.trace_id.as_deref() else {
        return Ok(Vec::new());
    };
    let mut spans = trace_spans_with_payloads(conn, run.rid, trace_id)?;
    spans.retain(|s| s.rid == Some(run.rid) && s.span.kind == "llm");
    Ok(spans)
}

/// `type` and `message` of a stored `{"type", "message", "stacktrace"}`.
pub(crate) fn parse_error(text: Option<&str>) -> (Option<String>, Option<String>) {
    let Some(text) = text else {
        return (None, None);
    };
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v) => {
            let field = |k: &str| match v.get(k) {
                Some(serde_json::Value::String(s)) => Some(s.clone()),
                Some(serde_json::Value::Null) | None => None,
                Some(other) => Some(other.to_string()),
            };
            (field("type"), field("message"))
        }
        Err(_) => (None, Some(text.to_string())),
    }
}

/// The pending interrupts of a run, ordered by interrupt id.
pub fn pending_interrupts(conn: &Connection, rid: i64) -> rusqlite::Result<Vec<InterruptRow>> {
    read_pending(conn, rid)
}

// ---------------------------------------------------------------------------
// Costs (`compose costs`, OBS-34)
// ---------------------------------------------------------------------------

/// How `llm_costs` buckets the calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CostsBy {
    /// The span attribute `model`, else the span name.
    Model,
    /// The owning run's name: `(none)` outside any run, `(unknown)` when the
    /// run row is gone.
    Name,
    /// The local date (`YYYY-MM-DD`) of `started_at`.
    Day,
}

/// One bucket of `llm` calls.
#[derive(Debug, Clone, PartialEq)]
pub struct CostBucket {
    pub key: String,
    pub calls: i64,
    /// Σ(input + output tokens).
    pub tokens: i64,
    /// Σ of the non-null `cost_usd`; `None` when no call was priced.
    pub cost_usd: Option<f64>,
    /// Some call's cost is not fully known (`cost_complete` false: unpriced,
    /// or only partly priced). A call with no cost and a complete one (a
    /// cache hit's `Usage()`) costs nothing and keeps the sum exact.
    pub incomplete: bool,
}

impl CostBucket {
    pub(crate) fn new(key: String) -> Self {
        CostBucket {
            key,
            calls: 0,
            tokens: 0,
            cost_usd: None,
            incomplete: false,
        }
    }

    pub(crate) fn add(&mut self, tokens: i64, cost: Option<f64>, complete: bool) {
        self.calls += 1;
        self.tokens = self.tokens.saturating_add(tokens);
        if let Some(c) = cost {
            self.cost_usd = Some(self.cost_usd.unwrap_or(0.0) + c);
        }
        self.incomplete |= !complete;
    }
}

/// The usage columns of one `llm` row, read after the bucket column(s).
fn read_usage(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<(i64, Option<f64>, bool)> {
    let int = |v: ValueRef<'_>| match v {
        ValueRef::Integer(i) => i,
        ValueRef::Real(f) => f as i64,
        _ => 0,
    };
    let tokens = int(r.get_ref(at)?).saturating_add(int(r.get_ref(at + 1)?));
    let cost = match r.get_ref(at + 2)? {
        ValueRef::Real(f) => Some(f),
        ValueRef::Integer(i) => Some(i as f64),
        _ => None,
    };
    let complete = !matches!(r.get_ref(at + 3)?, ValueRef::Integer(0));
    Ok((tokens, cost, complete))
}

/// The `model` attribute of an encoded attributes dict (`None` when absent
/// or null): a string as is, anything else as its JSON text.
pub(crate) fn model_attribute(attributes_json: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(attributes_json).ok()?;
    let mut map = v.as_object()?;
    // A dict holding a `$kind` key is stored wrapped (OBS-60).
    if map.get("$kind").and_then(|k| k.as_str()) == Some("dict") {
        map = map.get("value")?.as_object()?;
    }
    match map.get("model")? {
        serde_json::Value::Null => None,
        serde_json::Value::String(m) => Some(m.clone()),
        other => Some(other.to_string()),
    }
}

/// Python's `datetime.fromtimestamp(t)` second: microseconds rounded half
/// to even, carried into the seconds.
fn timestamp_second(t: f64) -> Option<i64> {
    if !t.is_finite() || t.abs() > 1e17 {
        return None;
    }
    let int = t.trunc();
    let mut us = ((t - int) * 1e6).round_ties_even();
    let mut secs = int as i64;
    if us >= 1e6 {
        secs += 1;
    } else if us < 0.0 {
        us += 1e6;
        secs -= 1;
        if us >= 1e6 {
            secs += 1;
        }
    }
    Some(secs)
}

/// The local date of Unix second `t` (`localtime_r`, as Python's
/// `datetime.fromtimestamp` uses).
fn local_date(t: i64) -> Option<String> {
    let tt = libc::time_t::try_from(t).ok()?;
    // SAFETY: `tm` is plain data, fully written by `localtime_r` on success;
    // both pointers are valid for the call.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let ok = unsafe { !libc::localtime_r(&tt, &mut tm).is_null() };
    ok.then(|| {
        format!(
            "{:04}-{:02}-{:02}",
            i64::from(tm.tm_year) + 1900,
            tm.tm_mon + 1,
            tm.tm_mday
        )
    })
}

/// Local dates per quarter hour: every time zone offset in use is a
/// multiple of 15 minutes, so a quarter hour almost always lies within one
/// local day. One that does not (checked at both ends) is resolved per
/// second.
#[derive(Default)]
pub(crate) struct LocalDates(HashMap<i64, Option<String>>);

impl LocalDates {
    const SPAN: i64 = 900;

    pub(crate) fn date(&mut self, t: f64) -> String {
        let Some(secs) = timestamp_second(t) else {
            return "(invalid date)".to_string();
        };
        let q = secs.div_euclid(Self::SPAN);
        let whole = self.0.entry(q).or_insert_with(|| {
            let first = local_date(q * Self::SPAN);
            let last = local_date(q * Self::SPAN + Self::SPAN - 1);
            if first.is_some() && first == last {
                first
            } else {
                None
            }
        });
        match whole {
            Some(d) => d.clone(),
            None => local_date(secs).unwrap_or_else(|| "(invalid date)".to_string()),
        }
    }
}

/// Buckets every `llm` span (started at or after `since`, if given) by `by`
/// and returns the buckets sorted by key plus the total (OBS-34).
///
/// One pass over the partial index of `llm` spans; the bucket key is
/// computed here, with each distinct attributes text parsed once.
pub fn llm_costs(
    conn: &Connection,
    by: CostsBy,
    since: Option<f64>,
) -> rusqlite::Result<(Vec<CostBucket>, CostBucket)> {
    let key_columns = match by {
        CostsBy::Model => "attributes_json, name",
        CostsBy::Name => "rid, NULL",
        CostsBy::Day => "started_at, NULL",
    };
    let range = if since.is_some() {
        "AND started_at >= ?1"
    } else {
        "AND ?1 IS NULL"
    };
    let mut st = conn.prepare(&format!(
        "SELECT {key_columns}, input_tokens, output_tokens, cost_usd, cost_complete \
         FROM spans WHERE kind = 'llm' {range}"
    ))?;
    let names: HashMap<i64, String> = if by == CostsBy::Name {
        let mut q = conn.prepare("SELECT rid, name FROM runs")?;
        let rows = q.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect::<rusqlite::Result<_>>()?
    } else {
        HashMap::new()
    };
    let mut buckets: HashMap<String, CostBucket> = HashMap::new();
    let mut total = CostBucket::new("TOTAL".to_string());
    let mut models: HashMap<Vec<u8>, Option<String>> = HashMap::new();
    let mut dates = LocalDates::default();
    let mut rows = st.query([since])?;
    while let Some(r) = rows.next()? {
        let (tokens, cost, complete) = read_usage(r, 2)?;
        total.add(tokens, cost, complete);
        let owned;
        let key: &str = match by {
            CostsBy::Model => {
                let model = match r.get_ref(0)? {
                    ValueRef::Text(a) | ValueRef::Blob(a) => match models.get(a) {
                        Some(m) => m.as_deref(),
                        None => models
                            .entry(a.to_vec())
                            .or_insert_with(|| model_attribute(a))
                            .as_deref(),
                    },
                    _ => None,
                };
                match (model, r.get_ref(1)?) {
                    (Some(m), _) => m,
                    (None, ValueRef::Text(n)) => {
                        owned = String::from_utf8_lossy(n).into_owned();
                        &owned
                    }
                    (None, _) => "",
                }
            }
            CostsBy::Name => match r.get_ref(0)? {
                ValueRef::Integer(rid) => names.get(&rid).map_or("(unknown)", |n| n.as_str()),
                _ => "(none)",
            },
            CostsBy::Day => {
                let t = match r.get_ref(0)? {
                    ValueRef::Real(f) => f,
                    ValueRef::Integer(i) => i as f64,
                    _ => f64::NAN,
                };
                owned = dates.date(t);
                &owned
            }
        };
        match buckets.get_mut(key) {
            Some(b) => b.add(tokens, cost, complete),
            None => {
                let mut b = CostBucket::new(key.to_string());
                b.add(tokens, cost, complete);
                buckets.insert(key.to_string(), b);
            }
        }
    }
    let mut out: Vec<CostBucket> = buckets.into_values().collect();
    // Keys sort by code point, which is UTF-8 byte order.
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok((out, total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::{open_connection, SqliteStore};
    use crate::store::{NewRun, Settlement, SpanRecord, SpanRow, Store};

    use crate::test_dir::Dir;

    fn run(store: &SqliteStore, run_id: &str, kind: &str, name: &str) -> RunRow {
        store
            .create_run(
                &NewRun {
                    run_id: run_id.into(),
                    trace_id: format!("T{run_id}"),
                    kind: kind.into(),
                    name: name.into(),
                    ..Default::default()
                },
                crate::run::owner_id(),
                0.0,
            )
            .unwrap()
    }

    fn settle(store: &SqliteStore, rid: i64, status: &str, pending: Vec<InterruptRow>) {
        store
            .settle(
                rid,
                crate::run::owner_id(),
                &Settlement {
                    status: status.into(),
                    output_json: None,
                    error_json: None,
                    pending,
                    ..Default::default()
                },
            )
            .unwrap();
    }

    fn span(id: &str, parent: Option<&str>, kind: &str, start: f64) -> SpanRow {
        SpanRow {
            span_id: id.into(),
            parent_span_id: parent.map(Into::into),
            kind: kind.into(),
            name: format!("{kind}-{id}"),
            started_at: start,
            ended_at: Some(start + 1.0),
            status: "ok".into(),
            ..Default::default()
        }
    }

    fn llm(id: &str, start: f64, tokens: (i64, i64), cost: Option<f64>, complete: bool) -> SpanRow {
        SpanRow {
            usage: Some(UsageRow {
                input_tokens: tokens.0,
                output_tokens: tokens.1,
                cost_usd: cost,
                cost_complete: complete,
                ..Default::default()
            }),
            ..span(id, None, "llm", start)
        }
    }

    fn put(store: &SqliteStore, run: &RunRow, rid: Option<i64>, s: SpanRow) {
        store.queue_span(SpanRecord {
            trace_id: run.trace_id.clone().unwrap(),
            rid,
            span: s,
            output_in_journal: false,
        });
        store.flush().unwrap();
    }

    fn set_created(store: &SqliteStore, run_id: &str, t: f64) {
        store
            .with_conn(|c| {
                c.execute(
                    "UPDATE runs SET created_at = ?1 WHERE run_id = ?2",
                    params![t, run_id],
                )
                .unwrap();
                Ok(())
            })
            .unwrap();
    }

    #[test]
    fn lists_runs_newest_first_with_usage_and_filters() {
        let dir = Dir::new();
        let store = SqliteStore::open(&dir.db()).unwrap();
        let a = run(&store, "A1", "flow", "alpha");
        let b = run(&store, "B1", "agent", "beta");
        run(&store, "C1", "flow", "gamma");
        set_created(&store, "A1", 100.0);
        set_created(&store, "B1", 200.0);
        set_created(&store, "C1", 300.0);
        settle(&store, a.rid, "completed", vec![]);
        settle(&store, b.rid, "paused", vec![]);
        // A: two priced calls, one unpriced; plus a task span that never counts.
        put(
            &store,
            &a,
            Some(a.rid),
            llm("01", 1.0, (10, 5), Some(0.5), true),
        );
        put(
            &store,
            &a,
            Some(a.rid),
            llm("02", 2.0, (100, 50), None, false),
        );
        put(
            &store,
            &a,
            Some(a.rid),
            llm("03", 3.0, (1, 1), Some(0.25), true),
        );
        put(&store, &a, Some(a.rid), span("04", None, "task", 4.0));
        // An llm span in A's trace that belongs to no run is not A's.
        put(
            &store,
            &a,
            None,
            llm("05", 5.0, (1000, 1000), Some(9.0), true),
        );
        // B: one unpriced call only.
        put(&store, &b, Some(b.rid), llm("06", 1.0, (7, 3), None, false));

        let conn = open_connection(&dir.db(), false).unwrap();
        let all = list_runs(
            &conn,
            &RunFilter {
                limit: 10,
                ..Default::default()
            },
        )
        .unwrap();
        let ids: Vec<&str> = all.iter().map(|s| s.run.run_id.as_str()).collect();
        assert_eq!(ids, ["C1", "B1", "A1"]);
        let (sc, sb, sa) = (&all[0], &all[1], &all[2]);
        assert_eq!(
            (sa.tokens, sa.cost_usd, sa.cost_complete),
            (167, Some(0.75), false)
        );
        assert_eq!(
            (sb.tokens, sb.cost_usd, sb.cost_complete),
            (10, None, false)
        );
        assert_eq!((sc.tokens, sc.cost_usd, sc.cost_complete), (0, None, true));
        assert_eq!(sa.run.status, "completed");

        let f = |status: Option<&str>, kind: Option<&str>, since: Option<f64>, limit: i64| {
            list_runs(
                &conn,
                &RunFilter {
                    status: status.map(Into::into),
                    kind: kind.map(Into::into),
                    since,
                    before: None,
                    limit,
                },
            )
            .unwrap()
            .into_iter()
            .map(|s| s.run.run_id)
            .collect::<Vec<_>>()
        };
        assert_eq!(f(Some("paused"), None, None, 10), ["B1"]);
        assert_eq!(f(None, Some("flow"), None, 10), ["C1", "A1"]);
        assert_eq!(f(None, None, Some(200.0), 10), ["C1", "B1"]);
        assert_eq!(f(None, None, None, 2), ["C1", "B1"]);
        assert_eq!(f(Some("failed"), None, None, 10), Vec::<String>::new());
    }

    #[test]
    fn resolves_exact_ids_prefixes_and_last() {
        let dir = Dir::new();
        let store = SqliteStore::open(&dir.db()).unwrap();
        for (id, t) in [
            ("01ABC", 1.0),
            ("01ABD", 2.0),
            ("01AB", 3.0),
            ("02%_X", 0.5),
            ("Äx", 0.1),
            ("Äy\u{10FFFF}z", 0.2),
        ] {
            run(&store, id, "flow", "f");
            set_created(&store, id, t);
        }
        let conn = open_connection(&dir.db(), false).unwrap();
        let found = |p: &str| match resolve_run(&conn, p).unwrap() {
            Resolved::Found(r) => format!("found {}", r.run_id),
            Resolved::NotFound => "none".into(),
            Resolved::Ambiguous(ids) => format!("ambiguous {}", ids.join(",")),
        };
        // Exact id wins over being a prefix of others.
        assert_eq!(found("01AB"), "found 01AB");
        assert_eq!(found("01ABC"), "found 01ABC");
        assert_eq!(found("01A"), "ambiguous 01AB,01ABC,01ABD");
        assert_eq!(found("02"), "found 02%_X");
        // No LIKE wildcards, no case folding.
        assert_eq!(found("0_"), "none");
        assert_eq!(found("%"), "none");
        assert_eq!(found("02%"), "found 02%_X");
        assert_eq!(found("01abc"), "none");
        assert_eq!(found("03"), "none");
        assert_eq!(found("Ä"), "ambiguous Äx,Äy\u{10FFFF}z");
        assert_eq!(found("Äy"), "found Äy\u{10FFFF}z");
        assert_eq!(found("Äy\u{10FFFF}"), "found Äy\u{10FFFF}z");
        assert_eq!(found("ä"), "none");
        assert_eq!(last_run(&conn).unwrap().unwrap().run_id, "01AB");
    }

    #[test]
    fn last_run_of_an_empty_store_is_none() {
        let dir = Dir::new();
        let _store = SqliteStore::open(&dir.db()).unwrap();
        let conn = open_connection(&dir.db(), false).unwrap();
        assert!(last_run(&conn).unwrap().is_none());
        assert!(matches!(
            resolve_run(&conn, "x").unwrap(),
            Resolved::NotFound
        ));
    }

    #[test]
    fn trace_spans_are_ordered_and_decoded() {
        let dir = Dir::new();
        let store = SqliteStore::open(&dir.db()).unwrap();
        let r = run(&store, "R1", "flow", "f");
        let root = crate::ids::new_ulid();
        let child_a = crate::ids::new_ulid();
        let child_b = crate::ids::new_ulid();
        // Written out of order; child_b and child_a start together.
        put(
            &store,
            &r,
            Some(r.rid),
            span(&child_b, Some(&root), "task", 5.0),
        );
        let mut failed = span(&child_a, Some(&root), "llm", 5.0);
        failed.status = "error".into();
        failed.replayed = true;
        failed.error_json = Some(
            r#"{"type": "ProviderError", "message": "overloaded\nretry", "stacktrace": "x"}"#
                .into(),
        );
        failed.usage = Some(UsageRow {
            input_tokens: 3,
            output_tokens: 4,
            cost_usd: None,
            cost_complete: false,
            ..Default::default()
        });
        put(&store, &r, Some(r.rid), failed);
        put(&store, &r, Some(r.rid), span(&root, None, "flow", 1.0));
        // A span of another trace never shows.
        let other = run(&store, "R2", "flow", "g");
        put(
            &store,
            &other,
            Some(other.rid),
            span("legacy-id", None, "flow", 0.0),
        );

        let conn = open_connection(&dir.db(), false).unwrap();
        let spans = trace_spans(&conn, r.rid, "TR1").unwrap();
        let ids: Vec<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
        let mut tied = [child_a.clone(), child_b.clone()];
        tied.sort();
        assert_eq!(ids, [root.as_str(), tied[0].as_str(), tied[1].as_str()]);
        assert_eq!(spans[0].parent_span_id, None);
        assert!(spans[0].usage.is_none());
        let f = spans.iter().find(|s| s.span_id == child_a).unwrap();
        assert_eq!(f.parent_span_id.as_deref(), Some(root.as_str()));
        assert_eq!(f.error_type.as_deref(), Some("ProviderError"));
        assert_eq!(f.error_message.as_deref(), Some("overloaded\nretry"));
        assert!(f.replayed);
        let u = f.usage.as_ref().unwrap();
        assert_eq!(
            (u.input_tokens, u.output_tokens, u.cost_complete),
            (3, 4, false)
        );
        assert_eq!(u.cost_usd, None);
        // Ids that are not ULIDs come back as written.
        let legacy = trace_spans(&conn, other.rid, "TR2").unwrap();
        assert_eq!(legacy[0].span_id, "legacy-id");
        assert!(trace_spans(&conn, other.rid + 1, "nope")
            .unwrap()
            .is_empty());
    }

    #[test]
    fn pending_interrupts_are_ordered_by_id() {
        let dir = Dir::new();
        let store = SqliteStore::open(&dir.db()).unwrap();
        let r = run(&store, "R1", "flow", "f");
        let p = |id: &str, kind: &str| InterruptRow {
            interrupt_id: id.into(),
            kind: kind.into(),
            question: Some(format!("q {id}?")),
            payload_json: Some("{\"a\": 1}".into()),
        };
        settle(
            &store,
            r.rid,
            "paused",
            vec![p("b", "question"), p("a", "approval")],
        );
        let conn = open_connection(&dir.db(), false).unwrap();
        let got = pending_interrupts(&conn, r.rid).unwrap();
        assert_eq!(got, vec![p("a", "approval"), p("b", "question")]);
    }

    fn payload_span(id: &str, name: &str, input: Option<&str>, output: Option<&str>) -> SpanRow {
        SpanRow {
            name: name.into(),
            input_json: input.map(Into::into),
            output_json: output.map(Into::into),
            ..span(id, None, "task", 1.0)
        }
    }

    fn searched(conn: &Connection, q: &str) -> Vec<String> {
        search_runs(
            conn,
            &RunFilter {
                limit: 10,
                ..Default::default()
            },
            q,
        )
        .unwrap()
        .into_iter()
        .map(|s| s.run.run_id)
        .collect()
    }

    #[test]
    fn search_indexes_names_and_payloads_incrementally() {
        let dir = Dir::new();
        let store = SqliteStore::open(&dir.db()).unwrap();
        let a = run(&store, "A", "flow", "alpha");
        let b = run(&store, "B", "flow", "beta");
        set_created(&store, "A", 1.0);
        set_created(&store, "B", 2.0);
        put(
            &store,
            &a,
            Some(a.rid),
            payload_span("01", "fetch_page", Some(r#"{"url":"zebra"}"#), None),
        );
        // Output stored by reference to the journal.
        store
            .commit_step(
                b.rid,
                "summarize#1",
                r#""giraffe facts""#,
                Some(SpanRecord {
                    trace_id: "TB".into(),
                    rid: Some(b.rid),
                    span: SpanRow {
                        step_key: Some("summarize#1".into()),
                        ..payload_span("02", "summarize", None, Some(r#""giraffe facts""#))
                    },
                    output_in_journal: true,
                }),
            )
            .unwrap();
        // A span without payloads (content capture off) is found by name only.
        put(
            &store,
            &b,
            Some(b.rid),
            payload_span("03", "quiet", None, None),
        );
        // A span outside any run selects nothing.
        put(
            &store,
            &a,
            None,
            payload_span("04", "stray", Some("\"okapi\""), None),
        );

        let conn = open_connection(&dir.db(), false).unwrap();
        assert_eq!(searched(&conn, "zebra"), ["A"]);
        assert_eq!(searched(&conn, "giraffe"), ["B"]);
        assert_eq!(searched(&conn, "fetch_page OR quiet"), ["B", "A"]);
        assert_eq!(searched(&conn, "name:summarize"), ["B"]);
        assert!(searched(&conn, "okapi").is_empty());
        assert!(searched(&conn, "nothing").is_empty());
        // Filters still apply.
        let only_alpha = search_runs(
            &conn,
            &RunFilter {
                kind: Some("agent".into()),
                limit: 10,
                ..Default::default()
            },
            "zebra",
        )
        .unwrap();
        assert!(only_alpha.is_empty());

        // New spans are indexed by the next search.
        put(
            &store,
            &a,
            Some(a.rid),
            payload_span("05", "late", Some("\"giraffe\""), None),
        );
        assert_eq!(searched(&conn, "giraffe"), ["B", "A"]);
        let indexed: i64 = conn
            .query_row("SELECT last_sid FROM span_fts_state", [], |r| r.get(0))
            .unwrap();
        let max: i64 = conn
            .query_row("SELECT MAX(sid) FROM spans", [], |r| r.get(0))
            .unwrap();
        assert_eq!(indexed, max);

        // Bad syntax is reported with SQLite's message.
        for bad in ["giraffe AND", "nosuchcolumn:x", "\"unterminated"] {
            match search_runs(&conn, &RunFilter::default(), bad) {
                Err(SearchError::Syntax(msg)) => assert!(!msg.is_empty(), "{bad}: {msg}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn search_rebuilds_when_the_newest_indexed_span_is_gone() {
        let dir = Dir::new();
        let store = SqliteStore::open(&dir.db()).unwrap();
        let a = run(&store, "A", "flow", "alpha");
        put(
            &store,
            &a,
            Some(a.rid),
            payload_span("01", "one", Some("\"zebra\""), None),
        );
        let b = run(&store, "B", "pipe", "discarded");
        put(
            &store,
            &b,
            Some(b.rid),
            payload_span("02", "two", Some("\"giraffe\""), None),
        );
        let conn = open_connection(&dir.db(), false).unwrap();
        assert_eq!(searched(&conn, "giraffe"), ["B"]);
        // B's spans held the highest sid; a new span reuses it.
        let top: i64 = conn
            .query_row("SELECT MAX(sid) FROM spans", [], |r| r.get(0))
            .unwrap();
        store.delete_run(b.rid).unwrap();
        let c = run(&store, "C", "flow", "gamma");
        put(
            &store,
            &c,
            Some(c.rid),
            payload_span("03", "three", Some("\"okapi\""), None),
        );
        let reused: i64 = conn
            .query_row("SELECT MAX(sid) FROM spans", [], |r| r.get(0))
            .unwrap();
        assert_eq!(reused, top);
        assert!(searched(&conn, "giraffe").is_empty());
        assert_eq!(searched(&conn, "okapi"), ["C"]);
        assert_eq!(searched(&conn, "zebra"), ["A"]);
        // Everything deleted: the index empties too.
        store.delete_run(c.rid).unwrap();
        store.delete_run(a.rid).unwrap();
        assert!(searched(&conn, "zebra").is_empty());
        let state: i64 = conn
            .query_row("SELECT COUNT(*) FROM span_fts_state", [], |r| r.get(0))
            .unwrap();
        assert_eq!(state, 0);
    }

    #[test]
    fn a_missing_fts_module_is_recognised() {
        let conn = Connection::open_in_memory().unwrap();
        let err = conn
            .execute_batch("CREATE VIRTUAL TABLE t USING no_such_module(a)")
            .unwrap_err();
        assert!(is_missing_fts5(&err));
        let other = conn.execute_batch("SELECT * FROM nope").unwrap_err();
        assert!(!is_missing_fts5(&other));
    }

    fn llm_with(
        id: &str,
        name: &str,
        attrs: Option<&str>,
        start: f64,
        tokens: (i64, i64),
        cost: Option<f64>,
        complete: bool,
    ) -> SpanRow {
        SpanRow {
            name: name.into(),
            attributes_json: attrs.map(Into::into),
            ..llm(id, start, tokens, cost, complete)
        }
    }

    #[test]
    fn costs_bucket_by_model_name_and_day() {
        let dir = Dir::new();
        let store = SqliteStore::open(&dir.db()).unwrap();
        let a = run(&store, "A", "flow", "digest");
        let b = run(&store, "B", "agent", "digest");
        let c = run(&store, "C", "agent", "gone");
        let haiku = Some(r#"{"model":"claude-haiku-4-5","provider":"anthropic"}"#);
        let t0 = 1_700_000_000.0;
        put(
            &store,
            &a,
            Some(a.rid),
            llm_with(
                "01",
                "anthropic/claude-haiku-4-5",
                haiku,
                t0,
                (100, 10),
                Some(0.5),
                true,
            ),
        );
        put(
            &store,
            &b,
            Some(b.rid),
            llm_with(
                "02",
                "anthropic/claude-haiku-4-5",
                haiku,
                t0 + 90_000.0,
                (1, 2),
                Some(0.25),
                true,
            ),
        );
        // No model attribute: the span name; a wrapped dict; a null model.
        put(
            &store,
            &b,
            Some(b.rid),
            llm_with("03", "FakeModel", None, t0 + 10.0, (5, 5), None, false),
        );
        put(
            &store,
            &c,
            Some(c.rid),
            llm_with(
                "04",
                "x",
                Some(r#"{"$kind":"dict","value":{"$kind":1,"model":"llama3"}}"#),
                t0 + 20.0,
                (7, 0),
                None,
                true,
            ),
        );
        put(
            &store,
            &a,
            None,
            llm_with(
                "05",
                "FakeModel",
                Some(r#"{"model":null}"#),
                t0 + 30.0,
                (0, 3),
                Some(1.0),
                false,
            ),
        );
        // Not llm spans: never counted.
        put(&store, &a, Some(a.rid), span("06", None, "task", t0));
        store.delete_run(c.rid).unwrap_or(());
        // Re-add C's span to a run id that no longer exists.
        put(
            &store,
            &c,
            Some(c.rid),
            llm_with(
                "07",
                "x",
                Some(r#"{"$kind":"dict","value":{"$kind":1,"model":"llama3"}}"#),
                t0 + 20.0,
                (7, 0),
                None,
                true,
            ),
        );

        let conn = open_connection(&dir.db(), false).unwrap();
        let keys = |by, since| {
            let (buckets, total) = llm_costs(&conn, by, since).unwrap();
            let rows: Vec<(String, i64, i64, Option<f64>, bool)> = buckets
                .into_iter()
                .map(|b| (b.key, b.calls, b.tokens, b.cost_usd, b.incomplete))
                .collect();
            (
                rows,
                (total.calls, total.tokens, total.cost_usd, total.incomplete),
            )
        };
        let (model, total) = keys(CostsBy::Model, None);
        assert_eq!(
            model,
            vec![
                ("FakeModel".into(), 2, 13, Some(1.0), true),
                ("claude-haiku-4-5".into(), 2, 113, Some(0.75), false),
                ("llama3".into(), 1, 7, None, false),
            ]
        );
        assert_eq!(total, (5, 133, Some(1.75), true));
        let (name, _) = keys(CostsBy::Name, None);
        let names: Vec<(&str, i64)> = name.iter().map(|r| (r.0.as_str(), r.1)).collect();
        assert_eq!(names, [("(none)", 1), ("(unknown)", 1), ("digest", 3)]);
        let (day, _) = keys(CostsBy::Day, None);
        let d0 = local_date(t0 as i64).unwrap();
        let d1 = local_date(t0 as i64 + 90_000).unwrap();
        assert_ne!(d0, d1);
        let days: Vec<(&str, i64)> = day.iter().map(|r| (r.0.as_str(), r.1)).collect();
        assert_eq!(days, [(d0.as_str(), 4), (d1.as_str(), 1)]);
        // `since` keeps calls started at or after it.
        let (late, total) = keys(CostsBy::Model, Some(t0 + 20.0));
        assert_eq!(late.len(), 3);
        assert_eq!(total.0, 3);
        let (none, total) = keys(CostsBy::Model, Some(t0 + 1e6));
        assert!(none.is_empty());
        assert_eq!(total, (0, 0, None, false));
    }

    #[test]
    fn local_dates_follow_python_rounding() {
        // Microseconds round half to even before the second is taken.
        assert_eq!(timestamp_second(10.4), Some(10));
        assert_eq!(timestamp_second(10.9999996), Some(11));
        assert_eq!(timestamp_second(-0.5), Some(-1));
        assert_eq!(timestamp_second(f64::NAN), None);
        let mut dates = LocalDates::default();
        for t in [0.0, 86_399.0, 86_400.0, 1_700_000_000.25, 1_700_043_199.5] {
            let secs = timestamp_second(t).unwrap();
            assert_eq!(dates.date(t), local_date(secs).unwrap(), "{t}");
        }
        assert_eq!(dates.date(f64::NAN), "(invalid date)");
    }

    #[test]
    fn payload_spans_read_journaled_outputs_and_llm_spans_of_a_run() {
        let dir = Dir::new();
        let store = SqliteStore::open(&dir.db()).unwrap();
        let r = run(&store, "R", "flow", "f");
        store
            .commit_step(
                r.rid,
                "t#1",
                "[1,2]",
                Some(SpanRecord {
                    trace_id: "TR".into(),
                    rid: Some(r.rid),
                    span: SpanRow {
                        step_key: Some("t#1".into()),
                        ..payload_span("01", "t", Some("{}"), Some("[1,2]"))
                    },
                    output_in_journal: true,
                }),
            )
            .unwrap();
        let mut second = llm_with(
            "02",
            "m",
            Some(r#"{"model":"mm"}"#),
            3.0,
            (1, 2),
            None,
            false,
        );
        second.input_json = Some("\"in\"".into());
        second.output_json = Some("\"out\"".into());
        put(&store, &r, Some(r.rid), second);
        let mut first = llm_with("03", "m", None, 2.0, (3, 4), Some(0.1), true);
        first.output_json = Some("\"first\"".into());
        put(&store, &r, Some(r.rid), first);
        put(
            &store,
            &r,
            None,
            llm_with("04", "m", None, 1.0, (0, 0), None, true),
        );

        let conn = open_connection(&dir.db(), false).unwrap();
        let all = trace_spans_with_payloads(&conn, r.rid, "TR").unwrap();
        let ids: Vec<&str> = all.iter().map(|s| s.span.span_id.as_str()).collect();
        assert_eq!(ids, ["01", "04", "03", "02"]);
        assert_eq!(all[0].output_json.as_deref(), Some("[1,2]"));
        assert_eq!(all[0].input_json.as_deref(), Some("{}"));
        assert_eq!(all[0].rid, Some(r.rid));
        assert_eq!(all[1].rid, None);
        let llms = run_llm_spans(&conn, &r).unwrap();
        let ids: Vec<&str> = llms.iter().map(|s| s.span.span_id.as_str()).collect();
        assert_eq!(ids, ["03", "02"]);
        assert_eq!(
            llms[1].attributes_json.as_deref(),
            Some(r#"{"model":"mm"}"#)
        );
        assert_eq!(llms[1].input_json.as_deref(), Some("\"in\""));
        assert_eq!(llms[0].output_json.as_deref(), Some("\"first\""));
        assert_eq!(llms[0].span.usage.as_ref().unwrap().cost_usd, Some(0.1));
    }

    /// `(tid of each span, traces rows)` of `run`'s trace, in span order.
    fn layout(conn: &Connection, run: &RunRow) -> (Vec<i64>, i64) {
        let trace = run.trace_id.as_deref().unwrap();
        let tids = conn
            .prepare(&format!(
                "SELECT s.tid FROM spans s WHERE {IN_RUN_TRACE} ORDER BY sid"
            ))
            .unwrap()
            .query_map(params![run.rid, trace], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let rows = conn
            .query_row(
                "SELECT count(*) FROM traces WHERE trace_id = ?1",
                [trace],
                |r| r.get(0),
            )
            .unwrap();
        (tids, rows)
    }

    #[test]
    fn a_runs_spans_read_the_same_under_its_own_tid_or_a_traces_row() {
        let dir = Dir::new();
        let store = SqliteStore::open(&dir.db()).unwrap();
        // A is a run of this engine: its trace is its own. B stands for a
        // run created before: its trace got a `traces` row then, and
        // another process (whose writer never saw B created) resumes it.
        let a = run(&store, "A", "flow", "a");
        let b = run(&store, "B", "flow", "b");
        store
            .with_conn(|c| {
                c.execute("INSERT INTO traces(trace_id) VALUES('TB')", [])
                    .unwrap();
                Ok(())
            })
            .unwrap();
        let later = SqliteStore::open(&dir.db()).unwrap();
        for (st, r) in [(&store, &a), (&later, &b)] {
            let id = |n: u8| format!("{}{n}", r.run_id);
            let agent = SpanRow {
                step_key: Some("agent#1".into()),
                ..span(&id(1), None, "agent", 1.0)
            };
            put(st, r, Some(r.rid), agent);
            let call = SpanRow {
                parent_span_id: Some(id(1)),
                ..llm(&id(2), 2.0, (10, 5), Some(0.5), true)
            };
            put(st, r, Some(r.rid), call);
            // Outside any run, in the run's trace: in the trace, not the
            // run's usage.
            put(st, r, None, llm(&id(3), 3.0, (100, 100), Some(9.0), true));
        }
        let conn = open_connection(&dir.db(), false).unwrap();
        assert_eq!(layout(&conn, &a), (vec![-a.rid; 3], 0));
        let tb: i64 = conn
            .query_row("SELECT tid FROM traces WHERE trace_id = 'TB'", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(layout(&conn, &b), (vec![tb; 3], 1));

        let summaries = list_runs(
            &conn,
            &RunFilter {
                limit: 10,
                ..Default::default()
            },
        )
        .unwrap();
        for r in [&a, &b] {
            let trace = r.trace_id.as_deref().unwrap();
            let ids = [1, 2, 3].map(|n| format!("{}{n}", r.run_id));
            let spans = trace_spans(&conn, r.rid, trace).unwrap();
            let got: Vec<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
            assert_eq!(got, ids);
            let spans = trace_spans_with_payloads(&conn, r.rid, trace).unwrap();
            let got: Vec<(&str, Option<i64>)> = spans
                .iter()
                .map(|s| (s.span.span_id.as_str(), s.rid))
                .collect();
            let want = [
                (ids[0].as_str(), Some(r.rid)),
                (ids[1].as_str(), Some(r.rid)),
                (ids[2].as_str(), None),
            ];
            assert_eq!(got, want);
            let llms = run_llm_spans(&conn, r).unwrap();
            assert_eq!(llms.len(), 1);
            assert_eq!(llms[0].span.span_id, ids[1]);
            let s = summaries.iter().find(|s| s.run.rid == r.rid).unwrap();
            assert_eq!(
                (s.tokens, s.cost_usd, s.cost_complete),
                (15, Some(0.5), true)
            );
            let spend = store.prior_llm_usage(r.rid).unwrap();
            assert_eq!(spend.total, (15, 0.5));
            assert_eq!(spend.by_step.get("agent#1"), Some(&(15, 0.5)));
        }

        for r in [&a, &b] {
            store.delete_run(r.rid).unwrap();
            assert_eq!(layout(&conn, r), (vec![], 0));
        }
        let left: i64 = conn
            .query_row("SELECT count(*) FROM spans", [], |r| r.get(0))
            .unwrap();
        assert_eq!(left, 0);
    }
}
