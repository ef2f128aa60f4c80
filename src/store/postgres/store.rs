//! `PgStore`: the `Store` operations.

use crate::error::{CoreError, CoreResult};
use crate::ids::decode_id;
use crate::runtime::{block_on, runtime};
use crate::store::graph::GraphWork;
use crate::store::postgres::inner::{insert_run_err, own_insert, PgInner, PgStore};
use crate::store::postgres::reachability::Limits;
use crate::store::postgres::sql::{
    insert_run_params, moved, on_acquire, read_run, write_agent_state, DELETE_DURABLE, INSERT_RUN,
    INSERT_RUN_KEYED, RUN_COLUMNS,
};
use crate::store::postgres::state::DrivenPool;
use crate::store::postgres::tls;
use crate::store::slot::Slot;
use crate::store::takeover::Takeover;
use crate::store::url::{PgUrl, SslMode};
use crate::store::{
    AgentStateRow, ChatRow, InterruptRow, KeyedRow, LeaseCheck, NewRun, PriorSpend, RunRow,
    Settlement, SpanRecord, Store,
};
use crate::time::now;
use deadpool_postgres::GenericClient;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// How long a finished span may wait before it is written on its own (OBS-5).
const SPAN_LATENCY: std::time::Duration = std::time::Duration::from_millis(50);

impl PgStore {
    /// Connects (lazily, through the pool) and brings the schema up to date
    /// under an advisory lock.
    pub fn open(url: PgUrl) -> CoreResult<PgStore> {
        let store = PgStore::connect(url)?;
        store.migrate(false)?;
        Ok(store)
    }

