//! The steps of batch durability, queued compactly: one is queued per
//! step, as fast as the flow body runs. The texts of a batch's steps (keys,
//! values, span fields) share one buffer, and the buffer and the step list
//! are reused from batch to batch, so once warm queuing a step allocates
//! nothing and the writer frees nothing per row. SQLite inserts runs of
//! them with multi-row statements; the rows are the ones a journal write
//! and a `SpanRecord` of the same step would write.

use crate::ids::{encode_id, StoredId};
use crate::store::slot::{Slot, FLAG_OUTPUT_IN_JOURNAL, FLAG_REPLAYED};
use crate::store::spans::SpanView;
use crate::store::sqlite::multirow::{self, MultiRow};
use crate::store::sqlite::rows::trace_tid;
use crate::store::sqlite::statements::Statements;
use rusqlite::Connection;
use std::collections::HashMap;
use std::sync::Arc;

/// A text of a batch: its byte range in `BatchedSteps::text`.
#[derive(Clone, Copy)]
struct Text(u32, u32);

/// Text capacity a reused batch keeps.
const KEPT_TEXT: usize = 1 << 20;

/// Queued batch-durability steps, in queue order.
#[derive(Default)]
pub struct BatchedSteps {
    text: String,
    steps: Vec<BatchedStep>,
}

struct BatchedStep {
    rid: i64,
    slot: Arc<Slot>,
    key: Text,
    value: Text,
    ident: Option<Text>,
    span: Option<StepSpan>,
}

/// A queued `SpanView`.
struct StepSpan {
    trace: Arc<str>,
    span_id: Text,
    parent: Option<Text>,
    kind: Text,
    name: Text,
    status: Text,
    step_key: Option<Text>,
    input: Option<Text>,
    started_at: f64,
    ended_at: Option<f64>,
    flags: i64,
}

impl BatchedSteps {
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    fn put(&mut self, s: &str) -> Text {
        let start = self.text.len() as u32;
        self.text.push_str(s);
        Text(start, self.text.len() as u32)
    }

    fn get(&self, t: Text) -> &str {
        &self.text[t.0 as usize..t.1 as usize]
    }

