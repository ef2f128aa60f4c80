//! Span model for rendering: the tree (OBS-20 … OBS-24) and Mermaid
//! (OBS-25) views shared by `composeai.tracing` and the CLI.
//!
//! Everything here is pure Rust. Number formatting reproduces Python's
//! `format(x, ".Nf")` (correctly rounded, ties to even on the exact binary
//! value, which is what Rust's `{:.N}` does) and `round(x)` (banker's
//! rounding, `f64::round_ties_even`), so `color=False` output is byte-identical
//! to the reference implementation.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

pub use crate::store::query::RenderSpan;
use crate::store::UsageRow;

const RED: &str = "\x1b[31m";
const YELLOW: &str = "\x1b[33m";
const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

/// OBS-20 glyph for a span kind. Unknown kinds render as `·`.
fn glyph(kind: &str) -> &'static str {
    match kind {
        "flow" => "▶",
        "task" => "•",
        "agent" => "◆",
        "llm" => "▸",
        "tool" => "⚙",
        "pause" => "⏸",
        "pipe" => "→",
        "aggregate" => "⇉",
        "graph" => "◇",
        _ => "·",
    }
}

// ---------------------------------------------------------------------------
// Usage arithmetic (AGENT-64 `Usage.__add__`, restricted to what is rendered)
// ---------------------------------------------------------------------------

/// The part of a summed `Usage` the renderer shows. Starts as `Usage()`:
/// no tokens, `cost_usd=None`, `cost_complete=True`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Totals {
    input_tokens: i64,
    output_tokens: i64,
    cost_usd: Option<f64>,
    cost_complete: bool,
}

impl Default for Totals {
    fn default() -> Self {
        Totals {
            input_tokens: 0,
            output_tokens: 0,
            cost_usd: None,
            cost_complete: true,
        }
    }
}

impl Totals {
    /// `self + usage` exactly as `Usage.__add__` computes it (same order of
    /// float additions, so the rendered cost matches Python's).
    fn add(&mut self, u: &UsageRow) {
        self.input_tokens = self.input_tokens.saturating_add(u.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(u.output_tokens);
        self.cost_usd = match (self.cost_usd, u.cost_usd) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
        };
        self.cost_complete = self.cost_complete && u.cost_complete;
    }

    fn of<'a>(spans: impl IntoIterator<Item = &'a RenderSpan>) -> Totals {
        let mut t = Totals::default();
        for s in spans {
            if let Some(u) = &s.usage {
                t.add(u);
            }
        }
        t
    }
}

// ---------------------------------------------------------------------------
// Python-compatible number formatting
// ---------------------------------------------------------------------------

/// `format(x, f".{prec}f")`. Rust's fixed-precision formatting is exact and
/// rounds ties to even like CPython's; only NaN is spelled differently.
fn py_fixed(x: f64, prec: usize) -> String {
    if x.is_nan() {
        return "nan".to_string();
    }
    format!("{x:.prec$}")
}

/// OBS-22 cost segment.
fn fmt_cost(cost: f64, complete: bool) -> String {
    let prefix = if complete { "" } else { "≥" };
    format!("{prefix}${}", py_fixed(cost, 4))
}

/// OBS-22 token segment (`n` > 0).
fn fmt_tokens(n: i64) -> String {
    if n < 1000 {
        format!("{n} tok")
    } else if n < 1_000_000 {
        format!("{}k tok", py_fixed(n as f64 / 1000.0, 1))
    } else {
        format!("{}M tok", py_fixed(n as f64 / 1e6, 1))
    }
}

/// OBS-22 duration segment: `round(ms)` (banker's) below one second, else
/// seconds to one decimal.
fn fmt_duration(ms: f64) -> String {
    if ms < 1000.0 {
        let r = ms.round_ties_even();
        if r.is_finite() && r.abs() < 9.0e18 {
            format!("{}ms", r as i64)
        } else {
            format!("{}ms", py_fixed(r, 0))
        }
    } else {
        format!("{}s", py_fixed(ms / 1000.0, 1))
    }
}

