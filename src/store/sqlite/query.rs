//! Queries behind the `compose` CLI (OBS-30 … OBS-35).
//!
//! Every function takes a connection opened by
//! `sqlite::open_connection` on an existing store. None of them writes the
//! engine's tables; `search_runs` maintains the derived full-text index
//! (`span_fts`), which the engine never reads or writes.

use crate::ids::read_id;
use crate::store::published::{fork_origin, ListedRun, FORK_KEY};
use crate::store::query::{
    model_attribute, parse_error, CostBucket, CostsBy, LocalDates, RenderSpan, Resolved, RunFilter,
    RunSummary, StoredSpan,
};
use crate::store::sqlite::rows::read_pending;
use crate::store::sqlite::rows::read_run_row;
use crate::store::{InterruptRow, RunRow, UsageRow};
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{params, Connection, OptionalExtension, ToSql, Transaction, TransactionBehavior};
use std::collections::HashMap;

const RUN_COLUMNS: &str = "rid, run_id, kind, name, status, created_at, updated_at, trace_id, \
     fingerprint, args_json, output_json, error_json, budget_json, module";

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
         WHERE (?1 IS NULL OR status IN (SELECT value FROM json_each(?1))) \
           AND (?2 IS NULL OR kind IN (SELECT value FROM json_each(?2))) \
           AND (?3 IS NULL OR created_at >= ?3) {fts} \
           AND (?6 IS NULL OR created_at < ?6 OR (created_at = ?6 \
             AND rid < (SELECT b.rid FROM runs b WHERE b.run_id = ?7))) \
           AND (?8 IS NULL OR name = ?8) AND (?9 IS NULL OR created_at < ?9) \
         ORDER BY created_at DESC, rid DESC LIMIT ?4"
    );
    let (before_at, before_id) = f.before.clone().unzip();
    let runs: Vec<RunRow> = conn
        .prepare_cached(&sql)?
        .query_map(
            params![
                f.status_json(),
                f.kind_json(),
                f.since,
                f.limit.max(0),
                matching,
                before_at,
                before_id,
                f.name,
                f.until
            ],
            read_run_row,
        )?
        .collect::<rusqlite::Result<_>>()?;
    runs.into_iter()
        .map(|run| {
            let (input_tokens, output_tokens, cost_usd, cost_complete) = run_usage(conn, &run)?;
            Ok(RunSummary {
                run,
                tokens: input_tokens + output_tokens,
                input_tokens,
                output_tokens,
                cost_usd,
                cost_complete,
            })
        })
        .collect()
}

/// `list_runs` (or, with `matching`, `search_runs`) with each run's
/// pending interrupt ids, queue and fork origin (OPS-20).
pub fn listed_runs(
    conn: &Connection,
    f: &RunFilter,
    matching: Option<&str>,
) -> Result<Vec<ListedRun>, SearchError> {
    let runs = match matching {
        None => select_runs(conn, f, None)?,
        Some(q) => search_runs(conn, f, q)?,
    };
    runs.into_iter()
        .map(|summary| {
            let rid = summary.run.rid;
            let pending = if summary.run.status == "paused" {
                pending_interrupts(conn, rid)?
                    .into_iter()
                    .map(|p| p.interrupt_id)
                    .collect()
            } else {
                Vec::new()
            };
            let queue: Option<String> = conn
                .prepare_cached("SELECT queue FROM queue_runs WHERE rid = ?1")?
                .query_row([rid], |r| r.get(0))
                .optional()?;
            let origin: Option<String> = conn
                .prepare_cached("SELECT value_json FROM journal WHERE rid = ?1 AND step_key = ?2")?
                .query_row(params![rid, FORK_KEY], |r| r.get(0))
                .optional()?;
            Ok(ListedRun {
                summary,
                pending,
                queue,
                parent_id: origin.as_deref().and_then(fork_origin),
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
fn run_usage(conn: &Connection, run: &RunRow) -> rusqlite::Result<(i64, i64, Option<f64>, bool)> {
    let Some(trace_id) = run.trace_id.as_deref() else {
        return Ok((0, 0, None, true));
    };
    conn.prepare_cached(&format!(
        "SELECT COALESCE(SUM(COALESCE(s.input_tokens, 0)), 0), \
                COALESCE(SUM(COALESCE(s.output_tokens, 0)), 0), \
                SUM(s.cost_usd), COALESCE(MIN(s.cost_complete), 1) \
         FROM spans s WHERE {IN_RUN_TRACE} AND s.rid = ?1 AND s.kind = 'llm'"
    ))?
    .query_row(params![run.rid, trace_id], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get::<_, i64>(3)? != 0))
    })
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
                {payloads}, s.step_key \
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
                replayed: flags & crate::store::slot::FLAG_REPLAYED != 0,
                error_type,
                error_message,
                usage,
            },
            rid: r.get(16)?,
            attributes_json: r.get(17)?,
            input_json: r.get(18)?,
            output_json: r.get(19)?,
            step_key: r.get(20)?,
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

/// The pending interrupts of a run, ordered by interrupt id.
pub fn pending_interrupts(conn: &Connection, rid: i64) -> rusqlite::Result<Vec<InterruptRow>> {
    read_pending(conn, rid)
}

// ---------------------------------------------------------------------------
// Costs (`compose costs`, OBS-34)
// ---------------------------------------------------------------------------

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
mod tests;
