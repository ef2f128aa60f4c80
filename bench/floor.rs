//! The storage floor: a bare Rust loop committing what one journaled step
//! commits -- one `journal` row plus one `spans` row, in one IMMEDIATE
//! transaction -- through the store's own schema and pragmas
//! (`open_connection`), with no Python and no engine in between.
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
use _core::store::sqlite::{now, open_connection, SCHEMA_VERSION};
use rusqlite::{params, TransactionBehavior};
use std::time::Instant;

/// Commits `n` step-shaped transactions into a fresh store at `path`;
/// returns microseconds per commit.
fn measure(path: &str, n: u64, full_sync: bool) -> f64 {
    let mut conn = open_connection(path, full_sync).expect("open store");
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

    let start = Instant::now();
    let mut x: u64 = 0;
    for i in 1..=n {
        let key = format!("inc#{i}");
        let value = (x + 1).to_string();
        let input = format!("{{\"args\":[{x}],\"kwargs\":{{}}}}");
        let span_id = new_ulid();
        let started = now();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .expect("begin");
        {
            let n = tx
                .prepare_cached(
                    "INSERT OR IGNORE INTO journal(rid, step_key, value_json) VALUES(?1, ?2, ?3)",
                )
                .and_then(|mut st| st.execute(params![rid, key, value]))
                .expect("insert journal");
            assert_eq!(n, 1);
            // Same statement and column values as `insert_span` writes for a
            // task step whose output is stored in the journal (flags = 2).
            tx.prepare_cached(
                "INSERT INTO spans(tid, rid, span_id, parent, kind, name, started_at, ended_at, \
                 status, flags, step_key, attributes_json, error_json, input_tokens, \
                 output_tokens, cache_read_tokens, cache_creation_tokens, reasoning_tokens, \
                 cost_usd, cost_complete, input_json, output_json) \
                 VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, \
                 ?17, ?18, ?19, ?20, ?21, ?22)",
            )
            .and_then(|mut st| {
                st.execute(params![
                    tid,
                    rid,
                    encode_id(&span_id),
                    encode_id(&root_span),
                    "task",
                    "inc",
                    started,
                    now(),
                    "ok",
                    2i64,
                    key,
                    None::<String>,
                    None::<String>,
                    None::<i64>,
                    None::<i64>,
                    None::<i64>,
                    None::<i64>,
                    None::<i64>,
                    None::<f64>,
                    None::<bool>,
                    input,
                    None::<String>,
                ])
            })
            .expect("insert span");
        }
        tx.commit().expect("commit");
        x += 1;
    }
    let elapsed = start.elapsed();
    assert_eq!(x, n);
    elapsed.as_secs_f64() * 1e6 / n as f64
}

/// Commits `n` transactions shaped like a standalone `FakeModel` agent
/// call's one commit into a fresh store at `path`; returns microseconds per
/// commit.
fn measure_agent_call(path: &str, n: u64) -> f64 {
    let mut conn = open_connection(path, false).expect("open store");
    conn.execute_batch("PRAGMA wal_autocheckpoint=0")
        .expect("turn off inline checkpoints");
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
        let (root, llm) = (new_ulid(), new_ulid());
        let start = Instant::now();
        let t = now();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .expect("begin");
        {
            // The row inserted settled, as a run that ends before its queued
            // row was written is (`insert_run`).
            tx.prepare_cached(
                "INSERT OR IGNORE INTO runs(run_id, kind, name, status, created_at, updated_at, \
                 trace_id, fingerprint, args_json, budget_json, output_json, error_json, \
                 lease_owner, lease_until) \
                 VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
            )
            .and_then(|mut st| {
                st.execute(params![
                    new_ulid(),
                    "agent",
                    "greeter",
                    "completed",
                    t,
                    t,
                    new_ulid(),
                    None::<String>,
                    args,
                    None::<String>,
                    "\"hello\"",
                    None::<String>,
                    None::<String>,
                    None::<f64>
                ])
            })
            .expect("insert run");
            let rid = tx.last_insert_rowid();
            let mut span = tx
                .prepare_cached(
                    "INSERT INTO spans(tid, rid, span_id, parent, kind, name, started_at, \
                     ended_at, status, flags, step_key, attributes_json, error_json, \
                     input_tokens, output_tokens, cache_read_tokens, cache_creation_tokens, \
                     reasoning_tokens, cost_usd, cost_complete, input_json, output_json) \
                     VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, \
                     ?16, ?17, ?18, ?19, ?20, ?21, ?22)",
                )
                .expect("prepare span insert");
            span.execute(params![
                -rid,
                rid,
                encode_id(&llm),
                encode_id(&root),
                "llm",
                "FakeModel",
                t,
                t,
                "ok",
                0i64,
                None::<String>,
                "{\"model\":\"FakeModel\"}",
                None::<String>,
                10i64,
                20i64,
                0i64,
                0i64,
                0i64,
                None::<f64>,
                false,
                input,
                reply,
            ])
            .expect("insert llm span");
            drop(span);
            tx.prepare_cached(
                "INSERT INTO spans(tid, rid, span_id, parent, kind, name, started_at, ended_at, \
                 status, flags, step_key, input_json, output_json) \
                 VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
            )
            .and_then(|mut st| {
                st.execute(params![
                    -rid,
                    rid,
                    encode_id(&root),
                    None::<Vec<u8>>,
                    "agent",
                    "greeter",
                    t,
                    now(),
                    "ok",
                    0i64,
                    None::<String>,
                    args,
                    "\"hello\"",
                ])
            })
            .expect("insert agent span");
        }
        tx.commit().expect("commit");
        timed += start.elapsed();
        if i % 128 == 127 {
            conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                .expect("checkpoint");
        }
    }
    timed.as_secs_f64() * 1e6 / n as f64
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
