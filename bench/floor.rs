//! The storage floor: a bare Rust loop committing what one journaled step
//! commits -- one `journal` row plus one `spans` row, in one IMMEDIATE
//! transaction -- through the store's own schema and pragmas
//! (`open_connection`), its statements and the way its writer runs them
//! (`Statements`, `WriteTx`), with no Python and no engine in between.
//!
//!     cargo run --release --example floor -- <n> <dir> [full]
//!
//! Prints one JSON line: microseconds per commit with `synchronous=NORMAL`
//! and, when `full` is given, with `synchronous=FULL` (what
//! `COMPOSE_SYNC=full` selects). Each mode uses a fresh database under
//! `<dir>`. Also the floor of W5: microseconds per commit of what one
//! standalone agent call commits (its settled run row, its agent span and
//! its llm span, the same statements and values as the engine writes),
//! `synchronous=NORMAL`, with WAL checkpoints run between the timed commits
//! (the engine runs them on a thread of their own).

use _core::ids::{encode_id, new_ulid};
use _core::store::slot::FLAG_OUTPUT_IN_JOURNAL;
use _core::store::sqlite::statements::Statements;
use _core::store::sqlite::write_tx::WriteTx;
use _core::store::sqlite::{
    open_connection, JOURNAL_INSERT, PLAIN_SPAN_INSERT, QUEUED_RUN_INSERT, SCHEMA_VERSION,
    SPAN_INSERT,
};
use _core::time::now;
use rusqlite::params;
use std::time::Instant;

/// Commits `n` step-shaped transactions into a fresh store at `path`;
/// returns microseconds per commit. With `synchronous=NORMAL` the WAL is
/// checkpointed between the timed commits, as the engine's checkpoint
/// thread does it beside them; with `FULL` inside them, as SQLite does (the
/// engine runs no checkpoint thread then).
fn measure(path: &str, n: u64, full_sync: bool) -> f64 {
    let conn = open_connection(path, full_sync).expect("open store");
    let run_id = new_ulid();
    let trace_id = new_ulid();
    let t = now();
    // The run row a flow run creates once, before its steps; its spans go
    // under its own trace, `-rid`.
    conn.execute(
        "INSERT INTO runs(run_id, kind, name, status, created_at, updated_at, trace_id, \
         fingerprint, args_json, lease_owner, lease_until) \
         VALUES(?1, 'flow', 'loop', 'running', ?2, ?2, ?3, ?4, '{\"args\":[2000],\"kwargs\":{}}', \
         'bench', ?5)",
        params![run_id, t, trace_id, "0".repeat(64), t + 60.0],
    )
    .expect("insert run");
    let rid = conn.last_insert_rowid();
    let tid = -rid;
    let root_span = new_ulid();

    if !full_sync {
        conn.execute_batch("PRAGMA wal_autocheckpoint=0")
            .expect("turn off inline checkpoints");
    }
    // After `conn`: its statements are finalized before it closes.
    let mut statements = Statements::default();
    let mut timed = std::time::Duration::ZERO;
    let mut x: u64 = 0;
    for i in 1..=n {
        let key = format!("inc#{i}");
        let value = (x + 1).to_string();
        let input = format!("{{\"args\":[{x}],\"kwargs\":{{}}}}");
        let (span_id, parent) = (encode_id(&new_ulid()), Some(encode_id(&root_span)));
        let start = Instant::now();
        let started = now();
        let tx = WriteTx::immediate(&conn, &mut statements).expect("begin");
        let n = statements
            .execute(&tx, JOURNAL_INSERT, |p| {
                p.set(1, rid)?;
                p.set(2, key.as_str())?;
                p.set(3, value.as_str())
            })
            .expect("insert journal");
        assert_eq!(n, 1);
        // The statement and values the engine writes for a task step's span
        // (no attributes, usage or error; its output in the journal).
        statements
            .execute(&tx, PLAIN_SPAN_INSERT, |p| {
                p.set(1, tid)?;
                p.set(2, rid)?;
                p.set(3, &span_id)?;
                p.set(4, &parent)?;
                p.set(5, "task")?;
                p.set(6, "inc")?;
                p.set(7, started)?;
                p.set(8, now())?;
                p.set(9, "ok")?;
                p.set(10, FLAG_OUTPUT_IN_JOURNAL)?;
                p.set(11, key.as_str())?;
                p.set(12, input.as_str())?;
                p.set(13, None::<&str>)
            })
            .expect("insert span");
        tx.commit(&mut statements).expect("commit");
        timed += start.elapsed();
        x += 1;
        if !full_sync && i % 128 == 0 {
            checkpoint(&conn);
        }
    }
    assert_eq!(x, n);
    timed.as_secs_f64() * 1e6 / n as f64
}

