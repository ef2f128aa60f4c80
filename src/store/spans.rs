//! Spans in the compact forms the hot paths queue them in: a replayed
//! step's span, a batch-durability step's span borrowed from its maker, and
//! a task step's span read back.

use crate::journal::StepKey;
use crate::store::rows::{SpanRecord, SpanRow};
use crate::store::slot::{FLAG_OUTPUT_IN_JOURNAL, FLAG_REPLAYED};
use std::borrow::Cow;
use std::sync::Arc;

/// The span of a step replayed from the journal: finished when it started,
/// status `ok`, no input, its output the journaled value (stored by
/// reference) when `output_in_journal`.
#[derive(Debug, Clone)]
pub struct ReplayedSpan {
    pub trace_id: Arc<str>,
    pub rid: i64,
    /// A ULID, in its 16-byte stored form.
    pub span_id: [u8; 16],
    /// Shared with the replay's other spans (see `Attempt::queue_replayed`).
    pub parent_span_id: Option<Arc<str>>,
    pub kind: Cow<'static, str>,
    pub name: Arc<str>,
    pub at: f64,
    /// Its text is written by the inserting thread.
    pub step_key: StepKey,
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
                parent_span_id: self.parent_span_id.map(|p| p.to_string()),
                kind: self.kind.into_owned(),
                name: self.name.to_string(),
                started_at: self.at,
                ended_at: Some(self.at),
                status: "ok".into(),
                replayed: true,
                step_key: Some(self.step_key.to_string()),
                ..Default::default()
            },
            output_in_journal: self.output_in_journal,
        }
    }

    /// Its `spans.flags`.
    pub fn flags(&self) -> i64 {
        if self.output_in_journal {
            FLAG_REPLAYED | FLAG_OUTPUT_IN_JOURNAL
        } else {
            FLAG_REPLAYED
        }
    }
}

/// A step's span without attributes, usage or error, its output none or
/// the journaled value, borrowed from its maker (a task step builds no
/// `SpanRow` for it under batch durability).
#[derive(Clone, Copy)]
pub struct SpanView<'a> {
    pub span_id: &'a str,
    pub parent_span_id: Option<&'a str>,
    pub kind: &'a str,
    pub name: &'a str,
    pub started_at: f64,
    pub ended_at: Option<f64>,
    pub status: &'a str,
    pub replayed: bool,
    pub step_key: Option<&'a str>,
    pub input_json: Option<&'a str>,
    /// The output is the step's journaled value.
    pub output: bool,
}

impl<'a> SpanView<'a> {
    /// The view of `span` of a step journaling `value`, when it has no
    /// attributes, usage or error, and no output or the journaled one.
    pub fn of(span: &'a SpanRow, value: &str) -> Option<SpanView<'a>> {
        let plain = span.attributes_json.is_none()
            && span.usage.is_none()
            && span.error_json.is_none()
            && match &span.output_json {
                None => true,
                Some(out) => span.step_key.is_some() && out == value,
            };
        plain.then(|| SpanView {
            span_id: &span.span_id,
            parent_span_id: span.parent_span_id.as_deref(),
            kind: &span.kind,
            name: &span.name,
            started_at: span.started_at,
            ended_at: span.ended_at,
            status: &span.status,
            replayed: span.replayed,
            step_key: span.step_key.as_deref(),
            input_json: span.input_json.as_deref(),
            output: span.output_json.is_some(),
        })
    }

    /// The same span as a row, its output `value` when it has one.
    pub fn to_row(&self, value: &str) -> SpanRow {
        SpanRow {
            span_id: self.span_id.to_owned(),
            parent_span_id: self.parent_span_id.map(str::to_owned),
            kind: self.kind.to_owned(),
            name: self.name.to_owned(),
            started_at: self.started_at,
            ended_at: self.ended_at,
            status: self.status.to_owned(),
            replayed: self.replayed,
            step_key: self.step_key.map(str::to_owned),
            attributes_json: None,
            usage: None,
            error_json: None,
            input_json: self.input_json.map(str::to_owned),
            output_json: self.output.then(|| value.to_owned()),
        }
    }
}

/// A finished `ok` span of a journaled task step.
#[derive(Debug, Clone, Default)]
pub struct StepSpanRow {
    pub span_id: String,
    pub parent_span_id: Option<String>,
    pub name: String,
    pub started_at: f64,
    pub ended_at: Option<f64>,
    pub replayed: bool,
    pub step_key: Option<String>,
    pub attributes_json: Option<String>,
    pub input_json: Option<String>,
    /// The output, read from the journal when stored by reference.
    pub output_json: Option<String>,
}
