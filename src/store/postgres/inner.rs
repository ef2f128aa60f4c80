//! The store's shared state and its connections: the pool, the dedicated
//! connections, migrations.

use crate::error::{CoreError, CoreResult};
use crate::runtime::runtime;
use crate::store::postgres::reachability::Limits;
use crate::store::postgres::schema::{MIGRATIONS, PG_SCHEMA_VERSION};
use crate::store::postgres::sql::{
    cannot_connect, connect_failed, moved, on_settle, owner, span_insert_once_sql, span_insert_sql,
    step_once_sql, step_sql, store_err, write_agent_state, SpanParams,
};
use crate::store::postgres::state::{Batch, DrivenPool};
use crate::store::postgres::tls;
use crate::store::takeover::Takeover;
use crate::store::url::{PgUrl, SslMode};
use crate::store::{NewRun, Settlement, SpanRecord};
use deadpool_postgres::GenericClient;
use deadpool_postgres::{Object, Pool};
use futures_util::future::join_all;
use parking_lot::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use tokio_postgres::types::ToSql;

pub struct PgStore {
    pub(super) inner: Arc<PgInner>,
}

impl std::ops::Deref for PgStore {
    type Target = PgInner;
    fn deref(&self) -> &PgInner {
        &self.inner
    }
}

/// The store's state, shared with its background span flush.
pub struct PgInner {
    pub(super) url: PgUrl,
    pub(super) pool: Pool,
    /// The pool's connection settings, for the wake-up listener's own
    /// connection (STORE-22).
    pub(super) cfg: tokio_postgres::Config,
    pub(super) spans: Mutex<Vec<SpanRecord>>,
    pub(super) flush_armed: AtomicBool,
    /// Batch durability's waiting journal rows (`postgres_batch`).
    pub(super) batch: Batch,
    /// Held by the background span write from taking the queued spans until
    /// they are written, so a `flush` meanwhile waits for them.
    pub(super) span_writing: tokio::sync::Mutex<()>,
    /// Connections for blocking step commits (`driven`).
    pub(super) driven: DrivenPool,
    /// How long operations ride out an outage, and one try's bound.
    pub(super) limits: Limits,
}

