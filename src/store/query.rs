//! Read-only queries behind the `compose` CLI (OBS-30 … OBS-32).
//!
//! Every function takes a connection opened by
//! `sqlite::open_connection` on an existing store; none of them writes.

use super::sqlite::{read_pending, read_run_row};
use super::{InterruptRow, RunRow, UsageRow};
use crate::ids::read_id;
use crate::trace::RenderSpan;
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{params, Connection, OptionalExtension, ToSql};

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
    pub limit: i64,
}

/// Runs matching `f`, newest first, with their usage.
pub fn list_runs(conn: &Connection, f: &RunFilter) -> rusqlite::Result<Vec<RunSummary>> {
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs \
         WHERE (?1 IS NULL OR status = ?1) AND (?2 IS NULL OR kind = ?2) \
           AND (?3 IS NULL OR created_at >= ?3) \
         ORDER BY created_at DESC, rid DESC LIMIT ?4"
    );
    let runs: Vec<RunRow> = conn
        .prepare_cached(&sql)?
        .query_map(
            params![f.status, f.kind, f.since, f.limit.max(0)],
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

/// Tokens, cost and completeness over a run's `llm` spans.
///
/// A run's spans are written under its own trace id, so the lookup goes
/// through the indexed trace rather than a scan of every span.
fn run_usage(conn: &Connection, run: &RunRow) -> rusqlite::Result<(i64, Option<f64>, bool)> {
    let Some(trace_id) = run.trace_id.as_deref() else {
        return Ok((0, None, true));
    };
    conn.prepare_cached(
        "SELECT COALESCE(SUM(COALESCE(s.input_tokens, 0) + COALESCE(s.output_tokens, 0)), 0), \
                SUM(s.cost_usd), COALESCE(MIN(s.cost_complete), 1) \
         FROM traces t JOIN spans s ON s.tid = t.tid \
         WHERE t.trace_id = ?1 AND s.rid = ?2 AND s.kind = 'llm'",
    )?
    .query_row(params![trace_id, run.rid], |r| {
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

/// Every stored span of `trace_id`, ordered by `started_at` then span id.
pub fn trace_spans(conn: &Connection, trace_id: &str) -> rusqlite::Result<Vec<RenderSpan>> {
    let mut st = conn.prepare_cached(
        "SELECT s.span_id, s.parent, s.kind, s.name, s.started_at, s.ended_at, s.status, \
                s.flags, s.error_json, s.input_tokens, s.output_tokens, s.cache_read_tokens, \
                s.cache_creation_tokens, s.reasoning_tokens, s.cost_usd, s.cost_complete \
         FROM traces t JOIN spans s ON s.tid = t.tid WHERE t.trace_id = ?1",
    )?;
    let rows = st.query_map([trace_id], |r| {
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
        Ok(RenderSpan {
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
        })
    })?;
    let mut spans = rows.collect::<rusqlite::Result<Vec<_>>>()?;
    spans.sort_by(|a, b| {
        a.started_at
            .total_cmp(&b.started_at)
            .then_with(|| a.span_id.cmp(&b.span_id))
    });
    Ok(spans)
}

/// `type` and `message` of a stored `{"type", "message", "stacktrace"}`.
fn parse_error(text: Option<&str>) -> (Option<String>, Option<String>) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::{open_connection, SqliteStore};
    use crate::store::{NewRun, Settlement, SpanRecord, SpanRow, Store};

    struct Dir(std::path::PathBuf);
    impl Dir {
        fn new() -> Dir {
            let p =
                std::env::temp_dir().join(format!("composeai-query-{}", crate::ids::new_ulid()));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
        fn db(&self) -> String {
            self.0.join("runs.db").to_string_lossy().into_owned()
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

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
                "owner",
                0.0,
            )
            .unwrap()
    }

    fn settle(store: &SqliteStore, rid: i64, status: &str, pending: Vec<InterruptRow>) {
        store
            .settle(
                rid,
                "owner",
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
        let spans = trace_spans(&conn, "TR1").unwrap();
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
        let legacy = trace_spans(&conn, "TR2").unwrap();
        assert_eq!(legacy[0].span_id, "legacy-id");
        assert!(trace_spans(&conn, "nope").unwrap().is_empty());
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
}
