//! PostgreSQL implementation of `Store` (STORE-1 … STORE-3, STORE-11,
//! STORE-30): a pooled `tokio-postgres` driver on the core's shared runtime.
//!
//! Every write of an attempt is fenced in its own statement on the attempt
//! still owning the run: the statement reads the run row `FOR SHARE`, so a
//! takeover (which updates that row) waits for it and then sees its write,
//! and a write issued after a takeover stores nothing. A journaled step is
//! one statement, hence one round trip; spans queued before it travel in the
//! same pipelined batch.

use crate::error::{CoreError, CoreResult};
use crate::ids::{decode_id, encode_id, StoredId};
use crate::runtime::{block_on, runtime};
use crate::store::graph::GraphWork;
use crate::store::slot::{Slot, FLAG_OUTPUT_IN_JOURNAL, FLAG_REPLAYED};
use crate::store::takeover::Takeover;
use crate::store::url::{PgUrl, SslMode};
use crate::store::{
    AgentStateRow, ChatRow, InterruptRow, LeaseCheck, NewRun, PriorSpend, RunRow, Settlement,
    SpanRecord, Store,
};
use crate::time::now;
use deadpool_postgres::GenericClient;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use futures_util::future::join_all;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio_postgres::types::ToSql;

mod batch;
mod driven;
mod ext;
pub mod listen;
pub mod query;
pub mod queue;

/// Schema step 4 (idempotent): how often each run was recovered since it
/// last settled (STORE-12), and the holders whose lease of a run was taken
/// over, whose late spans are then refused even once the run has settled
/// (STORE-11).
const LEASE_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS run_recoveries(\
     rid BIGINT PRIMARY KEY, count INTEGER NOT NULL); \
     CREATE TABLE IF NOT EXISTS lease_takeovers(rid BIGINT NOT NULL, owner TEXT NOT NULL, \
     PRIMARY KEY(rid, owner)); \
     CREATE INDEX IF NOT EXISTS runs_by_lease_expiry ON runs(lease_until) WHERE lease_owner IS NOT NULL;";

/// Versions of the PostgreSQL schema (its own series; step `n` brings a
/// schema at `n - 1` to `n`).
pub const PG_SCHEMA_VERSION: i32 = 4;

const PG_SCHEMA_V1: &str = r#"
CREATE TABLE runs(
    rid BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    trace_id TEXT,
    fingerprint TEXT,
    args_json TEXT,
    output_json TEXT,
    error_json TEXT,
    budget_json TEXT,
    lease_owner TEXT,
    lease_until DOUBLE PRECISION
);
CREATE INDEX runs_by_created ON runs(created_at);
CREATE TABLE journal(
    rid BIGINT NOT NULL,
    step_key TEXT NOT NULL,
    value_json TEXT NOT NULL,
    PRIMARY KEY(rid, step_key)
);
CREATE TABLE spans(
    sid BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    trace_id TEXT NOT NULL,
    rid BIGINT,
    span_id BYTEA NOT NULL,
    parent BYTEA,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    ended_at DOUBLE PRECISION,
    status TEXT NOT NULL,
    flags INTEGER NOT NULL,
    step_key TEXT,
    attributes_json TEXT,
    error_json TEXT,
    input_tokens BIGINT,
    output_tokens BIGINT,
    cache_read_tokens BIGINT,
    cache_creation_tokens BIGINT,
    reasoning_tokens BIGINT,
    cost_usd DOUBLE PRECISION,
    cost_complete BOOLEAN,
    input_json TEXT,
    output_json TEXT
);
CREATE INDEX spans_by_trace ON spans(trace_id);
CREATE INDEX spans_by_run ON spans(rid);
CREATE TABLE pending_interrupts(
    rid BIGINT NOT NULL,
    interrupt_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    question TEXT,
    payload_json TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY(rid, interrupt_id)
);
CREATE TABLE agent_state(
    rid BIGINT NOT NULL,
    scope_key TEXT NOT NULL,
    messages_json TEXT,
    partial_results_json TEXT,
    turn BIGINT,
    updated_at DOUBLE PRECISION,
    PRIMARY KEY(rid, scope_key)
);
CREATE TABLE chats(
    chat_id TEXT PRIMARY KEY,
    agent_name TEXT,
    system TEXT,
    model TEXT,
    messages_json TEXT,
    created_at DOUBLE PRECISION,
    updated_at DOUBLE PRECISION
);
CREATE TABLE cancel_requests(
    rid BIGINT PRIMARY KEY,
    reason TEXT,
    created_at DOUBLE PRECISION NOT NULL
);
"#;

/// `(version, DDL)` of each step, in order; a schema at version `v` gets
/// every step above `v`.
const MIGRATIONS: [(i32, &str); 4] = [
    (1, PG_SCHEMA_V1),
    (2, crate::store::postgres::ext::PG_SCHEMA_V2),
    (3, queue::PG_QUEUE_SCHEMA),
    (4, LEASE_SCHEMA),
];

/// The fence every journal and snapshot write of an attempt carries: `$1`
/// is the run, `$2` this process's owner id, which must hold the lease. The
/// row is locked against a concurrent takeover. The lock is cheap next to
/// the rest of a step; a shared advisory lock would need a fresh snapshot
/// after it (a PL/pgSQL call per step), which measured slower.
pub(super) const FENCE: &str =
    "f AS (SELECT rid, run_id FROM runs WHERE rid = $1 AND lease_owner = $2 FOR SHARE)";

const SPAN_COLUMNS: &str = "trace_id, rid, span_id, parent, kind, name, started_at, ended_at, \
     status, flags, step_key, attributes_json, error_json, input_tokens, output_tokens, \
     cache_read_tokens, cache_creation_tokens, reasoning_tokens, cost_usd, cost_complete, \
     input_json, output_json";

/// How long a finished span may wait before it is written on its own (OBS-5).
const SPAN_LATENCY: std::time::Duration = std::time::Duration::from_millis(50);

pub struct PgStore {
    inner: Arc<PgInner>,
}

impl std::ops::Deref for PgStore {
    type Target = PgInner;
    fn deref(&self) -> &PgInner {
        &self.inner
    }
}

/// The store's state, shared with its background span flush.
pub struct PgInner {
    url: PgUrl,
    pool: Pool,
    /// The pool's connection settings, for the wake-up listener's own
    /// connection (STORE-22).
    cfg: tokio_postgres::Config,
    pub(super) spans: Mutex<Vec<SpanRecord>>,
    flush_armed: AtomicBool,
    /// Batch durability's waiting journal rows (`postgres_batch`).
    pub(super) batch: crate::store::postgres::batch::Batch,
    /// Held by the background span write from taking the queued spans until
    /// they are written, so a `flush` meanwhile waits for them.
    span_writing: tokio::sync::Mutex<()>,
    /// Connections for blocking step commits (`driven`).
    driven: driven::DrivenPool,
}