impl PgInner {
    /// `moved`, for a caller outside the runtime.
    pub(super) fn moved_blocking(&self, rid: i64) -> CoreError {
        let found = self.retry(async |_| {
            let c = self.client().await?;
            Ok(moved(&c, rid).await)
        });
        found.unwrap_or_else(|e| e)
    }
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
                .bounded(async {
                    self.cfg
                        .connect(tokio_postgres::NoTls)
                        .await
                        .map_err(|e| connect_failed(&self.url, &e))
                })
                .await?;
            forward_messages(conn, tx);
            client
        } else {
            let tls = tls::connector(&self.url)?;
            let (client, conn) = self
                .bounded(async {
                    self.cfg
                        .connect(tls)
                        .await
                        .map_err(|e| connect_failed(&self.url, &e))
                })
                .await?;
            forward_messages(conn, tx);
            client
        };
        Ok((client, rx))
    }

    pub(crate) async fn client(&self) -> CoreResult<Object> {
        self.pool.get().await.map_err(|e| match &e {
            deadpool_postgres::PoolError::Backend(b) => connect_failed(&self.url, b),
            deadpool_postgres::PoolError::Timeout(_) => self.silent(),
            other => cannot_connect(&self.url, other.to_string()),
        })
    }

    /// Brings the schema to `PG_SCHEMA_VERSION` (or, with `dry_run`, only
    /// reports); returns `(version found, version now)`. Many processes may
    /// call it at once: the advisory lock lets exactly one migrate.
    pub fn migrate(&self, dry_run: bool) -> CoreResult<(i32, i32)> {
        // One transaction: a try cut short by the connection rolls back.
        self.retry(async |_| {
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
    ///
    /// `t` is the settlement's time, the same for every try: a `retry`
    /// that finds the run already settled at `t` with this status (the
    /// earlier try committed, its reply was lost) succeeds without writing.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn settle_tx<C: GenericClient>(
        &self,
        tx: &C,
        rid: i64,
        owner: &str,
        s: &Settlement,
        spans: &[SpanParams],
        t: f64,
        retry: bool,
    ) -> CoreResult<()> {
        if retry && self.settled_at(tx, rid, &s.status, t).await? {
            return Ok(());
        }
        if retry {
            self.write_spans_once(tx, spans).await?;
        } else {
            self.write_spans(tx, spans).await?;
        }
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
        on_settle(tx, rid, &s.status, s.wait.as_ref())
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

    /// Whether run `rid` was settled with `status` at `t` (by an earlier
    /// try of the same settlement).
    async fn settled_at<C: GenericClient>(
        &self,
        tx: &C,
        rid: i64,
        status: &str,
        t: f64,
    ) -> CoreResult<bool> {
        Ok(tx
            .query_opt(
                "SELECT 1 FROM runs WHERE rid = $1 AND status = $2 AND updated_at = $3 \
                 AND lease_owner IS NULL",
                &[&rid, &status, &t],
            )
            .await
            .map_err(self.err())?
            .is_some())
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

    /// `write_spans` that skips spans already stored: for a retry that may
    /// repeat a committed write.
    pub(super) async fn write_spans_once<C: GenericClient>(
        &self,
        c: &C,
        spans: &[SpanParams],
    ) -> CoreResult<()> {
        if spans.is_empty() {
            return Ok(());
        }
        let st = c
            .prepare_cached(span_insert_once_sql())
            .await
            .map_err(self.err())?;
        let owner = owner().to_string();
        for s in spans {
            let mut p = s.params();
            p.push(&owner);
            c.execute(&st, &p).await.map_err(self.err())?;
        }
        Ok(())
    }

    /// STORE-12 bookkeeping inside `acquire` (see the SQLite store's
    /// `count_recovery`): `Some(max)` when the run is to be failed.
    pub(super) async fn count_recovery(
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
        self.retry(async |_| {
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
        self.retry(async |_| {
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

    pub(super) async fn commit_step_async(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        ident: Option<&str>,
        span: Option<SpanRecord>,
    ) -> CoreResult<Option<String>> {
        let queued = self.take_spans();
        let span = span.map(SpanParams::new);
        let (queued, span) = (&queued, &span);
        // First write wins and an equal stored value reads as this write, so
        // a retry after a lost reply finds the committed row; its spans are
        // written only if not stored yet.
        self.retry_with(move |retry| {
            self.commit_step_try(rid, key, value, ident, span, queued, retry)
        })
        .await
    }

    /// One try of a step commit through the pool, bounded in time.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn commit_step_pooled(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        ident: Option<&str>,
        span: &Option<SpanParams>,
        queued: &[SpanParams],
        retry: bool,
    ) -> CoreResult<Option<String>> {
        self.bounded(self.commit_step_try(rid, key, value, ident, span, queued, retry))
            .await
    }

    /// One try of a step commit: the fenced step statement with its span,
    /// and the queued spans, pipelined on one pooled connection. A `retry`
    /// skips span rows already stored.
    #[allow(clippy::too_many_arguments)]
    async fn commit_step_try(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        ident: Option<&str>,
        span: &Option<SpanParams>,
        queued: &[SpanParams],
        retry: bool,
    ) -> CoreResult<Option<String>> {
        let c = self.client().await?;
        let owner = owner();
        let sql = if retry {
            step_once_sql(span.is_some())
        } else {
            step_sql(span.is_some())
        };
        let st = c.prepare_cached(sql).await.map_err(self.err())?;
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&rid, &owner, &key, &value, &ident];
        if let Some(s) = span {
            params.extend(s.params());
        }
        let spans = async {
            if retry {
                self.write_spans_once(&c, queued).await
            } else {
                self.write_spans(&c, queued).await
            }
        };
        let (row, spans) = futures_util::join!(c.query_one(&st, &params), spans);
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
    pub(super) async fn cancel_request_async(
        &self,
        rid: i64,
    ) -> CoreResult<Option<Option<String>>> {
        self.retry_async(async |_| {
            let c = self.client().await?;
            let st = c
                .prepare_cached("SELECT reason FROM cancel_requests WHERE rid = $1")
                .await
                .map_err(self.err())?;
            Ok(c.query_opt(&st, &[&rid])
                .await
                .map_err(self.err())?
                .map(|r| r.get(0)))
        })
        .await
    }
}

/// Drives a connection outside the pool, handing its notifications to `tx`.
pub(super) fn forward_messages<S, T>(
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

/// The rid of run `new` when an earlier try of its insert committed (its
/// row holds the new run's trace id, unique to this creation).
pub(crate) async fn own_insert<C: GenericClient>(
    store: &PgInner,
    c: &C,
    new: &NewRun,
) -> CoreResult<Option<i64>> {
    Ok(c.query_opt(
        "SELECT rid FROM runs WHERE run_id = $1 AND trace_id = $2",
        &[&new.run_id, &new.trace_id],
    )
    .await
    .map_err(store.err())?
    .map(|r| r.get(0)))
}
