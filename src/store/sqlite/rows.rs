//! The SQL of runs, journal entries, spans, interrupts and agent
//! snapshots: the statements every write path of the store shares.

use crate::error::{AtPath, CoreError, CoreResult};
use crate::ids::{encode_id, StoredId};
use crate::journal::{Journal, JournalLoader};
use crate::store::slot::{FLAG_OUTPUT_IN_JOURNAL, FLAG_REPLAYED};
use crate::store::sqlite::statements::{Params, Statements};
use crate::store::{
    AgentStateRow, InterruptRow, NewRun, RowSlot, RunRow, Settlement, SpanRecord, SpanRow,
};
use crate::time::now;
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::HashMap;
use std::sync::Arc;

/// `Some(run_id)` when run `rid` is not leased to this process (STORE-11):
/// an attempt here may journal or settle nothing then. A missing run
/// refuses nothing.
pub(crate) fn moved_away(tx: &Connection, rid: i64) -> rusqlite::Result<Option<String>> {
    Leases::new(tx).moved(rid)
}

/// The error for a write refused because run `rid` moved on.
pub(crate) fn moved_rid(tx: &Connection, rid: i64) -> CoreError {
    let run_id = tx
        .query_row("SELECT run_id FROM runs WHERE rid = ?1", [rid], |r| {
            r.get::<_, String>(0)
        })
        .unwrap_or_else(|_| format!("#{rid}"));
    crate::store::takeover::moved(&run_id)
}

/// Inserts a queued run row: running and leased, or settled; `None` when
/// the run id exists.
/// The row of a queued run (`Store::create_run_queued`), inserted settled
/// when the run ended before its row was written.
pub const QUEUED_RUN_INSERT: &str =
    "INSERT OR IGNORE INTO runs(run_id, kind, name, status, created_at, updated_at, trace_id, \
     fingerprint, args_json, budget_json, output_json, error_json, lease_owner, lease_until, \
     module) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)";

pub(crate) fn insert_run(
    tx: &Connection,
    statements: &mut Statements,
    run: &QueuedRun,
) -> rusqlite::Result<Option<i64>> {
    let new = &run.new;
    let (status, output, error, owner, until, updated) = match &run.settled {
        None => (
            "running",
            None,
            None,
            Some(run.owner.as_str()),
            Some(run.lease_until),
            run.created_at,
        ),
        Some((status, output, error)) => (
            status.as_str(),
            output.as_deref(),
            error.as_deref(),
            None,
            None,
            now(),
        ),
    };
    let n = statements.execute(tx, QUEUED_RUN_INSERT, |p| {
        p.set(1, new.run_id.as_str())?;
        p.set(2, new.kind.as_str())?;
        p.set(3, new.name.as_str())?;
        p.set(4, status)?;
        p.set(5, run.created_at)?;
        p.set(6, updated)?;
        p.set(7, new.trace_id.as_str())?;
        p.set(8, new.fingerprint.as_deref())?;
        p.set(9, new.args_json.as_deref())?;
        p.set(10, new.budget_json.as_deref())?;
        p.set(11, output)?;
        p.set(12, error)?;
        p.set(13, owner)?;
        p.set(14, until)?;
        p.set(15, new.module.as_deref())
    })?;
    Ok((n == 1).then(|| tx.last_insert_rowid()))
}

pub fn read_run_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RunRow> {
    Ok(RunRow {
        rid: r.get(0)?,
        run_id: r.get(1)?,
        kind: r.get(2)?,
        name: r.get(3)?,
        status: r.get(4)?,
        created_at: r.get(5)?,
        updated_at: r.get(6)?,
        trace_id: r.get(7)?,
        fingerprint: r.get(8)?,
        args_json: r.get(9)?,
        output_json: r.get(10)?,
        error_json: r.get(11)?,
        budget_json: r.get(12)?,
        module: r.get(13)?,
    })
}

pub(crate) fn insert_journal(
    tx: &Connection,
    rid: i64,
    key: &str,
    value: &str,
) -> rusqlite::Result<Option<String>> {
    let inserted = tx
        .prepare_cached(JOURNAL_INSERT)?
        .execute(params![rid, key, value])?;
    journal_winner(tx, inserted, rid, key, value)
}