fn store_err(url: &str) -> impl Fn(tokio_postgres::Error) -> CoreError + '_ {
    move |e| CoreError::Store(format!("composeai store '{url}': {}", describe(&e)))
}

/// The driver's message with the server's detail, never the password (the
/// driver does not echo connection parameters).
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.severity(), db.message()),
        None => {
            let mut s = e.to_string();
            let mut src = std::error::Error::source(e);
            while let Some(inner) = src {
                s.push_str(&format!(": {inner}"));
                src = inner.source();
            }
            s
        }
    }
}

/// A failed connection attempt, with what to do when the server refused the
/// TLS that `sslmode` asks for.
pub(super) fn cannot_connect(url: &PgUrl, why: String) -> CoreError {
    let hint = if why.contains("server does not support TLS") {
        " -- the server does not accept TLS connections and the URL's sslmode requires TLS: \
         turn on ssl in the server's configuration, or use sslmode=prefer or sslmode=disable"
    } else {
        ""
    };
    CoreError::Store(format!(
        "composeai store '{}': cannot connect ({why}){hint}",
        url.redacted
    ))
}

/// The error of a write refused because run `rid` moved to another owner.
pub(super) async fn moved<C: GenericClient>(c: &C, rid: i64) -> CoreError {
    let run_id = c
        .query_opt("SELECT run_id FROM runs WHERE rid = $1", &[&rid])
        .await
        .ok()
        .flatten()
        .map_or_else(|| format!("#{rid}"), |r| r.get(0));
    crate::store::takeover::moved(&run_id)
}

impl PgInner {
    /// `moved`, for a caller outside the runtime.
    pub(super) fn moved_blocking(&self, rid: i64) -> CoreError {
        block_on(async {
            match self.client().await {
                Ok(c) => moved(&c, rid).await,
                Err(e) => e,
            }
        })
    }
}

fn id_bytes(id: &str) -> Vec<u8> {
    match encode_id(id) {
        StoredId::Bytes(b) => b.to_vec(),
        StoredId::Text(t) => t.into_bytes(),
    }
}

/// The parameters of one span row, in `SPAN_COLUMNS` order.
pub(super) struct SpanParams {
    trace_id: String,
    rid: Option<i64>,
    span_id: Vec<u8>,
    parent: Option<Vec<u8>>,
    kind: String,
    name: String,
    started_at: f64,
    ended_at: Option<f64>,
    status: String,
    flags: i32,
    step_key: Option<String>,
    attributes_json: Option<String>,
    error_json: Option<String>,
    usage: [Option<i64>; 5],
    cost_usd: Option<f64>,
    cost_complete: Option<bool>,
    input_json: Option<String>,
    output_json: Option<String>,
}

impl SpanParams {
    fn new(rec: SpanRecord) -> SpanParams {
        let s = rec.span;
        let mut flags = 0;
        if s.replayed {
            flags |= FLAG_REPLAYED as i32;
        }
        let output_json = if rec.output_in_journal {
            flags |= FLAG_OUTPUT_IN_JOURNAL as i32;
            None
        } else {
            s.output_json
        };
        let u = s.usage.as_ref();
        SpanParams {
            trace_id: rec.trace_id,
            rid: rec.rid,
            span_id: id_bytes(&s.span_id),
            parent: s.parent_span_id.as_deref().map(id_bytes),
            kind: s.kind,
            name: s.name,
            started_at: s.started_at,
            ended_at: s.ended_at,
            status: s.status,
            flags,
            step_key: s.step_key,
            attributes_json: s.attributes_json,
            error_json: s.error_json,
            usage: [
                u.map(|u| u.input_tokens),
                u.map(|u| u.output_tokens),
                u.map(|u| u.cache_read_tokens),
                u.map(|u| u.cache_creation_tokens),
                u.map(|u| u.reasoning_tokens),
            ],
            cost_usd: u.and_then(|u| u.cost_usd),
            cost_complete: u.map(|u| u.cost_complete),
            input_json: s.input_json,
            output_json,
        }
    }

    fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        vec![
            &self.trace_id,
            &self.rid,
            &self.span_id,
            &self.parent,
            &self.kind,
            &self.name,
            &self.started_at,
            &self.ended_at,
            &self.status,
            &self.flags,
            &self.step_key,
            &self.attributes_json,
            &self.error_json,
            &self.usage[0],
            &self.usage[1],
            &self.usage[2],
            &self.usage[3],
            &self.usage[4],
            &self.cost_usd,
            &self.cost_complete,
            &self.input_json,
            &self.output_json,
        ]
    }
}

/// `$first, $first+1, …` for the span columns.
fn span_placeholders(first: usize) -> String {
    (first..first + 22)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A journaled step: fenced (`FENCE`), first write wins, with the step's
/// span row (`$5…`) in the same statement when `with_span`. Returns the run
/// id (none: the run moved) and, only when an earlier write won, the stored
/// value. Built once: a step is the hot path.
pub(super) fn step_sql(with_span: bool) -> &'static str {
    static SQL: std::sync::OnceLock<[String; 2]> = std::sync::OnceLock::new();
    &SQL.get_or_init(|| step_sqls(""))[usize::from(with_span)]
}

/// `step_sql` whose span row is left out when a span with its id is
/// already stored: for a retry that may repeat a committed step.
pub(super) fn step_once_sql(with_span: bool) -> &'static str {
    static SQL: std::sync::OnceLock<[String; 2]> = std::sync::OnceLock::new();
    &SQL.get_or_init(|| step_sqls(&format!(" WHERE {}", span_absent(5))))[usize::from(with_span)]
}

/// `[bare, with span]` step statements; `span_filter` guards the span row.
fn step_sqls(span_filter: &str) -> [String; 2] {
    let sql = |span: &str| {
        format!(
            "WITH {FENCE}, \
             j AS (INSERT INTO journal(rid, step_key, value_json) SELECT rid, $3, $4 FROM f \
                   ON CONFLICT DO NOTHING RETURNING 1){span} \
             SELECT (SELECT run_id FROM f), CASE WHEN EXISTS (SELECT 1 FROM j) THEN NULL \
                    ELSE (SELECT value_json FROM journal WHERE rid = $1 AND step_key = $3) END"
        )
    };
    [
        sql(""),
        sql(&format!(
            ", s AS (INSERT INTO spans({SPAN_COLUMNS}) SELECT {} FROM f{span_filter})",
            span_placeholders(5)
        )),
    ]
}