    /// Queues `value` under `key` of run `rid`, with its span in trace
    /// `trace`.
    pub fn push(
        &mut self,
        rid: i64,
        key: &str,
        value: &str,
        ident: Option<&str>,
        span: Option<(&Arc<str>, SpanView<'_>)>,
        slot: &Arc<Slot>,
    ) {
        let key = self.put(key);
        let value = self.put(value);
        let ident = ident.map(|i| self.put(i));
        let span = span.map(|(trace, s)| {
            let mut flags = 0;
            if s.replayed {
                flags |= FLAG_REPLAYED;
            }
            if s.output {
                flags |= FLAG_OUTPUT_IN_JOURNAL;
            }
            StepSpan {
                trace: trace.clone(),
                span_id: self.put(s.span_id),
                parent: s.parent_span_id.map(|p| self.put(p)),
                kind: self.put(s.kind),
                name: self.put(s.name),
                status: self.put(s.status),
                step_key: s.step_key.map(|k| self.put(k)),
                input: s.input_json.map(|i| self.put(i)),
                started_at: s.started_at,
                ended_at: s.ended_at,
                flags,
            }
        });
        self.steps.push(BatchedStep {
            rid,
            slot: slot.clone(),
            key,
            value,
            ident,
            span,
        });
    }

    /// Empties the batch, keeping its buffers for the next one (unless a
    /// large value grew the text's: that memory is given back).
    pub fn clear(&mut self) {
        if self.text.capacity() > KEPT_TEXT {
            self.text = String::new();
        } else {
            self.text.clear();
        }
        self.steps.clear();
    }

    /// The slot of every queued step.
    pub fn slots(&self) -> impl Iterator<Item = &Arc<Slot>> {
        self.steps.iter().map(|s| &s.slot)
    }

    pub fn has_spans(&self) -> bool {
        self.steps.iter().any(|s| s.span.is_some())
    }

    /// Step `i`'s run, slot and whether it has a span.
    pub fn step(&self, i: usize) -> (i64, &Arc<Slot>, bool) {
        let s = &self.steps[i];
        (s.rid, &s.slot, s.span.is_some())
    }
}

/// The journal rows of one run (`?1`), keys already journaled left alone.
static JOURNAL: MultiRow = MultiRow::new(
    "INSERT OR IGNORE INTO journal(rid, step_key, value_json, ident) VALUES",
    "(?1,?#1,?#2,?#3)",
    1,
    3,
);

/// Spans sharing tid, rid, parent, kind, status and flags (`?1` to `?6`);
/// a row's own: span_id, name, started_at, ended_at, step_key, input_json.
static SPANS: MultiRow = MultiRow::new(
    "INSERT INTO spans(tid, rid, span_id, parent, kind, name, started_at, \
     ended_at, status, flags, step_key, input_json) VALUES",
    "(?1,?2,?#1,?3,?4,?#2,?#3,?#4,?5,?6,?#5,?#6)",
    6,
    6,
);

/// Inserts the journal rows of the steps at `rows` (indexes into `batch`,
/// in order; refused ones already left out). Returns, for each row whose
/// key was already journaled with another value, its index and the stored
/// value (the earlier write wins).
pub(crate) fn insert_journal(
    tx: &Connection,
    statements: &mut Statements,
    batch: &BatchedSteps,
    rows: &[usize],
) -> rusqlite::Result<Vec<(usize, String)>> {
    let mut winners = Vec::new();
    let mut at = 0;
    while at < rows.len() {
        let rid = batch.steps[rows[at]].rid;
        let end = multirow::run_end(at, rows.len(), |i| batch.steps[rows[i]].rid == rid);
        for chunk in multirow::chunks(at..end) {
            let chunk = &rows[chunk];
            let inserted = statements.execute_rows(tx, &JOURNAL, chunk.len(), |p| {
                p.set(1, rid)?;
                for (i, &r) in chunk.iter().enumerate() {
                    let s = &batch.steps[r];
                    let b = JOURNAL.base(i);
                    p.set(b + 1, batch.get(s.key))?;
                    p.set(b + 2, batch.get(s.value))?;
                    p.set(b + 3, s.ident.map(|t| batch.get(t)))?;
                }
                Ok(())
            })?;
            if inserted < chunk.len() {
                // Some keys were journaled already: read what they hold.
                let mut read = tx.prepare_cached(
                    "SELECT value_json FROM journal WHERE rid = ?1 AND step_key = ?2",
                )?;
                for &r in chunk {
                    let s = &batch.steps[r];
                    let stored: String =
                        read.query_row((rid, batch.get(s.key)), |row| row.get(0))?;
                    if stored != batch.get(s.value) {
                        winners.push((r, stored));
                    }
                }
            }
        }
        at = end;
    }
    Ok(winners)
}

/// Inserts the spans of the steps at `rows` (indexes into `batch`, in
/// order, each with a span; refused ones already left out), under the
/// trace ids cached in `traces`.
pub(crate) fn insert_spans(
    tx: &Connection,
    traces: &mut HashMap<String, i64>,
    statements: &mut Statements,
    batch: &BatchedSteps,
    rows: &[usize],
) -> rusqlite::Result<()> {
    let span = |r: usize| {
        let s = &batch.steps[r];
        (s.rid, s.span.as_ref().expect("a span row has a span"))
    };
    let text = |t: Option<Text>| t.map(|t| batch.get(t));
    let mut last_trace: Option<(&Arc<str>, i64, i64)> = None;
    let mut span_ids: Vec<StoredId> = Vec::new();
    let mut at = 0;
    while at < rows.len() {
        let (rid, first) = span(rows[at]);
        // The tid depends on the run too (a run's own trace is `-rid`).
        let tid = match last_trace {
            Some((t, r, tid))
                if r == rid && (Arc::ptr_eq(t, &first.trace) || **t == *first.trace) =>
            {
                tid
            }
            _ => {
                let tid = trace_tid(tx, traces, &first.trace, Some(rid))?;
                last_trace = Some((&first.trace, rid, tid));
                tid
            }
        };
        let parent = text(first.parent);
        let kind = batch.get(first.kind);
        let status = batch.get(first.status);
        // The run of spans sharing these values.
        let end = multirow::run_end(at, rows.len(), |i| {
            let (r, s) = span(rows[i]);
            r == rid
                && s.flags == first.flags
                && text(s.parent) == parent
                && batch.get(s.kind) == kind
                && batch.get(s.status) == status
                && (Arc::ptr_eq(&s.trace, &first.trace) || s.trace == first.trace)
        });
        let parent = parent.map(encode_id);
        let flags = first.flags;
        for chunk in multirow::chunks(at..end) {
            let chunk = &rows[chunk];
            // Bound without a copy: the ids stay here until the insert ran.
            span_ids.clear();
            span_ids.extend(
                chunk
                    .iter()
                    .map(|&r| encode_id(batch.get(span(r).1.span_id))),
            );
            statements.execute_rows(tx, &SPANS, chunk.len(), |p| {
                p.set(1, tid)?;
                p.set(2, rid)?;
                p.set(3, &parent)?;
                p.set(4, kind)?;
                p.set(5, status)?;
                p.set(6, flags)?;
                for (i, (&r, id)) in chunk.iter().zip(&span_ids).enumerate() {
                    let (_, s) = span(r);
                    let b = SPANS.base(i);
                    p.set(b + 1, id)?;
                    p.set(b + 2, batch.get(s.name))?;
                    p.set(b + 3, s.started_at)?;
                    p.set(b + 4, s.ended_at)?;
                    p.set(b + 5, text(s.step_key))?;
                    p.set(b + 6, text(s.input))?;
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
    use crate::store::sqlite::multirow::stored_rows;
    use crate::store::sqlite::open::open_connection;
    use crate::store::sqlite::rows::insert_span;
    use crate::store::SpanRecord;
    use crate::store::SpanRow;

    #[test]
    fn multi_row_inserts_store_the_rows_of_the_general_inserts() {
        let dir =
            std::env::temp_dir().join(format!("composeai-batched-{}", crate::ids::new_ulid()));
        std::fs::create_dir_all(&dir).unwrap();
        let trace: Arc<str> = Arc::from(crate::ids::new_ulid().as_str());
        let other: Arc<str> = Arc::from(crate::ids::new_ulid().as_str());
        let root = crate::ids::new_ulid();
        // 83 steps: runs of shared values broken by the run, the parent, the
        // kind, the status, the output flag, a foreign id and another
        // trace, so every statement size is used; some with no span.
        type Step = (i64, String, String, Option<(Arc<str>, SpanRow)>);
        let steps: Vec<Step> = (0..83)
            .map(|i| {
                let key = format!("scope/step{}#{i}", i % 3);
                let value = format!("{{\"n\":{i}}}");
                let span = SpanRow {
                    span_id: if i == 12 {
                        "not a ulid".into()
                    } else {
                        crate::ids::new_ulid()
                    },
                    parent_span_id: match i {
                        0 => None,
                        41 => Some("foreign parent".into()),
                        _ => Some(root.clone()),
                    },
                    kind: if i == 50 { "llm".into() } else { "task".into() },
                    name: format!("step{}", i % 3),
                    started_at: 1_700_000_000.25 + i as f64,
                    ended_at: (i != 7).then_some(1_700_000_000.5 + i as f64),
                    status: if i == 60 { "error".into() } else { "ok".into() },
                    replayed: i == 33,
                    step_key: (i != 20).then(|| key.clone()),
                    input_json: (i % 4 != 1).then(|| format!("{{\"args\":[{i}]}}")),
                    output_json: (i % 17 != 5 && i != 20).then(|| value.clone()),
                    ..Default::default()
                };
                assert!(SpanView::of(&span, &value).is_some());
                let tr = if i == 70 {
                    other.clone()
                } else {
                    trace.clone()
                };
                let rid = 1 + (i / 60) as i64;
                (rid, key, value, (i % 29 != 3).then_some((tr, span)))
            })
            .collect();
        let mut stored = Vec::new();
        for (name, batched) in [("a.db", true), ("b.db", false)] {
            let conn = open_connection(dir.join(name).to_str().unwrap(), false).unwrap();
            // One key already journaled with another value, one with the same.
            conn.execute_batch(
                "INSERT INTO journal(rid, step_key, value_json) VALUES(1, 'scope/step1#4', 'earlier');
                 INSERT INTO journal(rid, step_key, value_json) VALUES(1, 'scope/step2#5', '{\"n\":5}');",
            )
            .unwrap();
            let mut traces = HashMap::new();
            let mut statements = Statements::default();
            if batched {
                let slot = Arc::new(Slot::default());
                let mut batch = BatchedSteps::default();
                for (rid, key, value, span) in &steps {
                    let view = span
                        .as_ref()
                        .map(|(t, s)| (t, SpanView::of(s, value).unwrap()));
                    batch.push(*rid, key, value, None, view, &slot);
                }
                let all: Vec<usize> = (0..steps.len()).collect();
                let with_span: Vec<usize> = all
                    .iter()
                    .copied()
                    .filter(|&i| steps[i].3.is_some())
                    .collect();
                let winners = insert_journal(&conn, &mut statements, &batch, &all).unwrap();
                assert_eq!(winners, vec![(4, "earlier".to_string())]);
                insert_spans(&conn, &mut traces, &mut statements, &batch, &with_span).unwrap();
            } else {
                for (rid, key, value, span) in &steps {
                    crate::store::sqlite::rows::insert_journal(&conn, *rid, key, value).unwrap();
                    if let Some((t, s)) = span {
                        let rec = SpanRecord {
                            trace_id: t.to_string(),
                            rid: Some(*rid),
                            span: s.clone(),
                            output_in_journal: s.output_json.is_some(),
                        };
                        insert_span(&conn, &mut traces, &mut statements, &rec).unwrap();
                    }
                }
            }
            stored.push((
                stored_rows(&conn, "SELECT * FROM journal ORDER BY rid, step_key"),
                stored_rows(&conn, "SELECT * FROM spans ORDER BY sid"),
            ));
        }
        assert_eq!(stored[0].0.len(), 83);
        assert_eq!(stored[0].1.len(), 80);
        assert_eq!(stored[0], stored[1]);
        std::fs::remove_dir_all(&dir).ok();
    }
}