/// The text inside `[...]`, empty when there is nothing to show.
fn bracket(t: &Totals, duration_ms: Option<f64>) -> String {
    let mut parts: Vec<String> = Vec::with_capacity(3);
    if let Some(cost) = t.cost_usd {
        parts.push(fmt_cost(cost, t.cost_complete));
    }
    let tokens = t.input_tokens.saturating_add(t.output_tokens);
    if tokens > 0 {
        parts.push(fmt_tokens(tokens));
    }
    if let Some(ms) = duration_ms {
        parts.push(fmt_duration(ms));
    }
    parts.join(" · ")
}

/// The first line of `s` as Python's `str.splitlines()[0]` would give it
/// (empty for an empty string).
fn first_line(s: &str) -> &str {
    let end = s
        .char_indices()
        .find(|&(_, c)| {
            matches!(
                c,
                '\n' | '\r'
                    | '\x0b'
                    | '\x0c'
                    | '\x1c'
                    | '\x1d'
                    | '\x1e'
                    | '\u{85}'
                    | '\u{2028}'
                    | '\u{2029}'
            )
        })
        .map_or(s.len(), |(i, _)| i);
    &s[..end]
}

// ---------------------------------------------------------------------------
// Tree structure
// ---------------------------------------------------------------------------

/// Indices of the roots: spans with no parent or whose parent is not among
/// the spans, in input order.
fn root_indices(spans: &[RenderSpan]) -> Vec<usize> {
    let ids: HashSet<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    spans
        .iter()
        .enumerate()
        .filter(|(_, s)| match &s.parent_span_id {
            None => true,
            Some(p) => !ids.contains(p.as_str()),
        })
        .map(|(i, _)| i)
        .collect()
}

/// One node of the depth-first walk.
struct Node {
    idx: usize,
    /// Position of the parent node in the walk, `None` for roots.
    parent: Option<usize>,
    /// Number of nodes in this subtree, itself included (the subtree is the
    /// contiguous range `pos .. pos + size` of the walk).
    size: usize,
    /// Whether this is the last child of its parent (or the last root).
    last: bool,
}

/// The depth-first pre-order walk: each root, then its descendants, children
/// in input order. Every span is visited at most once, so cycles or
/// duplicate ids cannot loop.
fn walk(spans: &[RenderSpan]) -> Vec<Node> {
    let mut children: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, s) in spans.iter().enumerate() {
        if let Some(p) = &s.parent_span_id {
            children.entry(p.as_str()).or_default().push(i);
        }
    }
    let roots = root_indices(spans);
    let mut visited = vec![false; spans.len()];
    let mut nodes: Vec<Node> = Vec::with_capacity(spans.len());
    // Stack of (span index, parent node position, last-sibling flag), pushed
    // in reverse so they pop in input order.
    let mut stack: Vec<(usize, Option<usize>, bool)> = Vec::new();
    for (k, &r) in roots.iter().enumerate().rev() {
        stack.push((r, None, k + 1 == roots.len()));
    }
    while let Some((idx, parent, last)) = stack.pop() {
        if visited[idx] {
            continue;
        }
        visited[idx] = true;
        let pos = nodes.len();
        nodes.push(Node {
            idx,
            parent,
            size: 1,
            last,
        });
        if let Some(kids) = children.get(spans[idx].span_id.as_str()) {
            let kids: Vec<usize> = kids.iter().copied().filter(|&k| !visited[k]).collect();
            for (k, &c) in kids.iter().enumerate().rev() {
                stack.push((c, Some(pos), k + 1 == kids.len()));
            }
        }
    }
    // Subtree sizes, children before parents.
    for pos in (0..nodes.len()).rev() {
        if let Some(p) = nodes[pos].parent {
            nodes[p].size += nodes[pos].size;
        }
    }
    nodes
}

/// OBS-16: `error` if any root errored; else `cancelled` if any span was
/// cancelled; else `paused` if any span paused; else `running` if any root
/// is running; else `ok`.
pub fn trace_status(spans: &[RenderSpan]) -> &'static str {
    let roots = root_indices(spans);
    if roots.iter().any(|&i| spans[i].status == "error") {
        "error"
    } else if spans.iter().any(|s| s.status == "cancelled") {
        "cancelled"
    } else if spans.iter().any(|s| s.status == "paused") {
        "paused"
    } else if roots.iter().any(|&i| spans[i].status == "running") {
        "running"
    } else {
        "ok"
    }
}

