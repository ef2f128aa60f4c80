//! Schema creation and forward migration of composeai 0.11.0 stores.

use crate::error::{AtPath, CoreError, CoreResult};
use crate::store::sqlite::rows::insert_span;
use crate::store::sqlite::schema::SCHEMA;
use crate::store::sqlite::schema::SCHEMA_VERSION;
use crate::store::sqlite::statements::Statements;
use crate::store::{SpanRecord, SpanRow, UsageRow};
use rusqlite::Connection;
use std::collections::HashMap;

/// Schema step 7 (idempotent): how often each run was recovered since it
/// last settled (STORE-12), and the holders whose lease of a run was taken
/// over, whose late spans are then refused even once the run has settled
/// (STORE-11).
const LEASE_SCHEMA_VERSION: i64 = 7;
const LEASE_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS run_recoveries(\
     rid INTEGER PRIMARY KEY, count INTEGER NOT NULL); \
     CREATE TABLE IF NOT EXISTS lease_takeovers(rid INTEGER NOT NULL, owner TEXT NOT NULL, \
     PRIMARY KEY(rid, owner)) WITHOUT ROWID;";

/// Schema step 11: each journal row's step identity (issue 27), NULL for
/// rows written before it (they replay unchecked).
const IDENT_VERSION: i64 = 11;
const IDENT_SCHEMA: &str = "ALTER TABLE journal ADD COLUMN ident TEXT";

/// Schema step 12: the module defining each run's flow, so an error can
/// name the import that registers it; NULL for runs stored before it.
const MODULE_VERSION: i64 = 12;
const MODULE_SCHEMA: &str = "ALTER TABLE runs ADD COLUMN module TEXT";

/// The version 0.11.0 stamped on its stores.
const LEGACY_VERSION: i64 = 1;

const LEGACY_TABLES: [&str; 6] = [
    "runs",
    "journal",
    "spans",
    "span_payloads",
    "pending_interrupts",
    "agent_state",
];

fn table_names(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut st = conn.prepare("SELECT name FROM sqlite_master WHERE type = 'table'")?;
    let names = st.query_map([], |r| r.get(0))?;
    names.collect()
}

fn foreign(path: &str, version: i64, why: &str) -> CoreError {
    CoreError::Config(format!(
        "'{path}' is not a composeai store (schema version {version}; {why}) -- point \
         COMPOSE_DIR at another directory or move the file away"
    ))
}

fn newer(path: &str, version: i64) -> CoreError {
    CoreError::Config(format!(
        "composeai store '{path}' has schema version {version}, newer than this composeai \
         supports (version {SCHEMA_VERSION}) -- upgrade composeai to open it"
    ))
}

/// Refuses a database we must not touch (newer, or not ours), before any
/// write, so that it is left byte-for-byte as it was.
pub fn refuse_foreign(conn: &Connection, path: &str, version: i64) -> CoreResult<()> {
    let tables =
        table_names(conn).map_err(|e| foreign(path, version, &format!("unreadable: {e}")))?;
    match version {
        SCHEMA_VERSION => Ok(()),
        v if v > SCHEMA_VERSION => Err(newer(path, v)),
        // Stores of this release before later additive steps.
        v if (2..SCHEMA_VERSION).contains(&v) => Ok(()),
        0 if tables.is_empty() => Ok(()),
        0 => Err(foreign(path, 0, "it holds tables composeai did not create")),
        LEGACY_VERSION => {
            let missing: Vec<&str> = LEGACY_TABLES
                .iter()
                .copied()
                .filter(|t| !tables.iter().any(|n| n == t))
                .collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(foreign(
                    path,
                    version,
                    &format!("tables missing: {}", missing.join(", ")),
                ))
            }
        }
        v => Err(foreign(path, v, "unknown schema version")),
    }
}

