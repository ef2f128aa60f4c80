use super::*;
use crate::store::query::{local_date, timestamp_second};
use crate::store::sqlite::open::open_connection;
use crate::store::sqlite::store::SqliteStore;
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
            crate::owner::owner_id(),
            0.0,
        )
        .unwrap()
}

fn settle(store: &SqliteStore, rid: i64, status: &str, pending: Vec<InterruptRow>) {
    store
        .settle(
            rid,
            crate::owner::owner_id(),
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
                status: status.into_iter().map(Into::into).collect(),
                kind: kind.into_iter().map(Into::into).collect(),
                since,
                before: None,
                limit,
                ..RunFilter::default()
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
        r#"{"type": "ProviderError", "message": "overloaded\nretry", "stacktrace": "x"}"#.into(),
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
            None,
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
            kind: vec!["agent".into()],
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
            None,
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
