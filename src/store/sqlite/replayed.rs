//! The spans of replayed steps: one is queued per replayed step, so a
//! replay queues them as fast as the flow body runs. They are queued in a
//! compact form (the span id as bytes, the trace shared) and SQLite inserts
//! a batch of them with multi-row statements; the rows are the ones a
//! `SpanRecord` of the same span would write.

use crate::ids::encode_id;
use crate::store::spans::ReplayedSpan;
use crate::store::sqlite::multirow::{self, MultiRow};
use crate::store::sqlite::statements::Statements;
use rusqlite::Connection;
use std::collections::HashMap;
use std::sync::Arc;

const SPANS_HEAD: &str = "INSERT INTO spans(tid, rid, span_id, parent, kind, name, \
                          started_at, ended_at, status, flags, step_key) VALUES";

/// Spans sharing tid, rid, parent, kind and flags (`?1` to `?5`; a
/// replay's spans share them); a row's own: span_id, name, at (started and
/// ended), step_key.
static NAMED: MultiRow = MultiRow::new(
    SPANS_HEAD,
    "(?1,?2,?#1,?3,?4,?#2,?#3,?#3,'ok',?5,?#4)",
    5,
    4,
);
/// The same when every row of a statement has the same name (a loop
/// replaying one task): the name is bound once, as `?6`, and a row has the
/// other three, so a statement holds one copy of the name instead of one
/// per row.
static ONE_NAME: MultiRow =
    MultiRow::new(SPANS_HEAD, "(?1,?2,?#1,?3,?4,?6,?#2,?#2,'ok',?5,?#3)", 6, 3);

/// What the rows of one statement share.
struct Shared<'a> {
    tid: i64,
    rid: i64,
    parent: Option<&'a str>,
    kind: &'a str,
    flags: i64,
}

