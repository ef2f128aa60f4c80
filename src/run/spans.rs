//! An attempt's spans: queued with the next commit, under the run's rid
//! once its row is stored, and in compact form for replayed steps.

use super::Attempt;
use crate::journal::StepKey;
use crate::store::{SpanRecord, SpanRow};
use std::sync::Arc;

impl Attempt {
    pub(super) fn record(
        &self,
        rid: i64,
        span: SpanRow,
        journal_value: Option<&str>,
    ) -> SpanRecord {
        SpanRecord::of_step(self.trace_id(), rid, span, journal_value)
    }

    pub fn trace_id(&self) -> &str {
        self.run.trace_id.as_deref().unwrap_or("")
    }

    /// Hands a finished span of this run to the span tap, if one is set.
    pub(super) fn tap(&self, span: Option<&SpanRow>) {
        if let (true, Some(span)) = (crate::span_tap::on(), span) {
            crate::span_tap::emit(self.trace_id(), Some(&self.run.run_id), span);
        }
    }

    /// Queues a finished span of this run (written with the next commit).
    pub fn queue_span(&self, span: SpanRow) {
        if self.replay_only {
            return;
        }
        self.tap(Some(&span));
        self.queue_tapped_span(span);
    }

    /// `queue_span` of a span already handed to the tap.
    pub(super) fn queue_tapped_span(&self, span: SpanRow) {
        let in_journal = span
            .step_key
            .as_deref()
            .and_then(|k| self.journal.lock().get(k));
        let record = self.record(0, span, in_journal.as_deref());
        self.queue_record(record);
    }

    /// Queues a span of this run under its rid or, while the row's insert
    /// is queued, to be written after the row.
    pub(super) fn queue_record(&self, mut record: SpanRecord) {
        if self.replay_only {
            return;
        }
        match self.row.committed() {
            Some(Ok(rid)) => {
                record.rid = Some(rid);
                self.store.queue_span(record);
            }
            // A lost row has nothing to attach spans to; the attempt fails
            // where it settles.
            Some(Err(_)) => {}
            None => self.store.queue_row_span(&self.row, record),
        }
    }

    /// Queues the span of a step replayed from the journal: finished at
    /// `at`, status `ok`, its output the journaled value (stored by
    /// reference) when `with_output`.
    #[allow(clippy::too_many_arguments)]
    pub fn queue_replayed_span(
        &self,
        span_id: String,
        parent_span_id: Option<String>,
        kind: String,
        name: String,
        at: f64,
        step_key: String,
        with_output: bool,
    ) {
        if self.replay_only {
            return;
        }
        if crate::span_tap::on() {
            self.tap_replayed(
                &span_id,
                parent_span_id.as_deref(),
                &kind,
                &name,
                at,
                &step_key,
                with_output,
            );
        }
        match (crate::ids::encode_id(&span_id), StepKey::parse(&step_key)) {
            (crate::ids::StoredId::Bytes(id), Some(key)) => self.queue_replayed_untapped(
                id,
                parent_span_id.as_deref(),
                kind.into(),
                &name,
                at,
                key,
                with_output,
            ),
            _ => {
                let span = SpanRow {
                    span_id,
                    parent_span_id,
                    kind,
                    name,
                    started_at: at,
                    ended_at: Some(at),
                    status: "ok".into(),
                    replayed: true,
                    step_key: Some(step_key),
                    ..Default::default()
                };
                self.queue_record(SpanRecord {
                    trace_id: self.trace_id().to_string(),
                    rid: None,
                    span,
                    output_in_journal: with_output,
                });
            }
        }
    }

    /// `queue_replayed_span` of a span id in its stored form.
    #[allow(clippy::too_many_arguments)]
    pub fn queue_replayed(
        &self,
        span_id: [u8; 16],
        parent_span_id: Option<&str>,
        kind: std::borrow::Cow<'static, str>,
        name: &str,
        at: f64,
        step_key: StepKey,
        with_output: bool,
    ) {
        if self.replay_only {
            return;
        }
        if crate::span_tap::on() {
            self.tap_replayed(
                &ulid::Ulid::from_bytes(span_id).to_string(),
                parent_span_id,
                &kind,
                name,
                at,
                &step_key.to_string(),
                with_output,
            );
        }
        self.queue_replayed_untapped(
            span_id,
            parent_span_id,
            kind,
            name,
            at,
            step_key,
            with_output,
        );
    }

    /// The span row of a replayed step, handed to the tap: its output is
    /// the journaled value.
    #[allow(clippy::too_many_arguments)]
    fn tap_replayed(
        &self,
        span_id: &str,
        parent_span_id: Option<&str>,
        kind: &str,
        name: &str,
        at: f64,
        step_key: &str,
        with_output: bool,
    ) {
        let output_json = if with_output {
            self.journal.lock().get(step_key).map(|v| v.to_string())
        } else {
            None
        };
        let span = SpanRow {
            span_id: span_id.to_string(),
            parent_span_id: parent_span_id.map(str::to_string),
            kind: kind.to_string(),
            name: name.to_string(),
            started_at: at,
            ended_at: Some(at),
            status: "ok".into(),
            replayed: true,
            step_key: Some(step_key.to_string()),
            output_json,
            ..Default::default()
        };
        self.tap(Some(&span));
    }

    /// `queue_replayed` of a span already handed to the tap.
    #[allow(clippy::too_many_arguments)]
    fn queue_replayed_untapped(
        &self,
        span_id: [u8; 16],
        parent_span_id: Option<&str>,
        kind: std::borrow::Cow<'static, str>,
        name: &str,
        at: f64,
        step_key: StepKey,
        with_output: bool,
    ) {
        fn shared(last: &mut Option<Arc<str>>, text: &str) -> Arc<str> {
            match last {
                Some(s) if **s == *text => s.clone(),
                _ => last.insert(Arc::from(text)).clone(),
            }
        }
        let (name, parent_span_id) = {
            let mut last = self.replay_names.lock();
            let (names, parents) = &mut *last;
            (
                shared(names, name),
                parent_span_id.map(|p| shared(parents, p)),
            )
        };
        let span = crate::store::spans::ReplayedSpan {
            trace_id: self.trace.clone(),
            rid: 0,
            span_id,
            parent_span_id,
            kind,
            name,
            at,
            step_key,
            output_in_journal: with_output,
        };
        match self.row.committed() {
            Some(Ok(rid)) => self
                .store
                .queue_replayed(crate::store::spans::ReplayedSpan { rid, ..span }),
            Some(Err(_)) => {}
            None => {
                let mut record = span.into_record();
                record.rid = None;
                self.store.queue_row_span(&self.row, record);
            }
        }
    }
}
