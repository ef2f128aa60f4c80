//! The `compose` CLI's queries on a PostgreSQL store (STORE-2): the same
//! rows as `query` reads from SQLite, so every command prints the same.

use crate::error::CoreResult;
use crate::ids::decode_id;
use crate::runtime::block_on;
use crate::store::postgres::inner::PgStore;
use crate::store::postgres::sql::{read_run, RUN_COLUMNS};
use crate::store::query::{
    model_attribute, parse_error, CostBucket, CostsBy, LocalDates, RenderSpan, Resolved, RunFilter,
    RunSummary, StoredSpan,
};
use crate::store::slot::FLAG_REPLAYED;
use crate::store::{InterruptRow, RunRow, UsageRow};
use std::collections::HashMap;
use tokio_postgres::types::ToSql;

/// A span's output JSON: the column, or the journal value it references.
const OUTPUT_JSON: &str = "CASE WHEN s.flags & 2 <> 0 THEN (SELECT j.value_json FROM journal j \
     WHERE j.rid = s.rid AND j.step_key = s.step_key) ELSE s.output_json END";

impl PgStore {
    fn cli_rows(
        &self,
        sql: &str,
        p: &[&(dyn ToSql + Sync)],
    ) -> CoreResult<Vec<tokio_postgres::Row>> {
        block_on(async {
            let c = self.client().await?;
            let st = c.prepare_cached(sql).await.map_err(self.err())?;
            c.query(&st, p).await.map_err(self.err())
        })
    }

    /// Whether the database holds a composeai schema (the CLI never
    /// creates one).
    pub fn cli_has_store(&self) -> CoreResult<bool> {
        Ok(self
            .cli_rows("SELECT to_regclass('runs') IS NOT NULL", &[])?
            .first()
            .is_some_and(|r| r.get::<_, bool>(0)))
    }

    fn run_usage(&self, run: &RunRow) -> CoreResult<(i64, i64, Option<f64>, bool)> {
        let Some(trace_id) = run.trace_id.as_deref() else {
            return Ok((0, 0, None, true));
        };
        let rows = self.cli_rows(
            "SELECT COALESCE(SUM(COALESCE(input_tokens, 0)), 0)::BIGINT, \
                    COALESCE(SUM(COALESCE(output_tokens, 0)), 0)::BIGINT, \
                    SUM(cost_usd), COALESCE(BOOL_AND(cost_complete), TRUE) \
             FROM spans WHERE trace_id = $1 AND rid = $2 AND kind = 'llm'",
            &[&trace_id, &run.rid],
        )?;
        let r = &rows[0];
        Ok((r.get(0), r.get(1), r.get(2), r.get(3)))
    }