/// Inserts `spans` in order (refused ones already left out), under the
/// trace ids cached in `traces`.
pub(crate) fn insert_replayed(
    tx: &Connection,
    traces: &mut HashMap<String, i64>,
    statements: &mut Statements,
    spans: &[&ReplayedSpan],
) -> rusqlite::Result<()> {
    let mut last_trace: Option<(&Arc<str>, i64, i64)> = None;
    // The step keys of a statement's rows, written out before it runs
    // (bound without a copy): `ends[i]` is where row i's key ends.
    let mut keys = String::new();
    let mut ends: Vec<usize> = Vec::new();
    let mut at = 0;
    while at < spans.len() {
        let first = spans[at];
        // The tid depends on the run too (a run's own trace is `-rid`).
        let tid = match last_trace {
            Some((t, rid, tid))
                if rid == first.rid
                    && (Arc::ptr_eq(t, &first.trace_id) || **t == *first.trace_id) =>
            {
                tid
            }
            _ => {
                let tid = crate::store::sqlite::rows::trace_tid(
                    tx,
                    traces,
                    &first.trace_id,
                    Some(first.rid),
                )?;
                last_trace = Some((&first.trace_id, first.rid, tid));
                tid
            }
        };
        let shared = Shared {
            tid,
            rid: first.rid,
            parent: first.parent_span_id.as_deref(),
            kind: &first.kind,
            flags: first.flags(),
        };
        // The run of spans sharing these values.
        let end = multirow::run_end(at, spans.len(), |i| {
            let s = spans[i];
            s.rid == shared.rid
                && s.parent_span_id.as_deref() == shared.parent
                && *s.kind == *shared.kind
                && s.flags() == shared.flags
                && (Arc::ptr_eq(&s.trace_id, &first.trace_id) || s.trace_id == first.trace_id)
        });
        let parent = shared.parent.map(encode_id);
        for chunk in multirow::chunks(at..end) {
            let rows = &spans[chunk];
            let name = &rows[0].name;
            let one_name = rows
                .iter()
                .all(|s| Arc::ptr_eq(&s.name, name) || s.name == *name);
            keys.clear();
            ends.clear();
            for s in rows {
                s.step_key.write_to(&mut keys);
                ends.push(keys.len());
            }
            let insert = if one_name { &ONE_NAME } else { &NAMED };
            statements.execute_rows(tx, insert, rows.len(), |p| {
                p.set(1, shared.tid)?;
                p.set(2, shared.rid)?;
                p.set(3, &parent)?;
                p.set(4, shared.kind)?;
                p.set(5, shared.flags)?;
                if one_name {
                    p.set(6, &**name)?;
                }
                let mut from = 0;
                for (i, (s, &to)) in rows.iter().zip(&ends).enumerate() {
                    let key = &keys[from..to];
                    from = to;
                    let b = insert.base(i);
                    p.set(b + 1, &s.span_id[..])?;
                    if one_name {
                        p.set(b + 2, s.at)?;
                        p.set(b + 3, key)?;
                    } else {
                        p.set(b + 2, &*s.name)?;
                        p.set(b + 3, s.at)?;
                        p.set(b + 4, key)?;
                    }
                }
                Ok(())
            })?;
        }
        at = end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::StepKey;
    use crate::store::sqlite::multirow::stored_rows;
    use crate::store::sqlite::open::open_connection;
    use crate::store::sqlite::rows::insert_span;

    #[test]
    fn multi_row_inserts_store_the_rows_of_the_general_insert() {
        let dir =
            std::env::temp_dir().join(format!("composeai-replayed-{}", crate::ids::new_ulid()));
        std::fs::create_dir_all(&dir).unwrap();
        let trace: Arc<str> = Arc::from(crate::ids::new_ulid().as_str());
        let other: Arc<str> = Arc::from(crate::ids::new_ulid().as_str());
        let same: Arc<str> = Arc::from("same");
        // 83 rows: runs of shared values broken by a parent, a kind, the
        // output flag, a foreign parent id and another trace, so every
        // statement size is used.
        let spans: Vec<ReplayedSpan> = (0..83)
            .map(|i| ReplayedSpan {
                trace_id: if i == 70 {
                    other.clone()
                } else {
                    trace.clone()
                },
                rid: 1 + (i / 60) as i64,
                span_id: crate::ids::new_ulid_bytes().0,
                parent_span_id: match i {
                    0 => None,
                    41 => Some(Arc::from("foreign parent")),
                    _ => Some(Arc::from("01ARZ3NDEKTSV4RRFFQ69G5FAV")),
                },
                kind: if i == 50 { "llm".into() } else { "task".into() },
                // One name for the first rows (statements binding it once),
                // then names changing from row to row.
                name: if i < 30 {
                    same.clone()
                } else {
                    Arc::from(format!("step{}", i % 3).as_str())
                },
                at: 1_700_000_000.25 + i as f64,
                step_key: StepKey {
                    prefix: Arc::from(format!("scope/step{}", i % 3).as_str()),
                    n: 1 + i,
                },
                output_in_journal: i % 17 != 5,
            })
            .collect();
        let mut stored = Vec::new();
        for (name, batched) in [("a.db", true), ("b.db", false)] {
            let conn = open_connection(dir.join(name).to_str().unwrap(), false).unwrap();
            let mut traces = HashMap::new();
            let mut statements = Statements::default();
            if batched {
                let refs: Vec<&ReplayedSpan> = spans.iter().collect();
                insert_replayed(&conn, &mut traces, &mut statements, &refs).unwrap();
            } else {
                for s in &spans {
                    insert_span(
                        &conn,
                        &mut traces,
                        &mut statements,
                        &s.clone().into_record(),
                    )
                    .unwrap();
                }
            }
            stored.push(stored_rows(&conn, "SELECT * FROM spans ORDER BY sid"));
        }
        assert_eq!(stored[0].len(), 83);
        assert_eq!(stored[0], stored[1]);
        std::fs::remove_dir_all(&dir).ok();
    }
}
