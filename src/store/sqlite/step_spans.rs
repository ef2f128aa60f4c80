//! The spans of an attempt's plain task steps, read back from the store.
//!
//! A flow run does not keep these spans in memory while it executes (a long
//! run would hold one object per step); its `Run.trace` reads them here on
//! first access. Only SQLite offers this; on other stores the spans stay in
//! memory.

use crate::store::spans::StepSpanRow;
use rusqlite::{params, Connection};

/// The highest span row id: spans written later have higher ones.
pub fn span_mark(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("SELECT coalesce(max(sid), 0) FROM spans", [], |r| r.get(0))
}

/// The `ok` task-step spans of run `rid` written after `mark`, in write order.
pub fn step_spans(conn: &Connection, rid: i64, mark: i64) -> rusqlite::Result<Vec<StepSpanRow>> {
    let mut st = conn.prepare_cached(
        "SELECT s.span_id, s.parent, s.name, s.started_at, s.ended_at, s.flags, s.step_key, \
                s.attributes_json, s.input_json, \
                CASE WHEN s.flags & 2 THEN (SELECT j.value_json FROM journal j \
                     WHERE j.rid = s.rid AND j.step_key = s.step_key) ELSE s.output_json END \
         FROM spans s WHERE s.rid = ?1 AND s.sid > ?2 AND s.kind = 'task' AND s.status = 'ok' \
               AND s.step_key IS NOT NULL ORDER BY s.sid",
    )?;
    let rows = st.query_map(params![rid, mark], |r| {
        let flags: i64 = r.get(5)?;
        Ok(StepSpanRow {
            span_id: crate::ids::read_id(r.get_ref(0)?).unwrap_or_default(),
            parent_span_id: crate::ids::read_id(r.get_ref(1)?),
            name: r.get(2)?,
            started_at: r.get(3)?,
            ended_at: r.get(4)?,
            replayed: flags & crate::store::slot::FLAG_REPLAYED != 0,
            step_key: r.get(6)?,
            attributes_json: r.get(7)?,
            input_json: r.get(8)?,
            output_json: r.get(9)?,
        })
    })?;
    rows.collect()
}
