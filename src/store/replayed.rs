//! The spans of replayed steps: one is queued per replayed step, so a
//! replay queues them as fast as the flow body runs. They are queued in a
//! compact form (the span id as bytes, the trace shared) and SQLite inserts
//! a batch of them with multi-row statements; the rows are the ones a
//! `SpanRecord` of the same span would write.

use super::sqlite::{FLAG_OUTPUT_IN_JOURNAL, FLAG_REPLAYED};
use super::{SpanRecord, SpanRow};
use crate::ids::{encode_id, StoredId};
use rusqlite::Connection;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// The span of a step replayed from the journal: finished when it started,
/// status `ok`, no input, its output the journaled value (stored by
/// reference) when `output_in_journal`.
#[derive(Debug, Clone)]
pub struct ReplayedSpan {
    pub trace_id: Arc<str>,
    pub rid: i64,
    /// A ULID, in its 16-byte stored form.
    pub span_id: [u8; 16],
    pub parent_span_id: Option<String>,
    pub kind: Cow<'static, str>,
    pub name: String,
    pub at: f64,
    pub step_key: String,
    pub output_in_journal: bool,
}

impl ReplayedSpan {
    /// The same span as a general record.
    pub fn into_record(self) -> SpanRecord {
        SpanRecord {
            trace_id: self.trace_id.to_string(),
            rid: Some(self.rid),
            span: SpanRow {
                span_id: crate::ids::decode_id(&self.span_id),
                parent_span_id: self.parent_span_id,
                kind: self.kind.into_owned(),
                name: self.name,
                started_at: self.at,
                ended_at: Some(self.at),
                status: "ok".into(),
                replayed: true,
                step_key: Some(self.step_key),
                ..Default::default()
            },
            output_in_journal: self.output_in_journal,
        }
    }

    fn flags(&self) -> i64 {
        if self.output_in_journal {
            FLAG_REPLAYED | FLAG_OUTPUT_IN_JOURNAL
        } else {
            FLAG_REPLAYED
        }
    }
}

/// Rows per statement, largest first: a batch is inserted with as many of
/// the largest as fit, then the smaller ones (each prepared once per
/// connection and kept in its statement cache).
const CHUNKS: [usize; 3] = [32, 8, 1];
/// Parameters per row: tid, rid, span_id, parent, kind, name, at (started
/// and ended), flags, step_key.
const PER_ROW: usize = 9;

fn chunk_sql(rows: usize) -> &'static str {
    static SQL: OnceLock<Vec<String>> = OnceLock::new();
    let all = SQL.get_or_init(|| {
        CHUNKS
            .iter()
            .map(|&n| {
                let mut sql = String::from(
                    "INSERT INTO spans(tid, rid, span_id, parent, kind, name, started_at, \
                     ended_at, status, flags, step_key) VALUES",
                );
                for i in 0..n {
                    let b = i * PER_ROW;
                    if i > 0 {
                        sql.push(',');
                    }
                    sql.push_str(&format!(
                        "(?{},?{},?{},?{},?{},?{},?{},?{},'ok',?{},?{})",
                        b + 1,
                        b + 2,
                        b + 3,
                        b + 4,
                        b + 5,
                        b + 6,
                        b + 7,
                        b + 7,
                        b + 8,
                        b + 9
                    ));
                }
                sql
            })
            .collect()
    });
    let i = CHUNKS.iter().position(|&n| n == rows).unwrap_or(0);
    &all[i]
}

/// Inserts `spans` in order (refused ones already left out), under the
/// trace ids cached in `traces`.
pub(crate) fn insert_replayed(
    tx: &Connection,
    traces: &mut HashMap<String, i64>,
    spans: &[&ReplayedSpan],
) -> rusqlite::Result<()> {
    // A replay's spans share their trace and parent: each is resolved once.
    let mut tids: Vec<i64> = Vec::with_capacity(spans.len());
    let mut parents: Vec<Option<Arc<StoredId>>> = Vec::with_capacity(spans.len());
    let mut last_trace: Option<(&Arc<str>, i64)> = None;
    let mut last_parent: Option<(&str, Arc<StoredId>)> = None;
    for s in spans {
        let tid = match last_trace {
            Some((t, tid)) if Arc::ptr_eq(t, &s.trace_id) || **t == *s.trace_id => tid,
            _ => {
                let tid = super::sqlite::trace_tid(tx, traces, &s.trace_id)?;
                last_trace = Some((&s.trace_id, tid));
                tid
            }
        };
        tids.push(tid);
        parents.push(match s.parent_span_id.as_deref() {
            None => None,
            Some(p) => match &last_parent {
                Some((q, id)) if *q == p => Some(id.clone()),
                _ => {
                    let id = Arc::new(encode_id(p));
                    last_parent = Some((p, id.clone()));
                    Some(id)
                }
            },
        });
    }
    let mut at = 0;
    for &size in &CHUNKS {
        while spans.len() - at >= size {
            let mut st = tx.prepare_cached(chunk_sql(size))?;
            for i in 0..size {
                let s = spans[at + i];
                let b = i * PER_ROW;
                st.raw_bind_parameter(b + 1, tids[at + i])?;
                st.raw_bind_parameter(b + 2, s.rid)?;
                st.raw_bind_parameter(b + 3, &s.span_id[..])?;
                st.raw_bind_parameter(b + 4, parents[at + i].as_deref())?;
                st.raw_bind_parameter(b + 5, s.kind.as_ref())?;
                st.raw_bind_parameter(b + 6, s.name.as_str())?;
                st.raw_bind_parameter(b + 7, s.at)?;
                st.raw_bind_parameter(b + 8, s.flags())?;
                st.raw_bind_parameter(b + 9, s.step_key.as_str())?;
            }
            st.raw_execute()?;
            at += size;
        }
    }
    Ok(())
}