fn push_decoration(out: &mut String, text: &str, code: &str, color: bool) {
    if color {
        out.push_str(code);
        out.push_str(text);
        out.push_str(RESET);
    } else {
        out.push_str(text);
    }
}

/// OBS-23 decorations of one node.
fn decorate(out: &mut String, s: &RenderSpan, color: bool) {
    match s.status.as_str() {
        "error" => {
            let ty = s.error_type.as_deref().unwrap_or("Error");
            let msg = first_line(s.error_message.as_deref().unwrap_or(""));
            push_decoration(out, &format!(" ✗ {ty}: {msg}"), RED, color);
        }
        "paused" => push_decoration(out, " ⏸ paused", YELLOW, color),
        "cancelled" => push_decoration(out, " ⊘ cancelled", YELLOW, color),
        _ => {}
    }
    if s.replayed {
        push_decoration(out, " (replayed)", DIM, color);
    }
}

/// The tree view of a trace (OBS-20 … OBS-24): header line (the status of
/// the latest root's subtree, so a resumed run reads as it now is), then each root
/// and its descendants depth-first in input order. Lines are joined by `\n`
/// with no trailing newline.
pub fn render_tree(trace_id: &str, spans: &[RenderSpan], color: bool) -> String {
    let nodes = walk(spans);
    let mut out = String::with_capacity(64 + 64 * nodes.len());

    // Header.
    let total = Totals::of(spans);
    let roots: Vec<&RenderSpan> = nodes
        .iter()
        .filter(|n| n.parent.is_none())
        .map(|n| &spans[n.idx])
        .collect();
    let root_ms = if roots.is_empty() || roots.iter().any(|r| r.ended_at.is_none()) {
        None
    } else {
        let start = roots
            .iter()
            .map(|r| r.started_at)
            .fold(f64::INFINITY, f64::min);
        let end = roots
            .iter()
            .filter_map(|r| r.ended_at)
            .fold(f64::NEG_INFINITY, f64::max);
        Some((end - start) * 1000.0)
    };
    // After a resume the trace holds one root per attempt; the header tells
    // the run's current state, which is the latest attempt's.
    let status = match nodes.iter().rposition(|n| n.parent.is_none()) {
        Some(last) => {
            let latest: Vec<RenderSpan> = nodes[last..last + nodes[last].size]
                .iter()
                .map(|n| spans[n.idx].clone())
                .collect();
            trace_status(&latest)
        }
        None => trace_status(spans),
    };
    let _ = write!(out, "trace {trace_id} — {status}");
    let head = bracket(&total, root_ms);
    if !head.is_empty() {
        let _ = write!(out, " — [{head}]");
    }

    // Nodes. `prefixes[pos]` is the prefix for the children of node `pos`.
    let mut prefixes: Vec<String> = Vec::with_capacity(nodes.len());
    for (pos, node) in nodes.iter().enumerate() {
        let s = &spans[node.idx];
        let prefix: &str = node.parent.map_or("", |p| prefixes[p].as_str());
        let child_prefix = format!("{prefix}{}", if node.last { "   " } else { "│  " });
        out.push('\n');
        out.push_str(prefix);
        out.push_str(if node.last { "└─ " } else { "├─ " });
        out.push_str(glyph(&s.kind));
        out.push(' ');
        out.push_str(&s.name);
        let usage = if s.kind == "llm" {
            Totals::of(std::iter::once(s))
        } else {
            Totals::of(nodes[pos..pos + node.size].iter().map(|n| &spans[n.idx]))
        };
        let b = bracket(&usage, s.duration_ms());
        if !b.is_empty() {
            let _ = write!(out, " [{b}]");
        }
        decorate(&mut out, s, color);
        prefixes.push(child_prefix);
    }
    out
}

/// OBS-25 escaping of a node label: `#` first, then `"`.
fn mermaid_escape(name: &str) -> String {
    name.replace('#', "#35;").replace('"', "#quot;")
}

