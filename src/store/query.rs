//! What the read-side queries of every backend hand back (the CLI's
//! `runs`, `show`, `trace` and search): spans in the form the trace renderer
//! draws them.

use crate::store::UsageRow;

/// What rendering needs of one span.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RenderSpan {
    pub span_id: String,
    pub parent_span_id: Option<String>,
    pub kind: String,
    pub name: String,
    pub started_at: f64,
    pub ended_at: Option<f64>,
    pub status: String,
    pub replayed: bool,
    pub error_type: Option<String>,
    pub error_message: Option<String>,
    pub usage: Option<UsageRow>,
}

impl RenderSpan {
    /// Wall time in milliseconds, `None` while the span is unfinished.
    pub fn duration_ms(&self) -> Option<f64> {
        self.ended_at.map(|end| (end - self.started_at) * 1000.0)
    }
}