    /// `query::list_runs` (OBS-31); with `matching`, only runs owning a
    /// span whose name or payload matches those words (OBS-31 `-q`).
    pub fn cli_list_runs(
        &self,
        f: &RunFilter,
        matching: Option<&str>,
    ) -> CoreResult<Vec<RunSummary>> {
        // Tokens as FTS5's unicode61 tokenizer makes them (runs of letters
        // and digits, case folded); the span name weighs `A`, payloads `B`.
        let search = if matching.is_some() {
            let words = "regexp_replace(s.name, '[^[:alnum:]]+', ' ', 'g')";
            let payload = format!(
                "regexp_replace(COALESCE(s.input_json, '') || ' ' || \
                 COALESCE({OUTPUT_JSON}, ''), '[^[:alnum:]]+', ' ', 'g')"
            );
            format!(
                "AND rid IN (SELECT s.rid FROM spans s WHERE s.rid IS NOT NULL AND \
                 (setweight(to_tsvector('simple', {words}), 'A') || \
                  setweight(to_tsvector('simple', {payload}), 'B')) @@ to_tsquery('simple', $5))"
            )
        } else {
            "AND $5::TEXT IS NULL".to_string()
        };

        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM runs \
             WHERE ($1::TEXT[] IS NULL OR status = ANY($1)) \
               AND ($2::TEXT[] IS NULL OR kind = ANY($2)) \
               AND ($3::FLOAT8 IS NULL OR created_at >= $3) {search} \
               AND ($6::FLOAT8 IS NULL OR created_at < $6 OR (created_at = $6 \
                 AND rid < (SELECT b.rid FROM runs b WHERE b.run_id = $7::TEXT))) \
               AND ($8::TEXT IS NULL OR name = $8) AND ($9::FLOAT8 IS NULL OR created_at < $9) \
             ORDER BY created_at DESC, rid DESC LIMIT $4"
        );
        let limit = f.limit.max(0);
        let (before_at, before_id) = f.before.clone().unzip();
        let status = (!f.status.is_empty()).then(|| f.status.clone());
        let kind = (!f.kind.is_empty()).then(|| f.kind.clone());
        let runs: Vec<RunRow> = self
            .cli_rows(
                &sql,
                &[
                    &status, &kind, &f.since, &limit, &matching, &before_at, &before_id, &f.name,
                    &f.until,
                ],
            )?
            .iter()
            .map(read_run)
            .collect();
        runs.into_iter()
            .map(|run| {
                let (input_tokens, output_tokens, cost_usd, cost_complete) =
                    self.run_usage(&run)?;
                Ok(RunSummary {
                    run,
                    tokens: input_tokens + output_tokens,
                    input_tokens,
                    output_tokens,
                    cost_usd,
                    cost_complete,
                })
            })
            .collect()
    }

    /// `compose runs -q` (OBS-31): `Err(message)` for a malformed query,
    /// with the messages FTS5 gives on SQLite.
    pub fn cli_search_runs(
        &self,
        f: &RunFilter,
        q: &str,
    ) -> CoreResult<Result<Vec<RunSummary>, String>> {
        match fts_to_tsquery(q) {
            Ok(ts) => self.cli_list_runs(f, Some(&ts)).map(Ok),
            Err(msg) => Ok(Err(msg)),
        }
    }

    pub fn cli_last_run(&self) -> CoreResult<Option<RunRow>> {
        Ok(self
            .cli_rows(
                &format!(
                    "SELECT {RUN_COLUMNS} FROM runs ORDER BY created_at DESC, rid DESC LIMIT 1"
                ),
                &[],
            )?
            .first()
            .map(read_run))
    }

    /// `query::resolve_run`: the exact id, else the single run it prefixes.
    pub fn cli_resolve_run(&self, id: &str) -> CoreResult<Resolved> {
        let by_id = format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = $1");
        if let Some(r) = self.cli_rows(&by_id, &[&id])?.first() {
            return Ok(Resolved::Found(Box::new(read_run(r))));
        }
        let mut ids: Vec<String> = self
            .cli_rows(
                "SELECT run_id FROM runs WHERE starts_with(run_id, $1)",
                &[&id],
            )?
            .iter()
            .map(|r| r.get(0))
            .collect();
        match ids.len() {
            0 => Ok(Resolved::NotFound),
            1 => {
                let run_id = ids.pop().unwrap_or_default();
                Ok(self
                    .cli_rows(&by_id, &[&run_id])?
                    .first()
                    .map_or(Resolved::NotFound, |r| {
                        Resolved::Found(Box::new(read_run(r)))
                    }))
            }
            _ => {
                ids.sort();
                Ok(Resolved::Ambiguous(ids))
            }
        }
    }

    /// `query::trace_spans_with_payloads` (payloads only when asked).
    pub fn cli_trace(&self, trace_id: &str, with_payloads: bool) -> CoreResult<Vec<StoredSpan>> {
        let payloads = if with_payloads {
            format!("s.rid, s.attributes_json, s.input_json, {OUTPUT_JSON}")
        } else {
            "s.rid, NULL::TEXT, NULL::TEXT, NULL::TEXT".to_string()
        };
        let rows = self.cli_rows(
            &format!(
                "SELECT s.span_id, s.parent, s.kind, s.name, s.started_at, s.ended_at, s.status, \
                        s.flags, s.error_json, s.input_tokens, s.output_tokens, \
                        s.cache_read_tokens, s.cache_creation_tokens, s.reasoning_tokens, \
                        s.cost_usd, s.cost_complete, {payloads}, s.step_key \
                 FROM spans s WHERE s.trace_id = $1"
            ),
            &[&trace_id],
        )?;
        let mut spans: Vec<StoredSpan> = rows
            .iter()
            .map(|r| {
                let flags: i32 = r.get(7);
                let error_json: Option<String> = r.get(8);
                let (error_type, error_message) = parse_error(error_json.as_deref());
                let input_tokens: Option<i64> = r.get(9);
                let output_tokens: Option<i64> = r.get(10);
                let cost_usd: Option<f64> = r.get(14);
                let cost_complete: Option<bool> = r.get(15);
                let has_usage =
                    input_tokens.is_some() || output_tokens.is_some() || cost_usd.is_some();
                let usage = has_usage.then(|| UsageRow {
                    input_tokens: input_tokens.unwrap_or(0),
                    output_tokens: output_tokens.unwrap_or(0),
                    cache_read_tokens: r.get::<_, Option<i64>>(11).unwrap_or(0),
                    cache_creation_tokens: r.get::<_, Option<i64>>(12).unwrap_or(0),
                    reasoning_tokens: r.get::<_, Option<i64>>(13).unwrap_or(0),
                    cost_usd,
                    cost_complete: cost_complete != Some(false),
                });
                StoredSpan {
                    span: RenderSpan {
                        span_id: decode_id(r.get::<_, &[u8]>(0)),
                        parent_span_id: r.get::<_, Option<&[u8]>>(1).map(decode_id),
                        kind: r.get(2),
                        name: r.get(3),
                        started_at: r.get(4),
                        ended_at: r.get(5),
                        status: r.get(6),
                        replayed: i64::from(flags) & FLAG_REPLAYED != 0,
                        error_type,
                        error_message,
                        usage,
                    },
                    rid: if with_payloads { r.get(16) } else { None },
                    attributes_json: r.get(17),
                    input_json: r.get(18),
                    output_json: r.get(19),
                    step_key: r.get(20),
                }
            })
            .collect();
        spans.sort_by(|a, b| {
            a.span
                .started_at
                .total_cmp(&b.span.started_at)
                .then_with(|| a.span.span_id.cmp(&b.span.span_id))
        });
        Ok(spans)
    }

    /// The pending interrupts of a run, ordered by interrupt id (bytes).
    pub fn cli_pending(&self, rid: i64) -> CoreResult<Vec<InterruptRow>> {
        let mut out: Vec<InterruptRow> = self
            .cli_rows(
                "SELECT interrupt_id, kind, question, payload_json FROM pending_interrupts \
                 WHERE rid = $1",
                &[&rid],
            )?
            .iter()
            .map(|r| InterruptRow {
                interrupt_id: r.get(0),
                kind: r.get(1),
                question: r.get(2),
                payload_json: r.get(3),
            })
            .collect();
        out.sort_by(|a, b| a.interrupt_id.cmp(&b.interrupt_id));
        Ok(out)
    }

    /// `query::llm_costs` (OBS-34).
    pub fn cli_llm_costs(
        &self,
        by: CostsBy,
        since: Option<f64>,
    ) -> CoreResult<(Vec<CostBucket>, CostBucket)> {
        let rows = self.cli_rows(
            "SELECT attributes_json, name, rid, started_at, input_tokens, output_tokens, \
             cost_usd, cost_complete FROM spans \
             WHERE kind = 'llm' AND ($1::FLOAT8 IS NULL OR started_at >= $1)",
            &[&since],
        )?;
        let names: HashMap<i64, String> = if by == CostsBy::Name {
            self.cli_rows("SELECT rid, name FROM runs", &[])?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect()
        } else {
            HashMap::new()
        };
        let mut buckets: HashMap<String, CostBucket> = HashMap::new();
        let mut total = CostBucket::new("TOTAL".to_string());
        let mut models: HashMap<String, Option<String>> = HashMap::new();
        let mut dates = LocalDates::default();
        for r in &rows {
            let tokens = r
                .get::<_, Option<i64>>(4)
                .unwrap_or(0)
                .saturating_add(r.get::<_, Option<i64>>(5).unwrap_or(0));
            let cost: Option<f64> = r.get(6);
            let complete = r.get::<_, Option<bool>>(7) != Some(false);
            total.add(tokens, cost, complete);
            let key: String = match by {
                CostsBy::Model => {
                    let model = r.get::<_, Option<String>>(0).and_then(|a| {
                        models
                            .entry(a.clone())
                            .or_insert_with(|| model_attribute(a.as_bytes()))
                            .clone()
                    });
                    model.unwrap_or_else(|| r.get(1))
                }
                CostsBy::Name => match r.get::<_, Option<i64>>(2) {
                    Some(rid) => names
                        .get(&rid)
                        .cloned()
                        .unwrap_or_else(|| "(unknown)".to_string()),
                    None => "(none)".to_string(),
                },
                CostsBy::Day => dates.date(r.get(3)),
            };
            buckets
                .entry(key.clone())
                .or_insert_with(|| CostBucket::new(key))
                .add(tokens, cost, complete);
        }
        let mut out: Vec<CostBucket> = buckets.into_values().collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok((out, total))
    }
}