pub fn bring_up_to_date(conn: &Connection, path: &str, version: i64) -> CoreResult<()> {
    if version == SCHEMA_VERSION {
        return Ok(());
    }
    // Re-read under the write lock: another process may have just created
    // or migrated the schema.
    let mut conn_tx = ImmediateTx::begin(conn, path)?;
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .at(path)?;
    refuse_foreign(conn, path, version)?;
    let tables = table_names(conn).at(path)?;
    match version {
        SCHEMA_VERSION => {}
        0 => conn.execute_batch(SCHEMA).at(path)?,
        LEGACY_VERSION => migrate_legacy(conn, path, &tables)?,
        _ => {}
    }
    // Additive steps, each applied once to a store older than it.
    if version < 4 {
        crate::store::sqlite::durable_schema::apply(conn, path)?;
    }
    if version < crate::store::sqlite::graph_schema::VERSION {
        conn.execute_batch(crate::store::sqlite::graph_schema::GRAPH_SCHEMA)
            .at(path)?;
    }
    if version < crate::store::sqlite::queue_schema::SQLITE_VERSION {
        crate::store::sqlite::queue_schema::apply_sqlite(conn, path)?;
    }
    if version < LEASE_SCHEMA_VERSION {
        conn.execute_batch(LEASE_SCHEMA).at(path)?;
    }
    if version < crate::store::sqlite::durable_schema::ACTIVE_RUNS_VERSION {
        conn.execute_batch(crate::store::sqlite::durable_schema::ACTIVE_RUNS_SCHEMA)
            .at(path)?;
    }
    if version < crate::store::sqlite::graph_schema::STEPS_VERSION {
        crate::store::sqlite::graph_schema::apply_steps(conn, path)?;
    }
    if version < IDENT_VERSION {
        // Idempotent, as the steps before it: a store stamped older may have it.
        let has_ident: bool = conn
            .query_row(
                "SELECT count(*) > 0 FROM pragma_table_info('journal') WHERE name = 'ident'",
                [],
                |r| r.get(0),
            )
            .at(path)?;
        if !has_ident {
            conn.execute_batch(IDENT_SCHEMA).at(path)?;
        }
    }
    if version < MODULE_VERSION && !has_column(conn, path, "runs", "module")? {
        conn.execute_batch(MODULE_SCHEMA).at(path)?;
    }
    if version < crate::store::sqlite::published_schema::VERSION {
        conn.execute_batch(crate::store::sqlite::published_schema::SCHEMA)
            .at(path)?;
    }
    conn.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION}"))
        .at(path)?;
    conn_tx.commit()?;
    Ok(())
}

fn has_column(conn: &Connection, path: &str, table: &str, column: &str) -> CoreResult<bool> {
    conn.query_row(
        "SELECT count(*) > 0 FROM pragma_table_info(?1) WHERE name = ?2",
        [table, column],
        |r| r.get(0),
    )
    .at(path)
}

/// `BEGIN IMMEDIATE` on a shared connection, rolled back unless committed.
struct ImmediateTx<'a> {
    conn: &'a Connection,
    path: &'a str,
    open: bool,
}

impl<'a> ImmediateTx<'a> {
    fn begin(conn: &'a Connection, path: &'a str) -> CoreResult<Self> {
        conn.execute_batch("BEGIN IMMEDIATE").at(path)?;
        Ok(ImmediateTx {
            conn,
            path,
            open: true,
        })
    }

    fn commit(&mut self) -> CoreResult<()> {
        self.conn.execute_batch("COMMIT").at(self.path)?;
        self.open = false;
        Ok(())
    }
}

impl Drop for ImmediateTx<'_> {
    fn drop(&mut self) {
        if self.open {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }
}

/// Splits a 0.11.0 `attributes_json` into the step key and the rest.
fn split_attributes(attrs: Option<String>) -> (Option<String>, Option<String>) {
    let Some(text) = attrs else {
        return (None, None);
    };
    match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(serde_json::Value::Object(mut map)) => {
            let key = match map.remove("step_key") {
                Some(serde_json::Value::String(k)) => Some(k),
                Some(other) => {
                    map.insert("step_key".into(), other);
                    None
                }
                None => None,
            };
            let rest = if map.is_empty() {
                None
            } else {
                Some(serde_json::Value::Object(map).to_string())
            };
            (key, rest)
        }
        _ => (None, Some(text)),
    }
}

/// Reads the fields of a 0.11.0 encoded `Usage`.
fn parse_usage(text: &str) -> Option<UsageRow> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let fields = v.get("value").unwrap_or(&v);
    let int = |k: &str| fields.get(k).and_then(|x| x.as_i64()).unwrap_or(0);
    Some(UsageRow {
        input_tokens: int("input_tokens"),
        output_tokens: int("output_tokens"),
        cache_read_tokens: int("cache_read_tokens"),
        cache_creation_tokens: int("cache_creation_tokens"),
        reasoning_tokens: int("reasoning_tokens"),
        cost_usd: fields.get("cost_usd").and_then(|x| x.as_f64()),
        cost_complete: fields
            .get("cost_complete")
            .and_then(|x| x.as_bool())
            .unwrap_or(true),
    })
}