/// No span row with the id of the span whose columns start at `$first` is
/// stored. There is no unique index on span ids (schema 4): the trace's
/// index finds them, at a cost in the trace's spans that only a retry pays.
fn span_absent(first: usize) -> String {
    format!(
        "NOT EXISTS (SELECT 1 FROM spans WHERE trace_id = ${first} AND span_id = ${})",
        first + 2
    )
}

/// Inserts a span unless another owner holds its run, or the run was
/// released after this process's lease of it was taken over (spans of no
/// run are always written; those of a run this process settled may trail).
fn span_insert_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| span_insert_sqls(""))
}

/// `span_insert_sql` that stores nothing when the span is stored already.
fn span_insert_once_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| span_insert_sqls(&format!(" AND {}", span_absent(1))))
}

fn span_insert_sqls(filter: &str) -> String {
    format!(
        "INSERT INTO spans({SPAN_COLUMNS}) SELECT {} WHERE ($2::BIGINT IS NULL OR EXISTS (\
         SELECT 1 FROM runs WHERE rid = $2 AND (lease_owner = $23 OR (lease_owner IS NULL \
         AND NOT EXISTS (SELECT 1 FROM lease_takeovers t WHERE t.rid = $2 AND t.owner = $23))))){filter}",
        span_placeholders(1)
    )
}

pub(super) fn owner() -> &'static str {
    crate::owner::owner_id()
}

/// A run row read with `RUN_COLUMNS` first.
pub(super) fn read_run(r: &tokio_postgres::Row) -> RunRow {
    RunRow {
        rid: r.get(0),
        run_id: r.get(1),
        kind: r.get(2),
        name: r.get(3),
        status: r.get(4),
        created_at: r.get(5),
        updated_at: r.get(6),
        trace_id: r.get(7),
        fingerprint: r.get(8),
        args_json: r.get(9),
        output_json: r.get(10),
        error_json: r.get(11),
        budget_json: r.get(12),
    }
}

pub(super) const RUN_COLUMNS: &str =
    "rid, run_id, kind, name, status, created_at, updated_at, trace_id, \
     fingerprint, args_json, output_json, error_json, budget_json";

/// Inserts a `running` run held by `$9` until `$10`, returning its rid;
/// `INSERT_RUN_PARAMS` are its parameters.
pub(super) const INSERT_RUN: &str = "INSERT INTO runs(run_id, kind, name, status, created_at, \
     updated_at, trace_id, fingerprint, args_json, budget_json, lease_owner, lease_until) \
     VALUES($1, $2, $3, 'running', $4, $4, $5, $6, $7, $8, $9, $10) RETURNING rid";

/// The parameters of `INSERT_RUN`.
pub(super) fn insert_run_params<'a>(
    new: &'a NewRun,
    t: &'a f64,
    owner: &'a &str,
    lease_until: &'a f64,
) -> [&'a (dyn ToSql + Sync); 10] {
    [
        &new.run_id,
        &new.kind,
        &new.name,
        t,
        &new.trace_id,
        &new.fingerprint,
        &new.args_json,
        &new.budget_json,
        owner,
        lease_until,
    ]
}

/// The error of inserting run `new`: a taken run id is the caller's.
pub(crate) fn insert_run_err<'a>(
    store: &'a PgInner,
    new: &NewRun,
) -> impl Fn(tokio_postgres::Error) -> CoreError + 'a {
    let run_id = new.run_id.clone();
    move |e| {
        if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) {
            CoreError::Config(format!("a run with run_id '{run_id}' already exists"))
        } else {
            store.err()(e)
        }
    }
}

mod tls {
    //! rustls for libpq's `sslmode`/`sslrootcert` (see `connector`):
    //! `verify-ca` checks the chain, `verify-full` the chain and the host
    //! name (or IP address).
    use crate::error::{CoreError, CoreResult};
    use crate::store::url::{PgUrl, SslMode};
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{DigitallySignedStruct, Error, SignatureScheme};
    use std::sync::Arc;

    #[derive(Debug)]
    struct Verifier {
        inner: Option<Arc<rustls::client::WebPkiServerVerifier>>,
        check_name: bool,
        schemes: Vec<SignatureScheme>,
    }

    impl ServerCertVerifier for Verifier {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            server_name: &ServerName<'_>,
            ocsp: &[u8],
            now: UnixTime,
        ) -> Result<ServerCertVerified, Error> {
            let Some(inner) = &self.inner else {
                return Ok(ServerCertVerified::assertion());
            };
            match inner.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
                Err(Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
                    if !self.check_name =>
                {
                    Ok(ServerCertVerified::assertion())
                }
                other => other,
            }
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &rustls::crypto::ring::default_provider().signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &rustls::crypto::ring::default_provider().signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.schemes.clone()
        }
    }

    /// Where the server's CA certificates come from, as libpq reads
    /// `sslrootcert`: a PEM file, `system` (here the common public roots),
    /// or by default `~/.postgresql/root.crt` when that file exists.
    enum Roots {
        File(String),
        System,
    }

    fn roots(url: &PgUrl) -> Option<Roots> {
        match url.sslrootcert.as_deref() {
            Some("system") => Some(Roots::System),
            Some(path) => Some(Roots::File(path.to_string())),
            None => {
                let path = default_root_cert()?;
                std::path::Path::new(&path)
                    .exists()
                    .then_some(Roots::File(path))
            }
        }
    }

    fn default_root_cert() -> Option<String> {
        let home = std::env::var_os("HOME")?;
        Some(
            std::path::Path::new(&home)
                .join(".postgresql/root.crt")
                .to_string_lossy()
                .into_owned(),
        )
    }

    fn load(roots: &Roots) -> CoreResult<rustls::RootCertStore> {
        let mut store = rustls::RootCertStore::empty();
        let path = match roots {
            Roots::System => {
                store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
                return Ok(store);
            }
            Roots::File(path) => path,
        };
        let bad = |e: &dyn std::fmt::Display| {
            CoreError::Config(format!("COMPOSE_STORE sslrootcert '{path}': {e}"))
        };
        let pem = std::fs::read(path).map_err(|e| bad(&e))?;
        for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
            store.add(cert.map_err(|e| bad(&e))?).map_err(|e| bad(&e))?;
        }
        if store.is_empty() {
            return Err(bad(&"no PEM certificate in the file"));
        }
        Ok(store)
    }

    /// `prefer`/`require` encrypt without verifying, unless `require` has a
    /// CA (given, or the default file): it then verifies as `verify-ca`,
    /// as libpq does. `verify-ca`/`verify-full` without a CA is refused.
    pub fn connector(url: &PgUrl) -> CoreResult<tokio_postgres_rustls::MakeRustlsConnect> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = match url.sslmode {
            SslMode::VerifyCa | SslMode::VerifyFull => Some(roots(url).ok_or_else(|| {
                let mode = if url.sslmode == SslMode::VerifyCa {
                    "verify-ca"
                } else {
                    "verify-full"
                };
                CoreError::Config(format!(
                    "COMPOSE_STORE sslmode={mode} needs the server's CA certificate: no \
                     sslrootcert was given and '{}' does not exist -- add \
                     sslrootcert=/path/to/ca.pem (or sslrootcert=system for the common public \
                     roots), or use sslmode=require to encrypt without verifying",
                    default_root_cert().unwrap_or_else(|| "~/.postgresql/root.crt".into())
                ))
            })?),
            SslMode::Require => roots(url),
            _ => None,
        };
        let inner = match roots {
            Some(roots) => Some(
                rustls::client::WebPkiServerVerifier::builder_with_provider(
                    Arc::new(load(&roots)?),
                    provider.clone(),
                )
                .build()
                .map_err(|e| CoreError::Config(format!("COMPOSE_STORE TLS roots: {e}")))?,
            ),
            None => None,
        };
        let verifier = Verifier {
            inner,
            check_name: url.sslmode == SslMode::VerifyFull,
            schemes: provider
                .signature_verification_algorithms
                .supported_schemes(),
        };
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| CoreError::Config(format!("COMPOSE_STORE TLS: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_no_client_auth();
        Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
    }
}