/// An FTS5 query (`compose runs -q`, OBS-31) as a PostgreSQL `tsquery` over
/// the same tokens: bare terms and `"phrases"` (adjacent tokens), implicit
/// or explicit `AND`, `OR`, `NOT`, parentheses, `name:`/`content:` column
/// filters and `prefix*`.
pub fn fts_to_tsquery(q: &str) -> Result<String, String> {
    let syntax = || "fts5: syntax error near \"\"".to_string();
    if q.matches('"').count() % 2 == 1 {
        return Err("unterminated string".into());
    }
    let mut out = String::new();
    let mut want_operand = true;
    let mut depth = 0usize;
    let mut chars = q.chars().peekable();
    let push_and = |out: &mut String, want: &mut bool| {
        if !*want {
            out.push_str(" & ");
            *want = true;
        }
    };
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        if c == '(' {
            push_and(&mut out, &mut want_operand);
            out.push('(');
            depth += 1;
            chars.next();
            continue;
        }
        if c == ')' {
            if want_operand || depth == 0 {
                return Err(syntax());
            }
            depth -= 1;
            out.push(')');
            want_operand = false;
            chars.next();
            continue;
        }
        // A term: quoted, or up to whitespace or a parenthesis.
        let mut raw = String::new();
        let mut quoted = false;
        while let Some(&c) = chars.peek() {
            if c == '"' {
                quoted = !quoted;
                raw.push(c);
                chars.next();
            } else if !quoted && (c.is_whitespace() || c == '(' || c == ')') {
                break;
            } else {
                raw.push(c);
                chars.next();
            }
        }
        match raw.as_str() {
            "OR" if !want_operand => {
                out.push_str(" | ");
                want_operand = true;
                continue;
            }
            "AND" if !want_operand => {
                out.push_str(" & ");
                want_operand = true;
                continue;
            }
            "NOT" if !want_operand => {
                out.push_str(" & !");
                want_operand = true;
                continue;
            }
            _ => {}
        }
        let (weight, text) = match raw.split_once(':') {
            Some(("name", t)) if !raw.starts_with('"') => (":A", t),
            Some(("content", t)) if !raw.starts_with('"') => (":B", t),
            Some((col, _)) if !raw.starts_with('"') => {
                return Err(format!("no such column: {col}"));
            }
            _ => ("", raw.as_str()),
        };
        let prefix = text.ends_with('*');
        let words: Vec<String> = text
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(str::to_lowercase)
            .collect();
        if words.is_empty() {
            continue;
        }
        push_and(&mut out, &mut want_operand);
        let last = words.len() - 1;
        let phrase: Vec<String> = words
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let star = if prefix && i == last { "*" } else { "" };
                let tag = match (weight, star) {
                    ("", "") => String::new(),
                    ("", _) => ":*".to_string(),
                    (w, "") => w.to_string(),
                    (w, _) => format!("{w}*"),
                };
                format!("'{w}'{tag}")
            })
            .collect();
        out.push('(');
        out.push_str(&phrase.join(" <-> "));
        out.push(')');
        want_operand = false;
    }
    if want_operand || depth != 0 {
        return Err(syntax());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::fts_to_tsquery;

    fn ok(q: &str) -> String {
        fts_to_tsquery(q).unwrap()
    }

    #[test]
    fn malformed_queries_get_the_messages_fts5_gives() {
        let syntax = "fts5: syntax error near \"\"";
        assert_eq!(fts_to_tsquery("zebra AND").unwrap_err(), syntax);
        assert_eq!(fts_to_tsquery("").unwrap_err(), syntax);
        assert_eq!(fts_to_tsquery("(a").unwrap_err(), syntax);
        assert_eq!(
            fts_to_tsquery("nosuch:zebra").unwrap_err(),
            "no such column: nosuch"
        );
        assert_eq!(
            fts_to_tsquery("\"unterminated").unwrap_err(),
            "unterminated string"
        );
    }

    #[test]
    fn fts5_queries_become_tsqueries_over_the_same_tokens() {
        assert_eq!(ok("zebra"), "('zebra')");
        assert_eq!(ok("giraffe OR zebra"), "('giraffe') | ('zebra')");
        assert_eq!(ok("a b"), "('a') & ('b')");
        assert_eq!(ok("name:fetch_page"), "('fetch':A <-> 'page':A)");
        assert_eq!(ok("zebra_crossing"), "('zebra' <-> 'crossing')");
        assert_eq!(ok("\"Long Neck\""), "('long' <-> 'neck')");
        assert_eq!(ok("zeb*"), "('zeb':*)");
        assert_eq!(ok("a NOT b"), "('a') & !('b')");
        assert_eq!(ok("(a OR b) c"), "(('a') | ('b')) & ('c')");
    }
}