pub const JOURNAL_INSERT: &str =
    "INSERT OR IGNORE INTO journal(rid, step_key, value_json) VALUES(?1, ?2, ?3)";

/// `JOURNAL_INSERT` of a step with its identity (issue 27).
pub const JOURNAL_STEP_INSERT: &str =
    "INSERT OR IGNORE INTO journal(rid, step_key, value_json, ident) VALUES(?1, ?2, ?3, ?4)";

/// After the insert of a journal row (`inserted` rows): `None` if it was
/// inserted or the key already held the same value, else the value it
/// holds (the earlier write wins).
pub(crate) fn journal_winner(
    tx: &Connection,
    inserted: usize,
    rid: i64,
    key: &str,
    value: &str,
) -> rusqlite::Result<Option<String>> {
    if inserted == 1 {
        return Ok(None);
    }
    let stored: String = tx
        .prepare_cached("SELECT value_json FROM journal WHERE rid = ?1 AND step_key = ?2")?
        .query_row(params![rid, key], |r| r.get(0))?;
    Ok(if stored == value { None } else { Some(stored) })
}

/// The `tid` the spans of trace `trace_id` (one of them of run `rid`) are
/// stored under, remembered in `traces`. A trace with a `traces` row (a
/// store migrated from 0.11.0, a run created before runs owned their
/// trace, a trace outside any run) keeps it; a run's own trace has no row:
/// its spans take `-rid`, which spares every run's commit the row and its
/// index entry.
pub(crate) fn trace_tid(
    tx: &Connection,
    traces: &mut HashMap<String, i64>,
    trace_id: &str,
    rid: Option<i64>,
) -> rusqlite::Result<i64> {
    // A run's own trace is remembered as `-rid`: a span of another run that
    // names the same trace id (runs do not share trace ids, but a caller may
    // pass one) is looked up, and lands under its own run's `-rid` too.
    if let Some(&tid) = traces.get(trace_id) {
        if tid >= 0 || rid.is_none_or(|r| r == -tid) {
            return Ok(tid);
        }
    }
    let row: Option<i64> = tx
        .prepare_cached("SELECT tid FROM traces WHERE trace_id = ?1")?
        .query_row([trace_id], |r| r.get(0))
        .optional()?;
    let tid = match (row, rid) {
        (Some(tid), _) => tid,
        (None, Some(rid))
            if tx
                .prepare_cached("SELECT 1 FROM runs WHERE rid = ?1 AND trace_id = ?2")?
                .exists(params![rid, trace_id])? =>
        {
            -rid
        }
        (None, _) => {
            tx.prepare_cached("INSERT INTO traces(trace_id) VALUES(?1)")?
                .execute([trace_id])?;
            tx.last_insert_rowid()
        }
    };
    remember_trace(traces, trace_id, tid);
    Ok(tid)
}

pub(crate) fn remember_trace(traces: &mut HashMap<String, i64>, trace_id: &str, tid: i64) {
    if traces.len() >= TRACE_CACHE {
        traces.clear();
    }
    traces.insert(trace_id.to_string(), tid);
}

/// Trace ids the writer remembers at most: a long-lived process starts a
/// trace per run, and a run's spans mostly follow each other closely.
pub(crate) const TRACE_CACHE: usize = 1024;

pub(crate) fn insert_span(
    tx: &Connection,
    traces: &mut HashMap<String, i64>,
    statements: &mut Statements,
    rec: &SpanRecord,
) -> rusqlite::Result<()> {
    insert_span_under(tx, traces, statements, rec, rec.rid)
}

pub const SPAN_INSERT: &str =
    "INSERT INTO spans(tid, rid, span_id, parent, kind, name, started_at, ended_at, status, \
     flags, step_key, attributes_json, error_json, input_tokens, output_tokens, \
     cache_read_tokens, cache_creation_tokens, reasoning_tokens, cost_usd, cost_complete, \
     input_json, output_json) \
     VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, \
     ?19, ?20, ?21, ?22)";