impl PgStore {
    /// Connects (lazily, through the pool) and brings the schema up to date
    /// under an advisory lock.
    pub fn open(url: PgUrl) -> CoreResult<PgStore> {
        let store = PgStore::connect(url)?;
        store.migrate(false)?;
        Ok(store)
    }

    /// Writes the spans queued by then, `SPAN_LATENCY` after the first one.
    fn arm_background_flush(&self) {
        if self.flush_armed.swap(true, Ordering::SeqCst) {
            return;
        }
        let inner = Arc::clone(&self.inner);
        runtime().spawn(async move {
            tokio::time::sleep(SPAN_LATENCY).await;
            inner.flush_armed.store(false, Ordering::SeqCst);
            let _writing = inner.span_writing.lock().await;
            let spans = inner.take_spans();
            if spans.is_empty() {
                return;
            }
            let outcome = async {
                let c = inner.client().await?;
                inner.write_spans(&c, &spans).await
            }
            .await;
            if let Err(e) = outcome {
                crate::store::slot::record_span_write_error(e.to_string());
            }
        });
    }

    /// A store handle without touching the schema (`compose migrate`).
    pub fn connect(url: PgUrl) -> CoreResult<PgStore> {
        let mut cfg = tokio_postgres::Config::new();
        cfg.host(&url.host).port(url.port);
        if let Some(u) = &url.user {
            cfg.user(u);
        } else {
            cfg.user(std::env::var("USER").unwrap_or_else(|_| "postgres".into()));
        }
        if let Some(p) = &url.password {
            cfg.password(p);
        }
        if let Some(d) = &url.dbname {
            cfg.dbname(d);
        }
        cfg.application_name(url.application_name.as_deref().unwrap_or("composeai"));
        cfg.options(format!("-c search_path={}", url.schema));
        cfg.connect_timeout(std::time::Duration::from_secs(10));
        cfg.ssl_mode(match url.sslmode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
        let mgr_cfg = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let mgr = if url.sslmode == SslMode::Disable {
            Manager::from_config(cfg.clone(), tokio_postgres::NoTls, mgr_cfg)
        } else {
            Manager::from_config(cfg.clone(), tls::connector(&url)?, mgr_cfg)
        };
        let pool = {
            // The pool spawns nothing until used, but its builder wants the
            // runtime to be current.
            let _guard = runtime().enter();
            Pool::builder(mgr)
                .max_size(url.pool_size)
                .runtime(deadpool_postgres::Runtime::Tokio1)
                .build()
                .map_err(|e| CoreError::Config(format!("COMPOSE_STORE pool: {e}")))?
        };
        Ok(PgStore {
            inner: Arc::new(PgInner {
                url,
                pool,
                cfg,
                spans: Mutex::new(Vec::new()),
                flush_armed: AtomicBool::new(false),
                batch: Default::default(),
                span_writing: tokio::sync::Mutex::new(()),
                driven: driven::DrivenPool::default(),
            }),
        })
    }
}

impl PgStore {
    /// The state shared with background tasks (the wake-up listener).
    pub fn shared(&self) -> Arc<PgInner> {
        Arc::clone(&self.inner)
    }
}

/// Drives a connection outside the pool, handing its notifications to `tx`.
fn forward_messages<S, T>(
    mut conn: tokio_postgres::Connection<S, T>,
    tx: tokio::sync::mpsc::UnboundedSender<tokio_postgres::AsyncMessage>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio_postgres::tls::TlsStream + Unpin + Send + 'static,
{
    runtime().spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = futures_util::StreamExt::next(&mut messages).await {
            if tx.send(m).is_err() {
                break;
            }
        }
    });
}

