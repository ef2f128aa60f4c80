//! The PostgreSQL floor (P0): a bare Rust loop committing what one journaled
//! step commits on PostgreSQL -- one `journal` row plus one `spans` row in
//! one autocommit statement, i.e. one round trip -- through the store's own
//! schema (`PgStore::open`), with no Python, no engine and no fence.
//!
//!     cargo run --release --example pg_floor -- <n> <store-url>
//!
//! Prints one JSON line: microseconds per commit.

use _core::ids::new_ulid;
use _core::runtime::block_on;
use _core::store::postgres::PgStore;
use _core::store::url::{parse, StoreUrl};
use _core::time::now;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(2000);
    let url = args.get(2).expect("usage: pg_floor <n> <store-url>");
    let StoreUrl::Postgres(pg) = parse(url, "").expect("store url") else {
        panic!("pg_floor needs a postgresql:// URL");
    };
    let schema = pg.schema.clone();
    drop(PgStore::open(pg.clone()).expect("open store"));
    let mut cfg = tokio_postgres::Config::new();
    cfg.host(&pg.host)
        .port(pg.port)
        .user(pg.user.as_deref().unwrap_or("postgres"))
        .dbname(pg.dbname.as_deref().unwrap_or("postgres"))
        .options(format!("-c search_path={schema}"));
    let us = block_on(async {
        let (client, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("connect");
        tokio::spawn(conn);
        let t = now();
        let rid: i64 = client
            .query_one(
                "INSERT INTO runs(run_id, kind, name, status, created_at, updated_at, trace_id, \
                 fingerprint, args_json, lease_owner, lease_until) VALUES($1, 'flow', 'loop', \
                 'running', $2, $2, $3, $4, '{\"args\":[2000],\"kwargs\":{}}', 'bench', $5) \
                 RETURNING rid",
                &[&new_ulid(), &t, &new_ulid(), &"0".repeat(64), &(t + 60.0)],
            )
            .await
            .expect("insert run")
            .get(0);
        let trace_id = new_ulid();
        let root: Vec<u8> = ulid::Ulid::new().to_bytes().to_vec();
        let st = client
            .prepare(
                "WITH j AS (INSERT INTO journal(rid, step_key, value_json) VALUES($1, $2, $3) \
                 ON CONFLICT DO NOTHING RETURNING 1), \
                 s AS (INSERT INTO spans(trace_id, rid, span_id, parent, kind, name, started_at, \
                 ended_at, status, flags, step_key, input_json) \
                 VALUES($4, $1, $5, $6, 'task', 'inc', $7, $8, 'ok', 2, $2, $9)) \
                 SELECT (SELECT count(*) FROM j)",
            )
            .await
            .expect("prepare");
        let start = Instant::now();
        for i in 1..=n {
            let x = i - 1;
            let key = format!("inc#{i}");
            let value = (x + 1).to_string();
            let input = format!("{{\"args\":[{x}],\"kwargs\":{{}}}}");
            let span: Vec<u8> = ulid::Ulid::new().to_bytes().to_vec();
            let started = now();
            let row = client
                .query_one(
                    &st,
                    &[
                        &rid,
                        &key,
                        &value,
                        &trace_id,
                        &span,
                        &root,
                        &started,
                        &now(),
                        &input,
                    ],
                )
                .await
                .expect("commit");
            assert_eq!(row.get::<_, i64>(0), 1);
        }
        start.elapsed().as_secs_f64() * 1e6 / n as f64
    });
    println!("{{\"n\": {n}, \"us_per_commit\": {us:.2}}}");
}