/// A span without attributes, usage or error (a task step's, replayed or
/// not): the columns left out are NULL.
pub const PLAIN_SPAN_INSERT: &str =
    "INSERT INTO spans(tid, rid, span_id, parent, kind, name, started_at, ended_at, status, \
     flags, step_key, input_json, output_json) \
     VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)";

/// The columns both span inserts start with.
pub(crate) struct SpanHead<'a> {
    pub(crate) tid: i64,
    pub(crate) rid: Option<i64>,
    pub(crate) span_id: &'a StoredId,
    pub(crate) parent: &'a Option<StoredId>,
    pub(crate) flags: i64,
    pub(crate) span: &'a SpanRow,
}

impl<'a> SpanHead<'a> {
    pub(crate) fn bind(&self, p: &mut Params<'a>) -> rusqlite::Result<()> {
        let s = self.span;
        p.set(1, self.tid)?;
        p.set(2, self.rid)?;
        p.set(3, self.span_id)?;
        p.set(4, self.parent)?;
        p.set(5, s.kind.as_str())?;
        p.set(6, s.name.as_str())?;
        p.set(7, s.started_at)?;
        p.set(8, s.ended_at)?;
        p.set(9, s.status.as_str())?;
        p.set(10, self.flags)?;
        p.set(11, s.step_key.as_deref())
    }
}

/// Inserts `rec` under run `rid`.
pub(crate) fn insert_span_under(
    tx: &Connection,
    traces: &mut HashMap<String, i64>,
    statements: &mut Statements,
    rec: &SpanRecord,
    rid: Option<i64>,
) -> rusqlite::Result<()> {
    let tid = trace_tid(tx, traces, &rec.trace_id, rid)?;
    let s = &rec.span;
    let mut flags = 0;
    if s.replayed {
        flags |= FLAG_REPLAYED;
    }
    let output = if rec.output_in_journal {
        flags |= FLAG_OUTPUT_IN_JOURNAL;
        None
    } else {
        s.output_json.as_deref()
    };
    let span_id = encode_id(&s.span_id);
    let parent: Option<StoredId> = s.parent_span_id.as_deref().map(encode_id);
    let head = SpanHead {
        tid,
        rid,
        span_id: &span_id,
        parent: &parent,
        flags,
        span: s,
    };
    if s.attributes_json.is_none() && s.usage.is_none() && s.error_json.is_none() {
        statements.execute(tx, PLAIN_SPAN_INSERT, |p| {
            head.bind(p)?;
            p.set(12, s.input_json.as_deref())?;
            p.set(13, output)
        })?;
        return Ok(());
    }
    let u = s.usage.as_ref();
    statements.execute(tx, SPAN_INSERT, |p| {
        head.bind(p)?;
        p.set(12, s.attributes_json.as_deref())?;
        p.set(13, s.error_json.as_deref())?;
        p.set(14, u.map(|u| u.input_tokens))?;
        p.set(15, u.map(|u| u.output_tokens))?;
        p.set(16, u.map(|u| u.cache_read_tokens))?;
        p.set(17, u.map(|u| u.cache_creation_tokens))?;
        p.set(18, u.map(|u| u.reasoning_tokens))?;
        p.set(19, u.and_then(|u| u.cost_usd))?;
        p.set(20, u.map(|u| u.cost_complete))?;
        p.set(21, s.input_json.as_deref())?;
        p.set(22, output)
    })?;
    Ok(())
}