fn migrate_legacy(conn: &Connection, path: &str, tables: &[String]) -> CoreResult<()> {
    for t in LEGACY_TABLES {
        conn.execute_batch(&format!("ALTER TABLE {t} RENAME TO legacy_{t}"))
            .at(path)?;
    }
    let has_chats = tables.iter().any(|n| n == "chats");
    if has_chats {
        conn.execute_batch("ALTER TABLE chats RENAME TO legacy_chats")
            .at(path)?;
    }
    if tables.iter().any(|n| n == "span_fts") {
        conn.execute_batch("DROP TABLE span_fts").at(path)?;
    }
    conn.execute_batch(SCHEMA).at(path)?;
    conn.execute_batch(
        "INSERT INTO runs(run_id, kind, name, status, created_at, updated_at, trace_id, \
           fingerprint, args_json, output_json, error_json, budget_json) \
         SELECT run_id, kind, name, status, created_at, updated_at, trace_id, fingerprint, \
           args_json, output_json, error_json, budget_json FROM legacy_runs ORDER BY created_at;
         INSERT INTO journal(rid, step_key, value_json) \
         SELECT r.rid, j.step_key, j.value_json FROM legacy_journal j \
           JOIN runs r ON r.run_id = j.run_id;
         INSERT INTO pending_interrupts(rid, interrupt_id, kind, question, payload_json, created_at) \
         SELECT r.rid, p.interrupt_id, p.kind, p.question, p.payload_json, p.created_at \
           FROM legacy_pending_interrupts p JOIN runs r ON r.run_id = p.run_id;
         INSERT INTO agent_state(rid, scope_key, messages_json, partial_results_json, turn, updated_at) \
         SELECT r.rid, a.scope_key, a.messages_json, a.partial_results_json, a.turn, a.updated_at \
           FROM legacy_agent_state a JOIN runs r ON r.run_id = a.run_id;",
    )
    .at(path)?;
    if has_chats {
        conn.execute_batch(
            "INSERT INTO chats SELECT chat_id, agent_name, system, model, messages_json, \
             created_at, updated_at FROM legacy_chats; DROP TABLE legacy_chats;",
        )
        .at(path)?;
    }
    migrate_spans(conn, path)?;
    for t in LEGACY_TABLES {
        conn.execute_batch(&format!("DROP TABLE legacy_{t}"))
            .at(path)?;
    }
    Ok(())
}

fn migrate_spans(conn: &Connection, path: &str) -> CoreResult<()> {
    // Every run's trace gets its row before the spans move, and they are
    // stored under it: a 0.11.0 span names its trace and its run apart, so
    // a trace's spans stay together whichever run they name.
    conn.execute_batch(
        "INSERT OR IGNORE INTO traces(trace_id) SELECT trace_id FROM runs WHERE trace_id IS NOT NULL",
    )
    .at(path)?;
    let rids: HashMap<String, i64> = {
        let mut st = conn.prepare("SELECT run_id, rid FROM runs").at(path)?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).at(path)?;
        rows.collect::<rusqlite::Result<_>>().at(path)?
    };
    let mut st = conn
        .prepare(
            "SELECT s.span_id, s.trace_id, s.run_id, s.parent_span_id, s.kind, s.name, \
             s.started_at, s.ended_at, s.status, s.replayed, s.attributes_json, s.usage_json, \
             s.cost_usd, s.error_json, p.input_json, p.output_json \
             FROM legacy_spans s LEFT JOIN legacy_span_payloads p ON p.span_id = s.span_id \
             ORDER BY s.started_at, s.span_id",
        )
        .at(path)?;
    let mut rows = st.query([]).at(path)?;
    let mut traces = HashMap::new();
    let mut statements = Statements::default();
    while let Some(r) = rows.next().at(path)? {
        let run_id: Option<String> = r.get(2).at(path)?;
        let (step_key, attributes_json) = split_attributes(r.get(10).at(path)?);
        let usage_json: Option<String> = r.get(11).at(path)?;
        let mut usage = usage_json.as_deref().and_then(parse_usage);
        let cost: Option<f64> = r.get(12).at(path)?;
        if let Some(u) = usage.as_mut() {
            if u.cost_usd.is_none() {
                u.cost_usd = cost;
            }
        }
        let rec = SpanRecord {
            trace_id: r.get(1).at(path)?,
            rid: run_id.and_then(|id| rids.get(&id).copied()),
            output_in_journal: false,
            span: SpanRow {
                span_id: r.get(0).at(path)?,
                parent_span_id: r.get(3).at(path)?,
                kind: r.get(4).at(path)?,
                name: r.get(5).at(path)?,
                started_at: r.get(6).at(path)?,
                ended_at: r.get(7).at(path)?,
                status: r.get(8).at(path)?,
                replayed: r.get::<_, Option<i64>>(9).at(path)?.unwrap_or(0) != 0,
                step_key,
                attributes_json,
                usage,
                error_json: r.get(13).at(path)?,
                input_json: r.get(14).at(path)?,
                output_json: r.get(15).at(path)?,
            },
        };
        insert_span(conn, &mut traces, &mut statements, &rec).at(path)?;
    }
    Ok(())
}
