//! What the read-side queries of every backend hand back (the CLI's
//! `runs`, `show`, `trace` and search): spans in the form the trace renderer
//! draws them.

use crate::store::rows::{RunRow, UsageRow};
use std::collections::HashMap;

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

/// A `runs` row with the usage of its `llm` spans (OBS-31).
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub run: RunRow,
    /// Σ(input + output tokens) over the run's `llm` spans.
    pub tokens: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    /// Σ of the non-null `cost_usd`; `None` when no call was priced.
    pub cost_usd: Option<f64>,
    /// Every `llm` span's cost is complete (true when there are none).
    pub cost_complete: bool,
}

/// Filters of `compose runs`.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    /// Keeps runs with one of these statuses (any when empty).
    pub status: Vec<String>,
    /// Keeps runs of one of these kinds (any when empty).
    pub kind: Vec<String>,
    pub name: Option<String>,
    /// Keeps runs with `created_at >= since` (Unix seconds).
    pub since: Option<f64>,
    /// Keeps runs with `created_at < until` (Unix seconds).
    pub until: Option<f64>,
    /// Keeps runs listed after the run `(created_at, run_id)` in the
    /// newest-first order: the next page of a listing.
    pub before: Option<(f64, String)>,
    pub limit: i64,
}

impl RunFilter {
    /// The statuses as a JSON array, `None` for any.
    pub fn status_json(&self) -> Option<String> {
        list_json(&self.status)
    }

    /// The kinds as a JSON array, `None` for any.
    pub fn kind_json(&self) -> Option<String> {
        list_json(&self.kind)
    }
}

fn list_json(items: &[String]) -> Option<String> {
    (!items.is_empty()).then(|| serde_json::Value::from(items.to_vec()).to_string())
}

/// The outcome of resolving a run id or prefix (OBS-30).
#[derive(Debug, Clone)]
pub enum Resolved {
    Found(Box<RunRow>),
    NotFound,
    /// Several runs share the prefix: their ids, sorted.
    Ambiguous(Vec<String>),
}

/// A stored span with what rendering does not need.
#[derive(Debug, Clone, Default)]
pub struct StoredSpan {
    pub span: RenderSpan,
    /// The run the span belongs to (`None` outside any durable run).
    pub rid: Option<i64>,
    /// The attributes other than `step_key`, encoded.
    pub attributes_json: Option<String>,
    pub input_json: Option<String>,
    /// The output JSON, read from the journal when stored by reference.
    pub output_json: Option<String>,
    /// The journal key of the step the span records, if it records one.
    pub step_key: Option<String>,
}

/// `type` and `message` of a stored `{"type", "message", "stacktrace"}`.
pub(crate) fn parse_error(text: Option<&str>) -> (Option<String>, Option<String>) {
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

/// How `llm_costs` buckets the calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CostsBy {
    /// The span attribute `model`, else the span name.
    Model,
    /// The owning run's name: `(none)` outside any run, `(unknown)` when the
    /// run row is gone.
    Name,
    /// The local date (`YYYY-MM-DD`) of `started_at`.
    Day,
}

/// One bucket of `llm` calls.
#[derive(Debug, Clone, PartialEq)]
pub struct CostBucket {
    pub key: String,
    pub calls: i64,
    /// Σ(input + output tokens).
    pub tokens: i64,
    /// Σ of the non-null `cost_usd`; `None` when no call was priced.
    pub cost_usd: Option<f64>,
    /// Some call's cost is not fully known (`cost_complete` false: unpriced,
    /// or only partly priced). A call with no cost and a complete one (a
    /// cache hit's `Usage()`) costs nothing and keeps the sum exact.
    pub incomplete: bool,
}

impl CostBucket {
    pub(crate) fn new(key: String) -> Self {
        CostBucket {
            key,
            calls: 0,
            tokens: 0,
            cost_usd: None,
            incomplete: false,
        }
    }

    pub(crate) fn add(&mut self, tokens: i64, cost: Option<f64>, complete: bool) {
        self.calls += 1;
        self.tokens = self.tokens.saturating_add(tokens);
        if let Some(c) = cost {
            self.cost_usd = Some(self.cost_usd.unwrap_or(0.0) + c);
        }
        self.incomplete |= !complete;
    }
}

/// The `model` attribute of an encoded attributes dict (`None` when absent
/// or null): a string as is, anything else as its JSON text.
pub(crate) fn model_attribute(attributes_json: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(attributes_json).ok()?;
    let mut map = v.as_object()?;
    // A dict holding a `$kind` key is stored wrapped (OBS-60).
    if map.get("$kind").and_then(|k| k.as_str()) == Some("dict") {
        map = map.get("value")?.as_object()?;
    }
    match map.get("model")? {
        serde_json::Value::Null => None,
        serde_json::Value::String(m) => Some(m.clone()),
        other => Some(other.to_string()),
    }
}

/// Python's `datetime.fromtimestamp(t)` second: microseconds rounded half
/// to even, carried into the seconds.
pub(crate) fn timestamp_second(t: f64) -> Option<i64> {
    if !t.is_finite() || t.abs() > 1e17 {
        return None;
    }
    let int = t.trunc();
    let mut us = ((t - int) * 1e6).round_ties_even();
    let mut secs = int as i64;
    if us >= 1e6 {
        secs += 1;
    } else if us < 0.0 {
        us += 1e6;
        secs -= 1;
        if us >= 1e6 {
            secs += 1;
        }
    }
    Some(secs)
}

/// The local date of Unix second `t` (`localtime_r`, as Python's
/// `datetime.fromtimestamp` uses).
pub(crate) fn local_date(t: i64) -> Option<String> {
    let tt = libc::time_t::try_from(t).ok()?;
    // SAFETY: `tm` is plain data, fully written by `localtime_r` on success;
    // both pointers are valid for the call.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let ok = unsafe { !libc::localtime_r(&tt, &mut tm).is_null() };
    ok.then(|| {
        format!(
            "{:04}-{:02}-{:02}",
            i64::from(tm.tm_year) + 1900,
            tm.tm_mon + 1,
            tm.tm_mday
        )
    })
}

/// Local dates per quarter hour: every time zone offset in use is a
/// multiple of 15 minutes, so a quarter hour almost always lies within one
/// local day. One that does not (checked at both ends) is resolved per
/// second.
#[derive(Default)]
pub(crate) struct LocalDates(pub(crate) HashMap<i64, Option<String>>);

impl LocalDates {
    const SPAN: i64 = 900;

    pub(crate) fn date(&mut self, t: f64) -> String {
        let Some(secs) = timestamp_second(t) else {
            return "(invalid date)".to_string();
        };
        let q = secs.div_euclid(Self::SPAN);
        let whole = self.0.entry(q).or_insert_with(|| {
            let first = local_date(q * Self::SPAN);
            let last = local_date(q * Self::SPAN + Self::SPAN - 1);
            if first.is_some() && first == last {
                first
            } else {
                None
            }
        });
        match whole {
            Some(d) => d.clone(),
            None => local_date(secs).unwrap_or_else(|| "(invalid date)".to_string()),
        }
    }
}