/// The Mermaid view of a trace (OBS-25): `flowchart TD`, one node line per
/// span in the tree walk order (`s0`, `s1`, …), then one edge per
/// parent/child pair in discovery order. No trailing newline.
pub fn render_mermaid(spans: &[RenderSpan]) -> String {
    let nodes = walk(spans);
    let mut out = String::from("flowchart TD");
    for (pos, node) in nodes.iter().enumerate() {
        let s = &spans[node.idx];
        let _ = write!(
            out,
            "\ns{pos}[\"{} [{}]\"]",
            mermaid_escape(&s.name),
            s.kind
        );
    }
    for (pos, node) in nodes.iter().enumerate() {
        if let Some(p) = node.parent {
            let _ = write!(out, "\ns{p} --> s{pos}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: f64 = 1_700_000_000.0;

    fn span(id: &str, parent: Option<&str>, kind: &str, name: &str) -> RenderSpan {
        RenderSpan {
            span_id: id.into(),
            parent_span_id: parent.map(Into::into),
            kind: kind.into(),
            name: name.into(),
            started_at: T0,
            ended_at: Some(T0),
            status: "ok".into(),
            ..Default::default()
        }
    }

    /// `span` with start/end given in milliseconds after `T0`.
    fn timed(
        id: &str,
        parent: Option<&str>,
        kind: &str,
        name: &str,
        start_ms: f64,
        end_ms: f64,
    ) -> RenderSpan {
        RenderSpan {
            started_at: T0 + start_ms / 1000.0,
            ended_at: Some(T0 + end_ms / 1000.0),
            ..span(id, parent, kind, name)
        }
    }

    fn usage(input: i64, output: i64, cost: Option<f64>, complete: bool) -> UsageRow {
        UsageRow {
            input_tokens: input,
            output_tokens: output,
            cost_usd: cost,
            cost_complete: complete,
            ..Default::default()
        }
    }

    fn example() -> Vec<RenderSpan> {
        let mut flow = timed("f", None, "flow", "triage", 0.0, 1200.0);
        flow.status = "paused".into();
        let agent = timed("a", Some("f"), "agent", "classifier", 0.0, 900.0);
        let mut llm1 = timed(
            "l1",
            Some("a"),
            "llm",
            "anthropic/claude-haiku-4-5",
            0.0,
            400.0,
        );
        llm1.usage = Some(usage(1200, 260, Some(0.0027), true));
        let tool = timed("t", Some("a"), "tool", "lookup_ticket", 400.0, 450.0);
        let mut llm2 = timed(
            "l2",
            Some("a"),
            "llm",
            "anthropic/claude-haiku-4-5",
            450.0,
            900.0,
        );
        llm2.status = "error".into();
        llm2.error_type = Some("ProviderError".into());
        llm2.error_message = Some("overloaded\nretry later".into());
        llm2.usage = Some(usage(40, 0, None, false));
        let agg = timed("g", Some("f"), "aggregate", "map(tag)", 900.0, 1000.0);
        let mut tag = timed("x", Some("g"), "task", "tag[0]", 900.0, 950.0);
        tag.replayed = true;
        let mut pause = timed("p", Some("f"), "pause", "escalate", 1000.0, 1000.0);
        pause.status = "paused".into();
        vec![flow, agent, llm1, tool, llm2, agg, tag, pause]
    }

    const EXAMPLE: &str = "\
trace 01TRACEEXAMPLE — paused — [≥$0.0027 · 1.5k tok · 1.2s]
└─ ▶ triage [≥$0.0027 · 1.5k tok · 1.2s] ⏸ paused
   ├─ ◆ classifier [≥$0.0027 · 1.5k tok · 900ms]
   │  ├─ ▸ anthropic/claude-haiku-4-5 [$0.0027 · 1.5k tok · 400ms]
   │  ├─ ⚙ lookup_ticket [50ms]
   │  └─ ▸ anthropic/claude-haiku-4-5 [40 tok · 450ms] ✗ ProviderError: overloaded
   ├─ ⇉ map(tag) [100ms]
   │  └─ • tag[0] [50ms] (replayed)
   └─ ⏸ escalate [0ms] ⏸ paused";

    #[test]
    fn obs24_example_tree() {
        assert_eq!(render_tree("01TRACEEXAMPLE", &example(), false), EXAMPLE);
    }

    #[test]
    fn obs23_example_tree_colour() {
        let out = render_tree("01TRACEEXAMPLE", &example(), true);
        let expected = EXAMPLE
            .replace(
                " ✗ ProviderError: overloaded",
                "\x1b[31m ✗ ProviderError: overloaded\x1b[0m",
            )
            .replace(" ⏸ paused", "\x1b[33m ⏸ paused\x1b[0m")
            .replace(" (replayed)", "\x1b[2m (replayed)\x1b[0m");
        assert_eq!(out, expected);
        assert!(out.starts_with("trace 01TRACEEXAMPLE — paused — ["));
    }

    #[test]
    fn obs25_example_mermaid() {
        let out = render_mermaid(&example());
        let expected = "\
flowchart TD
s0[\"triage [flow]\"]
s1[\"classifier [agent]\"]
s2[\"anthropic/claude-haiku-4-5 [llm]\"]
s3[\"lookup_ticket [tool]\"]
s4[\"anthropic/claude-haiku-4-5 [llm]\"]
s5[\"map(tag) [aggregate]\"]
s6[\"tag[0] [task]\"]
s7[\"escalate [pause]\"]
s0 --> s1
s1 --> s2
s1 --> s3
s1 --> s4
s0 --> s5
s5 --> s6
s0 --> s7";
        assert_eq!(out, expected);
    }

    #[test]
    fn obs25_escaping() {
        let spans = vec![span("a", None, "task", "say \"#1\" &#quot;")];
        assert_eq!(
            render_mermaid(&spans),
            "flowchart TD\ns0[\"say #quot;#35;1#quot; &#35;quot; [task]\"]"
        );
        assert_eq!(render_mermaid(&[]), "flowchart TD");
    }

    #[test]
    fn obs16_status_precedence() {
        let mut root = span("r", None, "flow", "f");
        let mut child = span("c", Some("r"), "task", "t");
        assert_eq!(trace_status(&[root.clone(), child.clone()]), "ok");
        assert_eq!(trace_status(&[]), "ok");
        root.status = "running".into();
        assert_eq!(trace_status(&[root.clone(), child.clone()]), "running");
        child.status = "paused".into();
        assert_eq!(trace_status(&[root.clone(), child.clone()]), "paused");
        child.status = "cancelled".into();
        assert_eq!(trace_status(&[root.clone(), child.clone()]), "cancelled");
        root.status = "error".into();
        assert_eq!(trace_status(&[root.clone(), child.clone()]), "error");
        // A child's error alone does not make the trace fail.
        root.status = "ok".into();
        child.status = "error".into();
        assert_eq!(trace_status(&[root.clone(), child.clone()]), "ok");
        // A child running under a finished root is not "running".
        child.status = "running".into();
        assert_eq!(trace_status(&[root.clone(), child.clone()]), "ok");
        // An orphan (parent not in the trace) is a root.
        let mut orphan = span("o", Some("missing"), "task", "t");
        orphan.status = "error".into();
        assert_eq!(trace_status(&[root, orphan]), "error");
    }

    #[test]
    fn obs22_duration_formatting() {
        assert_eq!(fmt_duration(0.0), "0ms");
        assert_eq!(fmt_duration(0.5), "0ms");
        assert_eq!(fmt_duration(1.5), "2ms");
        assert_eq!(fmt_duration(2.5), "2ms");
        assert_eq!(fmt_duration(3.5), "4ms");
        assert_eq!(fmt_duration(999.4), "999ms");
        assert_eq!(fmt_duration(999.5), "1000ms");
        assert_eq!(fmt_duration(999.9), "1000ms");
        assert_eq!(fmt_duration(1000.0), "1.0s");
        assert_eq!(fmt_duration(1250.0), "1.2s");
        assert_eq!(fmt_duration(1350.0), "1.4s");
        assert_eq!(fmt_duration(1150.0), "1.1s"); // 1.15 is 1.149999…
        assert_eq!(fmt_duration(61_000.0), "61.0s");
        assert_eq!(fmt_duration(-0.4), "0ms");
    }

    #[test]
    fn obs22_float_ties_match_python() {
        // Values checked against CPython's format().
        assert_eq!(py_fixed(1.25, 1), "1.2");
        assert_eq!(py_fixed(0.25, 1), "0.2");
        assert_eq!(py_fixed(0.35, 1), "0.3"); // 0.34999…
        assert_eq!(py_fixed(2.675, 2), "2.67");
        assert_eq!(py_fixed(0.00005, 4), "0.0001"); // 5.000000000000000409e-05
        assert_eq!(py_fixed(0.00015, 4), "0.0001"); // 1.499999…e-04
        assert_eq!(py_fixed(0.00025, 4), "0.0003"); // 2.500000000000000052e-04
        assert_eq!(py_fixed(0.0027, 4), "0.0027");
        assert_eq!(py_fixed(0.5, 0), "0");
        assert_eq!(py_fixed(1.5, 0), "2");
        assert_eq!(py_fixed(-0.00001, 4), "-0.0000");
        assert_eq!(py_fixed(f64::NAN, 1), "nan");
        assert_eq!(py_fixed(f64::INFINITY, 1), "inf");
    }

    #[test]
    fn obs22_tokens_and_cost() {
        assert_eq!(fmt_tokens(1), "1 tok");
        assert_eq!(fmt_tokens(999), "999 tok");
        assert_eq!(fmt_tokens(1000), "1.0k tok");
        assert_eq!(fmt_tokens(1250), "1.2k tok");
        assert_eq!(fmt_tokens(999_949), "999.9k tok");
        assert_eq!(fmt_tokens(999_999), "1000.0k tok");
        assert_eq!(fmt_tokens(1_000_000), "1.0M tok");
        assert_eq!(fmt_tokens(2_250_000), "2.2M tok");
        assert_eq!(fmt_cost(0.0, true), "$0.0000");
        assert_eq!(fmt_cost(0.12345, false), "≥$0.1235"); // 0.123450000000000004
        assert_eq!(fmt_cost(12.0, true), "$12.0000");
    }

    #[test]
    fn obs22_bracket_segments() {
        let t = Totals::default();
        assert_eq!(bracket(&t, None), "");
        assert_eq!(bracket(&t, Some(5.0)), "5ms");
        let mut t = Totals::default();
        t.add(&usage(0, 0, Some(0.0), true));
        // Zero tokens are omitted but a known zero cost is shown.
        assert_eq!(bracket(&t, None), "$0.0000");
        t.add(&usage(10, 5, None, false));
        assert_eq!(bracket(&t, Some(1500.0)), "≥$0.0000 · 15 tok · 1.5s");
    }

    #[test]
    fn obs21_unfinished_and_bare_trace() {
        assert_eq!(render_tree("T", &[], false), "trace T — ok");
        let mut root = span("r", None, "flow", "main");
        root.ended_at = None;
        root.status = "running".into();
        let child = timed("c", Some("r"), "task", "step", 0.0, 12.0);
        let out = render_tree("T", &[root, child], false);
        assert_eq!(out, "trace T — running\n└─ ▶ main\n   └─ • step [12ms]");
    }

    #[test]
    fn obs21_multiple_roots_and_prefixes() {
        // Two roots (e.g. a paused attempt and its resume), nested children.
        let mut r1 = timed("r1", None, "flow", "f", 0.0, 100.0);
        r1.status = "paused".into();
        let a = timed("a", Some("r1"), "task", "a", 0.0, 10.0);
        let b = timed("b", Some("a"), "task", "b", 0.0, 5.0);
        let c = timed("c", Some("r1"), "task", "c", 10.0, 20.0);
        let r2 = timed("r2", None, "flow", "f", 2000.0, 2500.0);
        let d = timed("d", Some("r2"), "task", "d", 2000.0, 2100.0);
        let e = timed("e", Some("d"), "tool", "e", 2000.0, 2001.0);
        let out = render_tree("T", &[r1, a, b, c, r2, d, e], false);
        // The header reads the latest attempt (the resume completed).
        assert_eq!(
            out,
            "trace T — ok — [2.5s]\n\
             ├─ ▶ f [100ms] ⏸ paused\n\
             │  ├─ • a [10ms]\n\
             │  │  └─ • b [5ms]\n\
             │  └─ • c [10ms]\n\
             └─ ▶ f [500ms]\n   \
                └─ • d [100ms]\n      \
                   └─ ⚙ e [1ms]"
        );
    }

    #[test]
    fn obs21_llm_own_usage_other_rollup() {
        let mut agent = timed("a", None, "agent", "bot", 0.0, 10.0);
        agent.usage = Some(usage(100, 0, Some(0.5), true)); // rolled up with children
        let mut llm = timed("l", Some("a"), "llm", "m", 0.0, 5.0);
        llm.usage = Some(usage(10, 10, Some(0.25), true));
        let mut inner = timed("i", Some("l"), "task", "odd", 0.0, 1.0);
        inner.usage = Some(usage(1, 1, None, false));
        let out = render_tree("T", &[agent, llm, inner], false);
        assert_eq!(
            out,
            "trace T — ok — [≥$0.7500 · 122 tok · 10ms]\n\
             └─ ◆ bot [≥$0.7500 · 122 tok · 10ms]\n   \
                └─ ▸ m [$0.2500 · 20 tok · 5ms]\n      \
                   └─ • odd [2 tok · 1ms]"
        );
    }

    #[test]
    fn obs23_decorations() {
        let mut s = span("a", None, "task", "t");
        s.status = "error".into();
        s.error_type = Some("ValueError".into());
        s.error_message = Some("bad\r\nworse".into());
        s.replayed = true;
        assert_eq!(
            render_tree("T", std::slice::from_ref(&s), false),
            "trace T — error — [0ms]\n└─ • t [0ms] ✗ ValueError: bad (replayed)"
        );
        assert_eq!(
            render_tree("T", std::slice::from_ref(&s), true),
            "trace T — error — [0ms]\n└─ • t [0ms]\x1b[31m ✗ ValueError: bad\x1b[0m\x1b[2m (replayed)\x1b[0m"
        );
        s.status = "cancelled".into();
        s.replayed = false;
        assert_eq!(
            render_tree("T", std::slice::from_ref(&s), true),
            "trace T — cancelled — [0ms]\n└─ • t [0ms]\x1b[33m ⊘ cancelled\x1b[0m"
        );
        s.status = "error".into();
        s.error_type = None;
        s.error_message = None;
        assert_eq!(
            render_tree("T", std::slice::from_ref(&s), false),
            "trace T — error — [0ms]\n└─ • t [0ms] ✗ Error: "
        );
    }

    #[test]
    fn first_line_like_python_splitlines() {
        assert_eq!(first_line(""), "");
        assert_eq!(first_line("one"), "one");
        assert_eq!(first_line("one\ntwo"), "one");
        assert_eq!(first_line("one\r\ntwo"), "one");
        assert_eq!(first_line("a\u{2028}b"), "a");
        assert_eq!(first_line("\nx"), "");
    }

    #[test]
    fn cycles_and_duplicates_terminate() {
        // a <-> b form a cycle with no root: neither is rendered.
        let a = span("a", Some("b"), "task", "a");
        let b = span("b", Some("a"), "task", "b");
        let r = span("r", None, "flow", "r");
        assert_eq!(
            render_tree("T", &[a.clone(), b.clone(), r.clone()], false),
            "trace T — ok — [0ms]\n└─ ▶ r [0ms]"
        );
        // A span listing itself as parent under a duplicate id.
        let dup = span("r", Some("r"), "task", "dup");
        let out = render_tree("T", &[r, dup], false);
        assert_eq!(out, "trace T — ok — [0ms]\n└─ ▶ r [0ms]\n   └─ • dup [0ms]");
        assert_eq!(render_mermaid(&[a, b]), "flowchart TD");
    }

    #[test]
    fn header_shows_the_latest_attempt_after_a_resume() {
        let span = |id: &str, parent: Option<&str>, status: &str, t: f64| RenderSpan {
            span_id: id.into(),
            parent_span_id: parent.map(Into::into),
            kind: "flow".into(),
            name: "f".into(),
            started_at: t,
            ended_at: Some(t + 0.001),
            status: status.into(),
            ..Default::default()
        };
        let spans = vec![
            span("A", None, "paused", 0.0),
            span("A1", Some("A"), "paused", 0.0),
            span("B", None, "ok", 1.0),
        ];
        assert!(render_tree("T", &spans, false).starts_with("trace T — ok — "));
        assert_eq!(trace_status(&spans), "paused");
    }
}