/// The settlement's writes (see `Store::settle`) inside `tx`.
pub(crate) fn settle_tx(
    tx: &Connection,
    path: &str,
    rid: i64,
    owner: &str,
    s: &Settlement,
) -> CoreResult<()> {
    let t = now();
    let n = tx
        .prepare_cached(
            "UPDATE runs SET status = ?1, output_json = ?2, error_json = ?3, updated_at = ?4, \
         lease_owner = NULL, lease_until = NULL WHERE rid = ?5 AND lease_owner = ?6",
        )
        .and_then(|mut st| {
            st.execute(params![
                s.status,
                s.output_json,
                s.error_json,
                t,
                rid,
                owner
            ])
        })
        .at(path)?;
    if n == 0 {
        return Err(moved_rid(tx, rid));
    }
    tx.prepare_cached("DELETE FROM run_recoveries WHERE rid = ?1")
        .and_then(|mut st| st.execute([rid]))
        .at(path)?;
    for a in &s.agent_states {
        write_agent_state(tx, rid, a, t).at(path)?;
    }
    crate::store::sqlite::durable::on_settle(tx, rid, &s.status, s.wait.as_ref()).at(path)?;
    for p in &s.pending {
        tx.prepare_cached(
            "INSERT OR REPLACE INTO pending_interrupts(rid, interrupt_id, kind, question, \
             payload_json, created_at) VALUES(?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .and_then(|mut st| {
            st.execute(params![
                rid,
                p.interrupt_id,
                p.kind,
                p.question,
                p.payload_json,
                t
            ])
        })
        .at(path)?;
    }
    Ok(())
}

pub(crate) fn write_agent_state(
    tx: &Connection,
    rid: i64,
    a: &AgentStateRow,
    at: f64,
) -> rusqlite::Result<usize> {
    tx.prepare_cached(
        "INSERT OR REPLACE INTO agent_state(rid, scope_key, messages_json, \
         partial_results_json, turn, updated_at) VALUES(?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        rid,
        a.scope_key,
        a.messages_json,
        a.partial_results_json,
        a.turn,
        at
    ])
}

pub fn read_pending(conn: &Connection, rid: i64) -> rusqlite::Result<Vec<InterruptRow>> {
    let mut st = conn.prepare_cached(
        "SELECT interrupt_id, kind, question, payload_json FROM pending_interrupts \
         WHERE rid = ?1 ORDER BY interrupt_id",
    )?;
    let rows = st.query_map([rid], |r| {
        Ok(InterruptRow {
            interrupt_id: r.get(0)?,
            kind: r.get(1)?,
            question: r.get(2)?,
            payload_json: r.get(3)?,
        })
    })?;
    rows.collect()
}

/// Journals `answers` of `rid` (first write wins) and clears their
/// pending interrupts.
pub(crate) fn record_answers_in(
    tx: &Connection,
    rid: i64,
    answers: &[(String, String)],
) -> rusqlite::Result<()> {
    for (id, value) in answers {
        insert_journal(tx, rid, &format!("__interrupt__:{id}"), value)?;
        tx.prepare_cached("DELETE FROM pending_interrupts WHERE rid = ?1 AND interrupt_id = ?2")?
            .execute(params![rid, id])?;
    }
    Ok(())
}

/// The journal of `rid` read straight into an attempt's `Journal`: one
/// allocation per value, none per key.
pub(crate) fn load_journal(conn: &Connection, rid: i64) -> rusqlite::Result<Journal> {
    let mut st =
        conn.prepare_cached("SELECT step_key, value_json, ident FROM journal WHERE rid = ?1")?;
    let mut rows = st.query([rid])?;
    let mut loader = JournalLoader::default();
    while let Some(r) = rows.next()? {
        loader.push_step(
            r.get_ref(0)?.as_str()?,
            r.get_ref(1)?.as_str()?,
            r.get_ref(2)?.as_str_or_null()?,
        );
    }
    Ok(loader.finish())
}