impl PgInner {
    pub(crate) fn err(&self) -> impl Fn(tokio_postgres::Error) -> CoreError + '_ {
        store_err(&self.url.redacted)
    }

    pub fn schema(&self) -> &str {
        &self.url.schema
    }

    /// A connection of its own (not pooled) whose server messages arrive on
    /// the returned channel; the client must be kept to keep it open.
    pub(crate) async fn dedicated(
        &self,
    ) -> CoreResult<(
        tokio_postgres::Client,
        tokio::sync::mpsc::UnboundedReceiver<tokio_postgres::AsyncMessage>,
    )> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let client = if self.url.sslmode == SslMode::Disable {
            let (client, conn) = self
                .cfg
                .connect(tokio_postgres::NoTls)
                .await
                .map_err(|e| cannot_connect(&self.url, describe(&e)))?;
            forward_messages(conn, tx);
            client
        } else {
            let (client, conn) = self
                .cfg
                .connect(tls::connector(&self.url)?)
                .await
                .map_err(|e| cannot_connect(&self.url, describe(&e)))?;
            forward_messages(conn, tx);
            client
        };
        Ok((client, rx))
    }

    pub(crate) async fn client(&self) -> CoreResult<Object> {
        self.pool.get().await.map_err(|e| {
            let why = match &e {
                deadpool_postgres::PoolError::Backend(b) => describe(b),
                other => other.to_string(),
            };
            cannot_connect(&self.url, why)
        })
    }

    /// Brings the schema to `PG_SCHEMA_VERSION` (or, with `dry_run`, only
    /// reports); returns `(version found, version now)`. Many processes may
    /// call it at once: the advisory lock lets exactly one migrate.
    pub fn migrate(&self, dry_run: bool) -> CoreResult<(i32, i32)> {
        block_on(async {
            let mut c = self.client().await?;
            let schema = &self.url.schema;
            let tx = c.transaction().await.map_err(self.err())?;
            tx.execute(
                "SELECT pg_advisory_xact_lock(hashtext($1))",
                &[&format!("composeai.migrate.{schema}")],
            )
            .await
            .map_err(self.err())?;
            let exists: bool = tx
                .query_one(
                    "SELECT EXISTS(SELECT 1 FROM pg_tables WHERE schemaname = $1 \
                     AND tablename = 'schema_version')",
                    &[schema],
                )
                .await
                .map_err(self.err())?
                .get(0);
            let found: i32 = if exists {
                tx.query_opt("SELECT version FROM schema_version", &[])
                    .await
                    .map_err(self.err())?
                    .map_or(0, |r| r.get(0))
            } else {
                0
            };
            if found > PG_SCHEMA_VERSION {
                return Err(CoreError::Config(format!(
                    "composeai store '{}' has schema version {found}, newer than this composeai \
                     supports (version {PG_SCHEMA_VERSION}) -- upgrade composeai to open it",
                    self.url.redacted
                )));
            }
            if dry_run || found == PG_SCHEMA_VERSION {
                tx.rollback().await.map_err(self.err())?;
                return Ok((found, found));
            }
            tx.batch_execute(&format!(
                "CREATE SCHEMA IF NOT EXISTS {schema}; SET LOCAL search_path = {schema}; \
                 CREATE TABLE IF NOT EXISTS schema_version(version INTEGER NOT NULL);"
            ))
            .await
            .map_err(self.err())?;
            for (_, step) in MIGRATIONS.iter().filter(|(v, _)| *v > found) {
                tx.batch_execute(step).await.map_err(self.err())?;
            }
            tx.execute("DELETE FROM schema_version", &[])
                .await
                .map_err(self.err())?;
            tx.execute(
                "INSERT INTO schema_version(version) VALUES($1)",
                &[&PG_SCHEMA_VERSION],
            )
            .await
            .map_err(self.err())?;
            tx.commit().await.map_err(self.err())?;
            Ok((found, PG_SCHEMA_VERSION))
        })
    }

    /// A settlement's writes, fenced on `owner`, inside `tx`: status,
    /// output or error, lease released, agent snapshots, durable rows,
    /// pending interrupts, and `spans`.
    pub(super) async fn settle_tx<C: GenericClient>(
        &self,
        tx: &C,
        rid: i64,
        owner: &str,
        s: &Settlement,
        spans: &[SpanParams],
    ) -> CoreResult<()> {
        self.write_spans(tx, spans).await?;
        let t = now();
        // Fenced on the lease, so written while the run still holds it.
        for a in &s.agent_states {
            write_agent_state(tx, rid, a, t).await.map_err(self.err())?;
        }
        let n = tx
            .execute(
                "WITH r AS (DELETE FROM run_recoveries WHERE rid = $5) \
                 UPDATE runs SET status = $1, output_json = $2, error_json = $3, \
                 updated_at = $4, lease_owner = NULL, lease_until = NULL WHERE rid = $5 AND \
                 lease_owner = $6",
                &[&s.status, &s.output_json, &s.error_json, &t, &rid, &owner],
            )
            .await
            .map_err(self.err())?;
        if n == 0 {
            return Err(moved(tx, rid).await);
        }
        crate::store::postgres::ext::on_settle(tx, rid, &s.status, s.wait.as_ref())
            .await
            .map_err(self.err())?;
        for p in &s.pending {
            tx.execute(
                "INSERT INTO pending_interrupts(rid, interrupt_id, kind, question, \
                 payload_json, created_at) VALUES($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (rid, interrupt_id) DO UPDATE SET kind = EXCLUDED.kind, \
                 question = EXCLUDED.question, payload_json = EXCLUDED.payload_json, \
                 created_at = EXCLUDED.created_at",
                &[
                    &rid,
                    &p.interrupt_id,
                    &p.kind,
                    &p.question,
                    &p.payload_json,
                    &t,
                ],
            )
            .await
            .map_err(self.err())?;
        }
        Ok(())
    }

    pub(super) fn take_spans(&self) -> Vec<SpanParams> {
        std::mem::take(&mut *self.spans.lock())
            .into_iter()
            .map(SpanParams::new)
            .collect()
    }

    /// Writes spans on `c`, pipelined: one round trip for the batch.
    pub(super) async fn write_spans<C: GenericClient>(
        &self,
        c: &C,
        spans: &[SpanParams],
    ) -> CoreResult<()> {
        if spans.is_empty() {
            return Ok(());
        }
        let st = c
            .prepare_cached(span_insert_sql())
            .await
            .map_err(self.err())?;
        let owner = owner().to_string();
        let futs = spans.iter().map(|s| {
            let mut p = s.params();
            p.push(&owner);
            let st = st.clone();
            async move { c.execute(&st, &p).await }
        });
        for r in join_all(futs).await {
            r.map_err(self.err())?;
        }
        Ok(())
    }

    /// STORE-12 bookkeeping inside `acquire` (see the SQLite store's
    /// `count_recovery`): `Some(max)` when the run is to be failed.
    async fn count_recovery(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        rid: i64,
        takeover: Takeover,
        recovering: bool,
    ) -> CoreResult<Option<u32>> {
        match takeover {
            Takeover::Manual => {
                tx.execute("DELETE FROM run_recoveries WHERE rid = $1", &[&rid])
                    .await
                    .map_err(self.err())?;
                Ok(None)
            }
            Takeover::Recover { .. } if !recovering => Ok(None),
            Takeover::Recover { max } => {
                let count: i32 = tx
                    .query_opt("SELECT count FROM run_recoveries WHERE rid = $1", &[&rid])
                    .await
                    .map_err(self.err())?
                    .map_or(0, |r| r.get(0));
                if i64::from(count) >= i64::from(max) {
                    return Ok(Some(max));
                }
                tx.execute(
                    "INSERT INTO run_recoveries(rid, count) VALUES($1, 1) \
                     ON CONFLICT (rid) DO UPDATE SET count = run_recoveries.count + 1",
                    &[&rid],
                )
                .await
                .map_err(self.err())?;
                Ok(None)
            }
        }
    }

    /// The earliest expiry (wall time) after `after` of a lease held by
    /// another process than `owner`: when a worker should look for a run
    /// to recover.
    pub fn next_lease_expiry(&self, owner: &str, after: f64) -> CoreResult<Option<f64>> {
        block_on(async {
            let c = self.client().await?;
            Ok(c.query_one(
                "SELECT MIN(lease_until) FROM runs WHERE lease_owner IS NOT NULL \
                 AND lease_owner <> $1 AND lease_until > $2 AND status IN ('running', 'paused')",
                &[&owner, &after],
            )
            .await
            .map_err(self.err())?
            .get(0))
        })
    }

    /// Gives up `owner`'s leases (a worker stopping mid-run): each run is
    /// left `running` with no holder, for any worker to continue.
    pub fn release_leases(&self, owner: &str) -> CoreResult<usize> {
        block_on(async {
            let c = self.client().await?;
            c.execute(
                "UPDATE runs SET status = 'running', lease_owner = NULL, lease_until = NULL \
                 WHERE lease_owner = $1",
                &[&owner],
            )
            .await
            .map(|n| n as usize)
            .map_err(self.err())
        })
    }

    async fn commit_step_async(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        span: Option<SpanRecord>,
    ) -> CoreResult<Option<String>> {
        let queued = self.take_spans();
        let c = self.client().await?;
        let owner = owner();
        let span = span.map(SpanParams::new);
        let st = c
            .prepare_cached(step_sql(span.is_some()))
            .await
            .map_err(self.err())?;
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&rid, &owner, &key, &value];
        if let Some(s) = &span {
            params.extend(s.params());
        }
        let (row, spans) =
            futures_util::join!(c.query_one(&st, &params), self.write_spans(&c, &queued));
        let row = row.map_err(self.err())?;
        if let Err(e) = spans {
            crate::store::slot::record_span_write_error(e.to_string());
        }
        let run_id: Option<String> = row.get(0);
        if run_id.is_none() {
            return Err(moved(&c, rid).await);
        }
        let stored: Option<String> = row.get(1);
        Ok(stored.filter(|s| s != value))
    }

    /// The run's cancel request (EXT-10), if one is stored.
    async fn cancel_request_async(&self, rid: i64) -> CoreResult<Option<Option<String>>> {
        let c = self.client().await?;
        let st = c
            .prepare_cached("SELECT reason FROM cancel_requests WHERE rid = $1")
            .await
            .map_err(self.err())?;
        Ok(c.query_opt(&st, &[&rid])
            .await
            .map_err(self.err())?
            .map(|r| r.get(0)))
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

async fn write_agent_state<C: GenericClient>(
    c: &C,
    rid: i64,
    a: &AgentStateRow,
    at: f64,
) -> Result<u64, tokio_postgres::Error> {
    c.execute(
        &format!(
            "WITH {FENCE} INSERT INTO agent_state(rid, scope_key, messages_json, \
             partial_results_json, turn, updated_at) SELECT rid, $3, $4, $5, $6, $7 FROM f \
             ON CONFLICT (rid, scope_key) DO UPDATE SET messages_json = EXCLUDED.messages_json, \
             partial_results_json = EXCLUDED.partial_results_json, turn = EXCLUDED.turn, \
             updated_at = EXCLUDED.updated_at"
        ),
        &[
            &rid,
            &owner(),
            &a.scope_key,
            &a.messages_json,
            &a.partial_results_json,
            &a.turn,
            &at,
        ],
    )
    .await
}

impl Store for PgStore {
    fn path(&self) -> &str {
        &self.url.redacted
    }

    fn create_run(&self, new: &NewRun, owner: &str, lease_until: f64) -> CoreResult<RunRow> {
        block_on(async {
            let spans = self.take_spans();
            let c = self.client().await?;
            let t = now();
            let st = c.prepare_cached(INSERT_RUN).await.map_err(self.err())?;
            let params = insert_run_params(new, &t, &owner, &lease_until);
            let (row, _) =
                futures_util::join!(c.query_one(&st, &params), self.write_spans(&c, &spans));
            let row = row.map_err(insert_run_err(self, new))?;
            Ok(RunRow::inserted(new, row.get(0), "running", t))
        })
    }

    fn acquire(
        &self,
        run_id: &str,
        owner: &str,
        lease_until: f64,
        live: LeaseCheck<'_>,
        takeover: Takeover,
    ) -> CoreResult<(RunRow, Vec<(String, String)>)> {
        self.flush()?;
        block_on(async {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(self.err())?;
            let row = tx
                .query_opt(
                    &format!(
                        "SELECT {RUN_COLUMNS}, lease_owner, lease_until FROM runs \
                         WHERE run_id = $1 FOR UPDATE"
                    ),
                    &[&run_id],
                )
                .await
                .map_err(self.err())?
                .ok_or_else(|| CoreError::Config(format!("no run found with run_id '{run_id}'")))?;
            let run = read_run(&row);
            let holder: Option<String> = row.get(13);
            let until: Option<f64> = row.get(14);
            if let Some(holder) = &holder {
                if holder != owner && live(holder, until.unwrap_or(0.0)) {
                    return Err(CoreError::Config(format!(
                        "run '{run_id}' is already being executed by another process ({holder}) \
                         -- one process executes a run at a time; resume it after that process \
                         has finished or exited"
                    )));
                }
            }
            let recovering = holder.as_deref().is_some_and(|h| h != owner);
            if let Some(h) = holder.as_deref().filter(|h| *h != owner) {
                tx.execute(
                    "INSERT INTO lease_takeovers(rid, owner) VALUES($1, $2) ON CONFLICT DO NOTHING",
                    &[&run.rid, &h],
                )
                .await
                .map_err(self.err())?;
            }
            if let Some(max) = self
                .count_recovery(&tx, run.rid, takeover, recovering)
                .await?
            {
                tx.execute(
                    "UPDATE runs SET status = 'failed', error_json = $1, updated_at = $2, \
                     lease_owner = NULL, lease_until = NULL WHERE rid = $3",
                    &[
                        &crate::store::takeover::exhausted_error_json(),
                        &now(),
                        &run.rid,
                    ],
                )
                .await
                .map_err(self.err())?;
                tx.execute("DELETE FROM cancel_requests WHERE rid = $1", &[&run.rid])
                    .await
                    .map_err(self.err())?;
                tx.commit().await.map_err(self.err())?;
                return Err(crate::store::takeover::exhausted(run_id, max));
            }
            tx.execute(
                "UPDATE runs SET lease_owner = $1, lease_until = $2 WHERE rid = $3",
                &[&owner, &lease_until, &run.rid],
            )
            .await
            .map_err(self.err())?;
            crate::store::postgres::ext::on_acquire(&tx, run.rid)
                .await
                .map_err(self.err())?;
            let journal = tx
                .query(
                    "SELECT step_key, value_json FROM journal WHERE rid = $1",
                    &[&run.rid],
                )
                .await
                .map_err(self.err())?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            tx.commit().await.map_err(self.err())?;
            Ok((run, journal))
        })
    }

    fn remote(&self) -> bool {
        true
    }

    fn commit_step_future(
        &self,
        rid: i64,
        key: String,
        value: String,
        span: Option<SpanRecord>,
    ) -> futures_util::future::BoxFuture<'static, CoreResult<Option<String>>> {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move { inner.commit_step_async(rid, &key, &value, span).await })
    }

    fn renew_leases(&self, owner: &str, until: f64, rids: &[i64]) -> CoreResult<Vec<i64>> {
        block_on(async {
            let c = self.client().await?;
            let st = c
                .prepare_cached(
                    "UPDATE runs SET lease_until = $1 WHERE lease_owner = $2 AND rid = ANY($3) \
                     RETURNING rid",
                )
                .await
                .map_err(self.err())?;
            Ok(c.query(&st, &[&until, &owner, &rids])
                .await
                .map_err(self.err())?
                .iter()
                .map(|r| r.get(0))
                .collect())
        })
    }

    fn commit_step(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        span: Option<SpanRecord>,
    ) -> CoreResult<Option<String>> {
        self.commit_step_driven(rid, key, value, span)
    }

    fn queue_span(&self, span: SpanRecord) {
        self.spans.lock().push(span);
        self.arm_background_flush();
    }

    fn commit_deferred(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        span: Option<SpanRecord>,
    ) -> Arc<Slot> {
        // Durable before returning: a later `flush` has nothing to wait for.
        Slot::filled(self.commit_step(rid, key, value, span))
    }

    fn flush(&self) -> CoreResult<()> {
        block_on(async {
            self.write_batch().await?;
            let _writing = self.span_writing.lock().await;
            let spans = self.take_spans();
            if spans.is_empty() {
                return Ok(());
            }
            let c = self.client().await?;
            self.write_spans(&c, &spans).await
        })
    }

    fn supports_batch(&self) -> bool {
        true
    }

    fn commit_batched(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        span: Option<SpanRecord>,
        slot: &Arc<Slot>,
    ) -> CoreResult<()> {
        self.inner.queue_batched(rid, key, value, span, slot);
        Ok(())
    }

    fn settle(&self, rid: i64, owner: &str, s: &Settlement) -> CoreResult<()> {
        let spans = self.take_spans();
        block_on(async {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(self.err())?;
            self.settle_tx(&tx, rid, owner, s, &spans).await?;
            tx.commit().await.map_err(self.err())
        })
    }

    fn set_budget(&self, rid: i64, budget_json: &str) -> CoreResult<()> {
        block_on(async {
            let c = self.client().await?;
            c.execute(
                "UPDATE runs SET budget_json = $1 WHERE rid = $2",
                &[&budget_json, &rid],
            )
            .await
            .map(|_| ())
            .map_err(self.err())
        })
    }

    fn record_answers(&self, rid: i64, answers: &[(String, String)]) -> CoreResult<()> {
        block_on(async {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(self.err())?;
            for (id, value) in answers {
                tx.execute(
                    "INSERT INTO journal(rid, step_key, value_json) VALUES($1, $2, $3) \
                     ON CONFLICT DO NOTHING",
                    &[&rid, &format!("__interrupt__:{id}"), value],
                )
                .await
                .map_err(self.err())?;
                tx.execute(
                    "DELETE FROM pending_interrupts WHERE rid = $1 AND interrupt_id = $2",
                    &[&rid, id],
                )
                .await
                .map_err(self.err())?;
            }
            tx.commit().await.map_err(self.err())
        })
    }

    fn get_run(&self, run_id: &str) -> CoreResult<Option<RunRow>> {
        block_on(async {
            let c = self.client().await?;
            let st = c
                .prepare_cached(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = $1"))
                .await
                .map_err(self.err())?;
            Ok(c.query_opt(&st, &[&run_id])
                .await
                .map_err(self.err())?
                .map(|r| read_run(&r)))
        })
    }

    fn delete_run(&self, rid: i64) -> CoreResult<()> {
        self.flush()?;
        block_on(async {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(self.err())?;
            for sql in [
                "DELETE FROM spans WHERE rid = $1 OR trace_id = \
                 (SELECT trace_id FROM runs WHERE rid = $1)",
                "DELETE FROM journal WHERE rid = $1",
                "DELETE FROM pending_interrupts WHERE rid = $1",
                "DELETE FROM agent_state WHERE rid = $1",
                "DELETE FROM cancel_requests WHERE rid = $1",
                "DELETE FROM run_recoveries WHERE rid = $1",
                "DELETE FROM lease_takeovers WHERE rid = $1",
                "DELETE FROM runs WHERE rid = $1",
            ]
            .into_iter()
            .chain(crate::store::postgres::ext::DELETE_DURABLE)
            {
                tx.execute(sql, &[&rid]).await.map_err(self.err())?;
            }
            tx.commit().await.map_err(self.err())
        })
    }

    fn save_agent_state(&self, rid: i64, state: &AgentStateRow) -> CoreResult<()> {
        block_on(async {
            let c = self.client().await?;
            let n = write_agent_state(&c, rid, state, now())
                .await
                .map_err(self.err())?;
            if n == 0 {
                return Err(moved(&c, rid).await);
            }
            Ok(())
        })
    }

    fn load_agent_state(&self, rid: i64, scope_key: &str) -> CoreResult<Option<AgentStateRow>> {
        block_on(async {
            let c = self.client().await?;
            Ok(c.query_opt(
                "SELECT messages_json, partial_results_json, turn FROM agent_state \
                 WHERE rid = $1 AND scope_key = $2",
                &[&rid, &scope_key],
            )
            .await
            .map_err(self.err())?
            .map(|r| AgentStateRow {
                scope_key: scope_key.to_string(),
                messages_json: r.get::<_, Option<String>>(0).unwrap_or_default(),
                partial_results_json: r.get(1),
                turn: r.get::<_, Option<i64>>(2).unwrap_or(0),
            }))
        })
    }

    fn prior_llm_usage(&self, rid: i64) -> CoreResult<PriorSpend> {
        self.flush()?;
        let rows = block_on(async {
            let c = self.client().await?;
            c.query(
                "SELECT s.span_id, s.parent, s.kind, s.step_key, \
                 COALESCE(s.input_tokens, 0) + COALESCE(s.output_tokens, 0), \
                 COALESCE(s.cost_usd, 0) FROM spans s JOIN runs r ON r.trace_id = s.trace_id \
                 WHERE r.rid = $1 AND s.rid = $1",
                &[&rid],
            )
            .await
            .map_err(self.err())
        })?;
        struct Row {
            id: String,
            parent: Option<String>,
            kind: String,
            step_key: Option<String>,
            tokens: i64,
            usd: f64,
        }
        let rows: Vec<Row> = rows
            .iter()
            .map(|r| Row {
                id: decode_id(r.get::<_, &[u8]>(0)),
                parent: r.get::<_, Option<&[u8]>>(1).map(decode_id),
                kind: r.get(2),
                step_key: r.get(3),
                tokens: r.get(4),
                usd: r.get(5),
            })
            .collect();
        let by_id: HashMap<&str, &Row> = rows.iter().map(|r| (r.id.as_str(), r)).collect();
        let mut spend = PriorSpend::default();
        for r in rows.iter().filter(|r| r.kind == "llm") {
            spend.total = (spend.total.0 + r.tokens, spend.total.1 + r.usd);
            // Credit every journaled agent step above the call; bounded by
            // the number of spans, so a corrupt cycle cannot loop.
            let mut cursor = r.parent.as_deref();
            for _ in 0..rows.len() {
                let Some(parent) = cursor.and_then(|id| by_id.get(id)) else {
                    break;
                };
                if parent.kind == "agent" {
                    if let Some(key) = &parent.step_key {
                        let e = spend.by_step.entry(key.clone()).or_insert((0, 0.0));
                        *e = (e.0 + r.tokens, e.1 + r.usd);
                    }
                }
                cursor = parent.parent.as_deref();
            }
        }
        Ok(spend)
    }

    fn pending(&self, rid: i64) -> CoreResult<Vec<InterruptRow>> {
        block_on(async {
            let c = self.client().await?;
            Ok(c.query(
                "SELECT interrupt_id, kind, question, payload_json FROM pending_interrupts \
                 WHERE rid = $1 ORDER BY interrupt_id",
                &[&rid],
            )
            .await
            .map_err(self.err())?
            .iter()
            .map(|r| InterruptRow {
                interrupt_id: r.get(0),
                kind: r.get(1),
                question: r.get(2),
                payload_json: r.get(3),
            })
            .collect())
        })
    }

    fn journal(&self, rid: i64) -> CoreResult<Vec<(String, String)>> {
        block_on(async {
            // Batched steps are part of the journal this process reads.
            self.write_batch().await?;
            let c = self.client().await?;
            Ok(c.query(
                "SELECT step_key, value_json FROM journal WHERE rid = $1",
                &[&rid],
            )
            .await
            .map_err(self.err())?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect())
        })
    }

    fn save_chat(&self, chat: &ChatRow) -> CoreResult<()> {
        block_on(async {
            let c = self.client().await?;
            c.execute(
                "INSERT INTO chats(chat_id, agent_name, system, model, messages_json, \
                 created_at, updated_at) VALUES($1, $2, $3, $4, $5, $6, $7) \
                 ON CONFLICT (chat_id) DO UPDATE SET agent_name = EXCLUDED.agent_name, \
                 system = EXCLUDED.system, model = EXCLUDED.model, \
                 messages_json = EXCLUDED.messages_json, updated_at = EXCLUDED.updated_at",
                &[
                    &chat.chat_id,
                    &chat.agent_name,
                    &chat.system,
                    &chat.model,
                    &chat.messages_json,
                    &chat.created_at,
                    &now(),
                ],
            )
            .await
            .map(|_| ())
            .map_err(self.err())
        })
    }

    fn load_chat(&self, chat_id: &str) -> CoreResult<Option<ChatRow>> {
        block_on(async {
            let c = self.client().await?;
            Ok(c.query_opt(
                "SELECT chat_id, agent_name, system, model, messages_json, created_at, \
                 updated_at FROM chats WHERE chat_id = $1",
                &[&chat_id],
            )
            .await
            .map_err(self.err())?
            .map(|r| ChatRow {
                chat_id: r.get(0),
                agent_name: r.get::<_, Option<String>>(1).unwrap_or_default(),
                system: r.get(2),
                model: r.get(3),
                messages_json: r.get::<_, Option<String>>(4).unwrap_or_default(),
                created_at: r.get::<_, Option<f64>>(5).unwrap_or(0.0),
                updated_at: r.get::<_, Option<f64>>(6).unwrap_or(0.0),
            }))
        })
    }

    fn cancel_request(&self, rid: i64) -> CoreResult<Option<Option<String>>> {
        block_on(self.cancel_request_async(rid))
    }

    fn wait_slice(&self) -> std::time::Duration {
        crate::store::postgres::listen::ensure_listener(self);
        crate::store::postgres::listen::PG_POLL
    }

    fn create_run_with(
        &self,
        new: &NewRun,
        owner: &str,
        lease_until: f64,
        work: &mut GraphWork<'_>,
        drain: bool,
    ) -> CoreResult<RunRow> {
        self.create_run_in(new, owner, lease_until, work, drain)
    }

    fn settle_with(
        &self,
        rid: i64,
        owner: &str,
        settlement: &Settlement,
        work: &mut GraphWork<'_>,
    ) -> CoreResult<()> {
        self.settle_in(rid, owner, settlement, work)
    }

    fn commit_with(
        &self,
        rid: i64,
        entries: &[(String, String)],
        work: &mut GraphWork<'_>,
    ) -> CoreResult<()> {
        self.commit_in(rid, entries, work)
    }

    fn transact(&self, work: &mut GraphWork<'_>) -> CoreResult<()> {
        self.transact_in(work)
    }

    fn read(&self, work: &mut GraphWork<'_>) -> CoreResult<()> {
        self.read_in(work)
    }
}
