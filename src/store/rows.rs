//! The rows the `Store` trait reads and writes: runs, spans, interrupts,
//! agent snapshots, chats, settlements, and the slot a queued run insert
//! gets its rid in.

use crate::error::CoreResult;

/// What a resumed attempt starts from, read when its lease was taken.
pub struct Claim {
    pub row: RunRow,
    pub journal: crate::journal::Journal,
    /// Where the attempt's spans begin (see `Store::span_mark`), when the
    /// claim read it.
    pub span_mark: Option<i64>,
}

/// A `runs` row.
#[derive(Debug, Clone, Default)]
pub struct RunRow {
    pub rid: i64,
    pub run_id: String,
    pub kind: String,
    pub name: String,
    pub status: String,
    pub created_at: f64,
    pub updated_at: f64,
    pub trace_id: Option<String>,
    pub fingerprint: Option<String>,
    pub args_json: Option<String>,
    pub output_json: Option<String>,
    pub error_json: Option<String>,
    pub budget_json: Option<String>,
    /// The module defining the run's flow (None for runs stored before it
    /// was recorded, and for runs not started from a module's function).
    pub module: Option<String>,
}

impl RunRow {
    /// The row of `new` as just inserted at `t` under `rid`, in `status`.
    pub fn inserted(new: &NewRun, rid: i64, status: &str, t: f64) -> RunRow {
        RunRow {
            rid,
            run_id: new.run_id.clone(),
            kind: new.kind.clone(),
            name: new.name.clone(),
            status: status.into(),
            created_at: t,
            updated_at: t,
            trace_id: Some(new.trace_id.clone()),
            fingerprint: new.fingerprint.clone(),
            args_json: new.args_json.clone(),
            output_json: None,
            error_json: None,
            budget_json: new.budget_json.clone(),
            module: new.module.clone(),
        }
    }
}

/// What a caller supplies to create a run.
#[derive(Debug, Clone, Default)]
pub struct NewRun {
    pub run_id: String,
    pub trace_id: String,
    pub kind: String,
    pub name: String,
    pub fingerprint: Option<String>,
    pub args_json: Option<String>,
    pub budget_json: Option<String>,
    /// The module defining the flow, so a message can name the import.
    pub module: Option<String>,
}

/// Token usage and cost of an `llm` span.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageRow {
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cache_read_tokens: i64,
    pub cache_creation_tokens: i64,
    pub reasoning_tokens: i64,
    pub cost_usd: Option<f64>,
    pub cost_complete: bool,
}

/// A finished span, as persisted.
#[derive(Debug, Clone, Default)]
pub struct SpanRow {
    pub span_id: String,
    pub parent_span_id: Option<String>,
    pub kind: String,
    pub name: String,
    pub started_at: f64,
    pub ended_at: Option<f64>,
    pub status: String,
    pub replayed: bool,
    /// `attributes["step_key"]`, kept in its own column (it is on most rows).
    pub step_key: Option<String>,
    /// The other attributes, encoded; `None` when there are none.
    pub attributes_json: Option<String>,
    pub usage: Option<UsageRow>,
    pub error_json: Option<String>,
    pub input_json: Option<String>,
    pub output_json: Option<String>,
}

/// A span with the run and trace it belongs to.
#[derive(Debug, Clone)]
pub struct SpanRecord {
    pub trace_id: String,
    pub rid: Option<i64>,
    pub span: SpanRow,
    /// The span's output equals the journal value under its step key, so
    /// only the reference is stored.
    pub output_in_journal: bool,
}

impl SpanRecord {
    /// `span` of run `rid` in trace `trace_id`; its output is stored by
    /// reference when it is the step's journaled value.
    pub fn of_step(trace_id: &str, rid: i64, span: SpanRow, journal_value: Option<&str>) -> Self {
        let output_in_journal = match (&span.output_json, journal_value) {
            (Some(out), Some(v)) => span.step_key.is_some() && out == v,
            _ => false,
        };
        SpanRecord {
            trace_id: trace_id.to_string(),
            rid: Some(rid),
            span,
            output_in_journal,
        }
    }
}

/// A `chats` row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatRow {
    pub chat_id: String,
    pub agent_name: String,
    pub system: Option<String>,
    pub model: Option<String>,
    pub messages_json: String,
    pub created_at: f64,
    pub updated_at: f64,
}

/// A pending human interrupt.
#[derive(Debug, Clone, PartialEq)]
pub struct InterruptRow {
    pub interrupt_id: String,
    pub kind: String,
    pub question: Option<String>,
    pub payload_json: Option<String>,
}

/// An agent loop's snapshot for `(run, scope_key)`: conversation, turn and
/// the results of a partly finished tool batch.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AgentStateRow {
    pub scope_key: String,
    pub messages_json: String,
    pub partial_results_json: Option<String>,
    pub turn: i64,
}

/// Spend of a run's earlier attempts: `(tokens, usd)` in all, and under
/// each journaled agent step (BUDGET-7).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PriorSpend {
    pub total: (i64, f64),
    pub by_step: std::collections::HashMap<String, (i64, f64)>,
}

/// How a run attempt ends.
#[derive(Debug, Clone, Default)]
pub struct Settlement {
    pub status: String,
    pub output_json: Option<String>,
    pub error_json: Option<String>,
    pub pending: Vec<InterruptRow>,
    /// Agent snapshots written with the settlement (a pause mid-batch).
    pub agent_states: Vec<AgentStateRow>,
    /// What a parked run waits for (a timer or a signal).
    pub wait: Option<crate::store::durable::WaitRow>,
}

/// Where a run row created through the store's write queue
/// (`Store::create_run_queued`) gets its rid: set inside the transaction
/// that inserts it, for the writes that follow in the same transaction, and
/// kept once that transaction commits (or the error that lost it).
#[derive(Default)]
pub struct RowSlot {
    in_tx: std::sync::atomic::AtomicI64,
    /// The committed rid (0: not yet), read without a lock on every
    /// journal write.
    rid: std::sync::atomic::AtomicI64,
    error: parking_lot::Mutex<Option<crate::error::CoreError>>,
}

impl RowSlot {
    /// The slot of a row inserted before it was handed out.
    pub fn stored(rid: i64) -> std::sync::Arc<RowSlot> {
        let slot = RowSlot::default();
        slot.in_tx.store(rid, std::sync::atomic::Ordering::Release);
        slot.rid.store(rid, std::sync::atomic::Ordering::Release);
        std::sync::Arc::new(slot)
    }

    /// The committed rid, the error that lost the insert, or `None` while
    /// the insert is still queued.
    pub fn committed(&self) -> Option<CoreResult<i64>> {
        match self.rid.load(std::sync::atomic::Ordering::Acquire) {
            0 => self.error.lock().clone().map(Err),
            rid => Some(Ok(rid)),
        }
    }

    /// The rid inside the store's transaction that inserted the row (or any
    /// later one); 0 before the insert and after a failed one.
    pub fn in_tx(&self) -> i64 {
        self.in_tx.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Called by the store's writer, which holds its connection.
    pub(crate) fn inserted(&self, rid: i64) {
        self.in_tx.store(rid, std::sync::atomic::Ordering::Release);
    }

    pub(crate) fn resolve(&self, outcome: CoreResult<i64>) {
        match outcome {
            Ok(rid) => self.rid.store(rid, std::sync::atomic::Ordering::Release),
            Err(e) => {
                self.in_tx.store(0, std::sync::atomic::Ordering::Release);
                *self.error.lock() = Some(e);
            }
        }
    }
}