/// The journal rows of `rid` with their identities.
pub(crate) fn read_journal_rows(
    conn: &Connection,
    rid: i64,
) -> rusqlite::Result<crate::store::JournalRows> {
    let mut st =
        conn.prepare_cached("SELECT step_key, value_json, ident FROM journal WHERE rid = ?1")?;
    let rows = st.query_map([rid], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    rows.collect()
}

pub(crate) fn read_journal(conn: &Connection, rid: i64) -> rusqlite::Result<Vec<(String, String)>> {
    let mut st = conn.prepare_cached("SELECT step_key, value_json FROM journal WHERE rid = ?1")?;
    let rows = st.query_map([rid], |r| Ok((r.get(0)?, r.get(1)?)))?;
    rows.collect()
}

/// STORE-12 bookkeeping inside `acquire`: a worker's takeover from a dead
/// holder is counted; returns `Some(max)` when the limit is reached (the
/// run is to be failed). A manual takeover starts the count again.
pub(crate) fn count_recovery(
    tx: &Connection,
    rid: i64,
    takeover: crate::store::takeover::Takeover,
    recovering: bool,
) -> rusqlite::Result<Option<u32>> {
    match takeover {
        crate::store::takeover::Takeover::Manual => {
            tx.prepare_cached("DELETE FROM run_recoveries WHERE rid = ?1")?
                .execute([rid])?;
            Ok(None)
        }
        crate::store::takeover::Takeover::Recover { .. } if !recovering => Ok(None),
        crate::store::takeover::Takeover::Recover { max } => {
            let count: i64 = tx
                .prepare_cached("SELECT count FROM run_recoveries WHERE rid = ?1")?
                .query_row([rid], |r| r.get(0))
                .optional()?
                .unwrap_or(0);
            if count >= i64::from(max) {
                return Ok(Some(max));
            }
            tx.prepare_cached(
                "INSERT INTO run_recoveries(rid, count) VALUES(?1, 1) \
                 ON CONFLICT(rid) DO UPDATE SET count = count + 1",
            )?
            .execute([rid])?;
            Ok(None)
        }
    }
}

pub(crate) struct QueuedRun {
    pub(crate) new: NewRun,
    pub(crate) owner: String,
    pub(crate) lease_until: f64,
    pub(crate) created_at: f64,
    pub(crate) slot: Arc<RowSlot>,
    /// `(status, output_json, error_json)` when the run settled before its
    /// row was written: the row is inserted settled.
    pub(crate) settled: Option<(String, Option<String>, Option<String>)>,
}

/// The lease state of the runs one write transaction writes for, each run's
/// row read once: a step's check (`moved`) and its span's (`refused`) read
/// the same row, and a commit carries both.
pub(crate) struct Leases<'c> {
    pub(crate) tx: &'c Connection,
    pub(crate) runs: HashMap<i64, RunLease>,
}

pub(crate) struct RunLease {
    /// `(run_id, lease_owner)`, `None` when the run has no row.
    pub(crate) row: Option<(String, Option<String>)>,
    /// `refused`, once asked.
    pub(crate) refused: Option<bool>,
}

impl<'c> Leases<'c> {
    pub(crate) fn new(tx: &'c Connection) -> Leases<'c> {
        Leases {
            tx,
            runs: HashMap::new(),
        }
    }

    pub(crate) fn run(&mut self, rid: i64) -> rusqlite::Result<&mut RunLease> {
        Ok(match self.runs.entry(rid) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let row = self
                    .tx
                    .prepare_cached("SELECT run_id, lease_owner FROM runs WHERE rid = ?1")?
                    .query_row([rid], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()?;
                e.insert(RunLease { row, refused: None })
            }
        })
    }

    /// `moved_away`.
    pub(crate) fn moved(&mut self, rid: i64) -> rusqlite::Result<Option<String>> {
        let me = crate::owner::owner_id();
        Ok(self
            .run(rid)?
            .row
            .as_ref()
            .and_then(|(run_id, holder)| (holder.as_deref() != Some(me)).then(|| run_id.clone())))
    }

    /// Whether a span of run `rid` from this process is refused: the run is
    /// leased to another process, or was released after this process's
    /// lease of it was taken over. (Spans of a run this process settled
    /// itself may still be on their way.)
    pub(crate) fn refused(&mut self, rid: i64) -> rusqlite::Result<bool> {
        let tx = self.tx;
        let run = self.run(rid)?;
        if let Some(refused) = run.refused {
            return Ok(refused);
        }
        let me = crate::owner::owner_id();
        let refused = match &run.row {
            None => false,
            Some((_, Some(holder))) => holder != me,
            Some((_, None)) => tx
                .prepare_cached("SELECT 1 FROM lease_takeovers WHERE rid = ?1 AND owner = ?2")?
                .exists(params![rid, me])?,
        };
        run.refused = Some(refused);
        Ok(refused)
    }
}
