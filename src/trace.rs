//! Span model for rendering: the tree (OBS-20 … OBS-24) and Mermaid
//! (OBS-25) views shared by `composeai.tracing` and the CLI.

use crate::store::UsageRow;

/// What rendering needs of one span.
#[derive(Debug, Clone, Default)]
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