/// Commits `n` transactions shaped like a standalone `FakeModel` agent
/// call's one commit into a fresh store at `path`; returns microseconds per
/// commit.
fn measure_agent_call(path: &str, n: u64) -> f64 {
    let conn = open_connection(path, false).expect("open store");
    conn.execute_batch("PRAGMA wal_autocheckpoint=0")
        .expect("turn off inline checkpoints");
    let mut statements = Statements::default();
    let mut timed = std::time::Duration::ZERO;
    for i in 0..n {
        let args = format!("{{\"args\":[\"user {i}\"],\"kwargs\":{{}}}}");
        let input = format!(
            "{{\"system\":\"Greet the user.\",\"messages\":[{{\"$kind\":\"pydantic\",\
             \"$type\":\"composeai.messages:Message\",\"value\":{{\"role\":\"user\",\
             \"parts\":[{{\"type\":\"text\",\"text\":\"Say hello to user {i}.\"}}]}}}}]}}"
        );
        let reply = "{\"$kind\":\"pydantic\",\"$type\":\"composeai.messages:Message\",\
                     \"value\":{\"role\":\"assistant\",\"parts\":[{\"type\":\"text\",\
                     \"text\":\"hello\"}]}}";
        let (run_id, trace_id) = (new_ulid(), new_ulid());
        let root_id = new_ulid();
        let (root, llm) = (encode_id(&root_id), encode_id(&new_ulid()));
        let parent = Some(encode_id(&root_id));
        let start = Instant::now();
        let t = now();
        let tx = WriteTx::immediate(&conn, &mut statements).expect("begin");
        // The row inserted settled, as a run that ends before its queued
        // row was written is (`insert_run`).
        statements
            .execute(&tx, QUEUED_RUN_INSERT, |p| {
                p.set(1, run_id.as_str())?;
                p.set(2, "agent")?;
                p.set(3, "greeter")?;
                p.set(4, "completed")?;
                p.set(5, t)?;
                p.set(6, t)?;
                p.set(7, trace_id.as_str())?;
                p.set(8, None::<&str>)?;
                p.set(9, args.as_str())?;
                p.set(10, None::<&str>)?;
                p.set(11, "\"hello\"")?;
                p.set(12, None::<&str>)?;
                p.set(13, None::<&str>)?;
                p.set(14, None::<f64>)
            })
            .expect("insert run");
        let rid = tx.last_insert_rowid();
        statements
            .execute(&tx, SPAN_INSERT, |p| {
                p.set(1, -rid)?;
                p.set(2, rid)?;
                p.set(3, &llm)?;
                p.set(4, &parent)?;
                p.set(5, "llm")?;
                p.set(6, "FakeModel")?;
                p.set(7, t)?;
                p.set(8, t)?;
                p.set(9, "ok")?;
                p.set(10, 0i64)?;
                p.set(11, None::<&str>)?;
                p.set(12, "{\"model\":\"FakeModel\"}")?;
                p.set(13, None::<&str>)?;
                p.set(14, 10i64)?;
                p.set(15, 20i64)?;
                p.set(16, 0i64)?;
                p.set(17, 0i64)?;
                p.set(18, 0i64)?;
                p.set(19, None::<f64>)?;
                p.set(20, false)?;
                p.set(21, input.as_str())?;
                p.set(22, reply)
            })
            .expect("insert llm span");
        statements
            .execute(&tx, PLAIN_SPAN_INSERT, |p| {
                p.set(1, -rid)?;
                p.set(2, rid)?;
                p.set(3, &root)?;
                p.set(4, None::<&str>)?;
                p.set(5, "agent")?;
                p.set(6, "greeter")?;
                p.set(7, t)?;
                p.set(8, now())?;
                p.set(9, "ok")?;
                p.set(10, 0i64)?;
                p.set(11, None::<&str>)?;
                p.set(12, args.as_str())?;
                p.set(13, "\"hello\"")
            })
            .expect("insert agent span");
        tx.commit(&mut statements).expect("commit");
        timed += start.elapsed();
        if i % 128 == 127 {
            checkpoint(&conn);
        }
    }
    timed.as_secs_f64() * 1e6 / n as f64
}

/// A PASSIVE checkpoint, untimed.
fn checkpoint(conn: &rusqlite::Connection) {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
        .expect("checkpoint");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: floor <n> <dir> [full]");
        std::process::exit(2);
    }
    let n: u64 = args[1].parse().expect("<n> must be an integer");
    let dir = std::path::Path::new(&args[2]);
    let full = args.get(3).map(|a| a == "full").unwrap_or(false);
    std::fs::create_dir_all(dir).expect("create <dir>");

    let normal_path = dir.join("floor-normal").join("runs.db");
    let normal = measure(normal_path.to_str().unwrap(), n, false);
    let full_us = if full {
        let full_path = dir.join("floor-full").join("runs.db");
        format!("{:.2}", measure(full_path.to_str().unwrap(), n, true))
    } else {
        "null".to_string()
    };
    let agent_path = dir.join("floor-agent").join("runs.db");
    let agent = measure_agent_call(agent_path.to_str().unwrap(), n);
    println!(
        "{{\"workload\": \"floor\", \"n\": {n}, \"us_per_commit_normal\": {normal:.2}, \
         \"us_per_commit_full\": {full_us}, \"us_per_agent_call_commit\": {agent:.2}, \
         \"schema_version\": {SCHEMA_VERSION}}}"
    );
}