    /// Writes the spans queued by then, `SPAN_LATENCY` after the first one.
    pub(super) fn arm_background_flush(&self) {
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
            let (inner, spans) = (&*inner, &spans);
            // Through an outage like every write (a retry skips the spans a
            // lost reply had stored), rather than dropping the trace.
            let outcome = inner
                .retry_with(move |retry| async move {
                    let c = inner.client().await?;
                    if retry {
                        inner.write_spans_once(&c, spans).await
                    } else {
                        inner.write_spans(&c, spans).await
                    }
                })
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
        let limits = Limits::from_env()?;
        // The socket's connect; `bounded` covers the login and TLS too.
        cfg.connect_timeout(limits.timeout);
        // A server that vanished without closing the socket (a cut
        // network, a frozen host) is noticed by the kernel, not only by the
        // next statement's timeout.
        cfg.keepalives(true)
            .keepalives_idle(std::time::Duration::from_secs(5))
            .keepalives_interval(std::time::Duration::from_secs(2))
            .keepalives_retries(3)
            .tcp_user_timeout(limits.timeout);
        cfg.options(format!(
            "-c search_path={} -c statement_timeout={}",
            url.schema,
            limits.timeout.as_millis()
        ));
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
                .create_timeout(Some(limits.timeout))
                .recycle_timeout(Some(limits.timeout))
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
                driven: DrivenPool::default(),
                limits,
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

impl Drop for PgStore {
    fn drop(&mut self) {
        // Bounded while the server is away: a dropped handle never waits
        // out an outage.
        let _ = Store::close(self);
    }
}

impl Store for PgStore {
    fn path(&self) -> &str {
        &self.url.redacted
    }

    fn create_run(&self, new: &NewRun, owner: &str, lease_until: f64) -> CoreResult<RunRow> {
        let spans = &self.take_spans();
        let t = now();
        self.retry(async |retry| {
            let c = self.client().await?;
            if retry {
                // The earlier try's insert may have committed: its row
                // carries this run's trace id.
                if let Some(rid) = own_insert(self, &c, new).await? {
                    return Ok(RunRow::inserted(new, rid, "running", t));
                }
            }
            let st = c.prepare_cached(INSERT_RUN).await.map_err(self.err())?;
            let params = insert_run_params(new, &t, &owner, &lease_until);
            let (row, _) =
                futures_util::join!(c.query_one(&st, &params), self.write_spans(&c, spans));
            let row = row.map_err(insert_run_err(self, new))?;
            Ok(RunRow::inserted(new, row.get(0), "running", t))
        })
    }

    fn create_run_keyed(
        &self,
        new: &NewRun,
        owner: &str,
        lease_until: f64,
    ) -> CoreResult<KeyedRow> {
        block_on(async {
            let spans = self.take_spans();
            let c = self.client().await?;
            self.write_spans(&c, &spans).await?;
            let t = now();
            let st = c
                .prepare_cached(INSERT_RUN_KEYED)
                .await
                .map_err(self.err())?;
            let params = insert_run_params(new, &t, &owner, &lease_until);
            if let Some(row) = c.query_opt(&st, &params).await.map_err(self.err())? {
                return Ok(KeyedRow::Created(RunRow::inserted(
                    new,
                    row.get(0),
                    "running",
                    t,
                )));
            }
            // The insert waited for the transaction holding the id to end,
            // so the row it conflicted with is committed and visible here.
            let row = c
                .query_opt(
                    &format!(
                        "SELECT {RUN_COLUMNS}, lease_owner, lease_until FROM runs WHERE run_id = $1"
                    ),
                    &[&new.run_id],
                )
                .await
                .map_err(self.err())?
                .ok_or_else(|| CoreError::Store(format!("run '{}' vanished", new.run_id)))?;
            let holder: Option<String> = row.get(14);
            let until: Option<f64> = row.get(15);
            Ok(KeyedRow::Exists(
                read_run(&row),
                holder.map(|h| (h, until.unwrap_or(0.0))),
            ))
        })
    }

    fn acquire(
        &self,
        run_id: &str,
        owner: &str,
        lease_until: f64,
        live: LeaseCheck<'_>,
        takeover: Takeover,
    ) -> CoreResult<(RunRow, crate::store::JournalRows)> {
        self.flush()?;
        self.retry(async |_| {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(self.err())?;
            let row = tx
                .query_opt(
                    &format!(
                        "SELECT {RUN_COLUMNS}, lease_owner, lease_until, deadline FROM runs \
                         WHERE run_id = $1 FOR UPDATE"
                    ),
                    &[&run_id],
                )
                .await
                .map_err(self.err())?
                .ok_or_else(|| CoreError::Config(format!("no run found with run_id '{run_id}'")))?;
            let mut run = read_run(&row);
            run.deadline = row.get(16);
            let holder: Option<String> = row.get(14);
            let until: Option<f64> = row.get(15);
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
            on_acquire(&tx, run.rid).await.map_err(self.err())?;
            let journal = tx
                .query(
                    "SELECT step_key, value_json, ident FROM journal WHERE rid = $1",
                    &[&run.rid],
                )
                .await
                .map_err(self.err())?
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
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
        ident: Option<String>,
        span: Option<SpanRecord>,
    ) -> futures_util::future::BoxFuture<'static, CoreResult<Option<String>>> {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            inner
                .commit_step_async(rid, &key, &value, ident.as_deref(), span)
                .await
        })
    }

    fn renew_leases(&self, owner: &str, until: f64, rids: &[i64]) -> CoreResult<Vec<i64>> {
        self.retry(async |_| {
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
        ident: Option<&str>,
        span: Option<SpanRecord>,
    ) -> CoreResult<Option<String>> {
        self.commit_step_driven(rid, key, value, ident, span)
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
        ident: Option<&str>,
        span: Option<SpanRecord>,
    ) -> Arc<Slot> {
        // Durable before returning: a later `flush` has nothing to wait for.
        Slot::filled(self.commit_step(rid, key, value, ident, span))
    }

    fn flush(&self) -> CoreResult<()> {
        block_on(async {
            self.write_batch().await?;
            let _writing = self.span_writing.lock().await;
            let spans = &self.take_spans();
            if spans.is_empty() {
                return Ok(());
            }
            self.retry_async(async |retry| {
                let c = self.client().await?;
                if retry {
                    self.write_spans_once(&c, spans).await
                } else {
                    self.write_spans(&c, spans).await
                }
            })
            .await
        })
    }

    fn close(&self) -> CoreResult<()> {
        if !crate::outage::is_down() {
            return self.flush();
        }
        // The process exits while the server is away: one bounded try for
        // what is queued, rather than waiting out the outage.
        block_on(self.bounded(async {
            self.write_batch().await?;
            let spans = self.take_spans();
            let c = self.client().await?;
            self.write_spans(&c, &spans).await
        }))
    }

    fn supports_batch(&self) -> bool {
        true
    }

    fn commit_batched(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        ident: Option<&str>,
        span: Option<SpanRecord>,
        slot: &Arc<Slot>,
    ) -> CoreResult<()> {
        self.inner.queue_batched(rid, key, value, ident, span, slot);
        Ok(())
    }

    fn settle(&self, rid: i64, owner: &str, s: &Settlement) -> CoreResult<()> {
        let spans = &self.take_spans();
        let t = now();
        self.retry(async |retry| {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(self.err())?;
            self.settle_tx(&tx, rid, owner, s, spans, t, retry).await?;
            tx.commit().await.map_err(self.err())
        })
    }

    fn set_budget(&self, rid: i64, budget_json: &str) -> CoreResult<()> {
        self.retry(async |_| {
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
        self.retry(async |_| {
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

    fn code_versions(&self) -> CoreResult<Vec<crate::store::upgrade::VersionRow>> {
        PgStore::code_versions(self)
    }

    fn upgrade_candidates(
        &self,
        flows: &[(String, String)],
        since: Option<f64>,
    ) -> CoreResult<Vec<crate::store::upgrade::Candidate>> {
        PgStore::upgrade_candidates(self, flows, since)
    }

    fn upgrade_run(
        &self,
        req: &crate::store::upgrade::UpgradeRequest<'_>,
        live: LeaseCheck<'_>,
    ) -> CoreResult<crate::store::upgrade::UpgradeOutcome> {
        PgStore::upgrade_run(self, req, live)
    }

    fn answer_interrupts(
        &self,
        run_id: &str,
        answers: &[(String, String)],
        at: Option<&str>,
    ) -> CoreResult<crate::store::answer::AnswerOutcome> {
        PgStore::answer_interrupts(self, run_id, answers, at)
    }

    fn get_run(&self, run_id: &str) -> CoreResult<Option<RunRow>> {
        self.retry(async |_| {
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
        self.retry(async |_| {
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
            .chain(DELETE_DURABLE)
            {
                tx.execute(sql, &[&rid]).await.map_err(self.err())?;
            }
            tx.commit().await.map_err(self.err())
        })
    }

    fn save_agent_state(&self, rid: i64, state: &AgentStateRow) -> CoreResult<()> {
        self.retry(async |_| {
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
        self.retry(async |_| {
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
        let rows = self.retry(async |_| {
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
        self.retry(async |_| {
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

    fn read_journal(&self, run_id: &str) -> CoreResult<Option<(RunRow, crate::journal::Journal)>> {
        block_on(self.write_batch())?;
        self.retry(async |_| {
            let c = self.client().await?;
            let Some(row) = c
                .query_opt(
                    &format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = $1"),
                    &[&run_id],
                )
                .await
                .map_err(self.err())?
            else {
                return Ok(None);
            };
            let run = read_run(&row);
            let rows: crate::store::JournalRows = c
                .query(
                    "SELECT step_key, value_json, ident FROM journal WHERE rid = $1",
                    &[&run.rid],
                )
                .await
                .map_err(self.err())?
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect();
            Ok(Some((run, crate::journal::Journal::from_rows(&rows))))
        })
    }

    fn journal(&self, rid: i64) -> CoreResult<Vec<(String, String)>> {
        // Batched steps are part of the journal this process reads.
        block_on(self.write_batch())?;
        self.retry(async |_| {
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
        self.retry(async |_| {
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
        self.retry(async |_| {
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
