//! A synchronous step commit on a connection the calling thread drives
//! itself (STORE-30).
//!
//! A pooled client's connection runs as a task on the shared runtime, so a
//! blocking caller crosses threads twice per round trip: it hands its request
//! to a runtime worker, which writes the socket, and the worker hands the
//! reply back. The connections here keep their own single-threaded runtime
//! and their `Connection` future beside the client: the thread that commits a
//! step writes the request, waits on the socket and reads the reply itself, as
//! the `postgres` crate does. They are pooled (at most the URL's
//! `pool_size`; beyond that a step goes through the shared pool), connected
//! like the pool's (TLS included), and carry the same fenced statements.

use crate::error::{CoreError, CoreResult};
use crate::store::postgres::inner::PgInner;
use crate::store::postgres::sql::{
    connect_failed, owner, span_insert_once_sql, span_insert_sql, step_once_sql, step_sql,
    SpanParams,
};
use crate::store::postgres::state::{drive, Driven, Driver, OwnRuntime};
use crate::store::postgres::tls;
use crate::store::url::SslMode;
use crate::store::SpanRecord;
use futures_util::future::join_all;
use std::sync::atomic::Ordering;
use tokio_postgres::types::ToSql;

impl Driven {
    fn connect(inner: &PgInner) -> CoreResult<Driven> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| CoreError::Store(format!("composeai cannot start a runtime: {e}")))?;
        let tls = match inner.url.sslmode {
            SslMode::Disable => None,
            _ => Some(tls::connector(&inner.url)?),
        };
        // The login and TLS handshake are bounded like any try.
        let connecting = async {
            match tls {
                None => {
                    let (client, conn) = inner.cfg.connect(tokio_postgres::NoTls).await?;
                    Ok::<_, tokio_postgres::Error>((client, Box::pin(conn) as Driver))
                }
                Some(tls) => {
                    let (client, conn) = inner.cfg.connect(tls).await?;
                    Ok((client, Box::pin(conn) as Driver))
                }
            }
        };
        // The timer is made inside the runtime it belongs to.
        let connected =
            rt.block_on(async { tokio::time::timeout(inner.limits.timeout, connecting).await });
        let (client, conn) = connected
            .map_err(|_| inner.silent())?
            .map_err(|e| connect_failed(&inner.url, &e))?;
        Ok(Driven {
            client,
            conn: Some(conn),
            steps: [None, None],
            spans: None,
            rt: OwnRuntime(Some(rt)),
        })
    }

    /// One step: the queued spans and the fenced step statement pipelined in
    /// one round trip, as `commit_step_async` sends them. A `retry` of a
    /// step whose reply was lost may find its rows already committed, so it
    /// inserts each span only if its id is not stored yet (`*_once_sql`,
    /// prepared for the retry alone: it is rare).
    #[allow(clippy::too_many_arguments)]
    fn commit(
        &mut self,
        inner: &PgInner,
        rid: i64,
        key: &str,
        value: &str,
        ident: Option<&str>,
        span: &Option<SpanParams>,
        queued: &[SpanParams],
        retry: bool,
    ) -> Result<Option<String>, Failure> {
        let Driven {
            rt,
            client,
            conn,
            steps,
            spans,
        } = self;
        let slot = &mut steps[usize::from(span.is_some())];
        let step = match slot {
            _ if retry => drive(rt, conn, client.prepare(step_once_sql(span.is_some())))?,
            Some(st) => st.clone(),
            None => {
                let st = drive(rt, conn, client.prepare(step_sql(span.is_some())))?;
                slot.insert(st).clone()
            }
        };
        let once;
        let spans = if queued.is_empty() {
            None
        } else if retry {
            once = drive(rt, conn, client.prepare(span_insert_once_sql()))?;
            Some(&once)
        } else {
            if spans.is_none() {
                *spans = Some(drive(rt, conn, client.prepare(span_insert_sql()))?);
            }
            spans.as_ref()
        };
        let owner = owner();
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&rid, &owner, &key, &value, &ident];
        if let Some(s) = span {
            params.extend(s.params());
        }
        let span_owner = owner.to_string();
        let writes = queued.iter().map(|s| {
            let mut p = s.params();
            p.push(&span_owner);
            let client = &*client;
            async move {
                match spans {
                    Some(st) => client.execute(st, &p).await.map(|_| ()),
                    None => Ok(()),
                }
            }
        });
        let replied = drive(rt, conn, async {
            let round_trip =
                async { futures_util::join!(client.query_one(&step, &params), join_all(writes)) };
            tokio::time::timeout(inner.limits.timeout, round_trip).await
        });
        let Ok((row, written)) = replied else {
            return Err(Failure::Silent);
        };
        let row = row?;
        for r in written {
            if let Err(e) = r {
                crate::store::slot::record_span_write_error(inner.err()(e).to_string());
                break;
            }
        }
        let run_id: Option<String> = row.get(0);
        if run_id.is_none() {
            let found = drive(
                rt,
                conn,
                client.query_opt("SELECT run_id FROM runs WHERE rid = $1", &[&rid]),
            );
            let run_id = found
                .ok()
                .flatten()
                .map_or_else(|| format!("#{rid}"), |r| r.get(0));
            return Err(Failure::Moved(crate::store::takeover::moved(&run_id)));
        }
        let stored: Option<String> = row.get(1);
        Ok(stored.filter(|s| s != value))
    }

    fn closed(&self) -> bool {
        self.conn.is_none() || self.client.is_closed()
    }
}

/// Why a driven step failed: the server's or driver's error, or a refused
/// write (the run moved to another owner).
enum Failure {
    Pg(tokio_postgres::Error),
    Moved(CoreError),
    /// No reply within `COMPOSE_STORE_TIMEOUT`.
    Silent,
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Failure {
        Failure::Pg(e)
    }
}

impl PgInner {
    /// `commit_step` for a blocking caller: on a driven connection (see the
    /// module), or through the shared pool when all `pool_size` are busy.
    /// Retried through an outage like every operation: the step is
    /// idempotent (first write wins, a stored equal value reads as this
    /// write, and a retry skips span rows already stored, since the server
    /// may have committed them before the connection ended).
    pub(super) fn commit_step_driven(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        ident: Option<&str>,
        span: Option<SpanRecord>,
    ) -> CoreResult<Option<String>> {
        let queued = self.take_spans();
        let span = span.map(SpanParams::new);
        self.retry_blocking(|retry| {
            let reused = self.driven.idle.lock().pop();
            let mut d = match reused {
                Some(d) => d,
                None if self.driven.open.fetch_add(1, Ordering::SeqCst) < self.url.pool_size => {
                    match Driven::connect(self) {
                        Ok(d) => d,
                        Err(e) => {
                            self.driven.open.fetch_sub(1, Ordering::SeqCst);
                            return Err(e);
                        }
                    }
                }
                None => {
                    self.driven.open.fetch_sub(1, Ordering::SeqCst);
                    return crate::runtime::block_on(
                        self.commit_step_pooled(rid, key, value, ident, &span, &queued, retry),
                    );
                }
            };
            let out = d.commit(self, rid, key, value, ident, &span, &queued, retry);
            let healthy = !d.closed() && !matches!(out, Err(Failure::Silent));
            if healthy {
                self.driven.idle.lock().push(d);
            } else {
                self.driven.open.fetch_sub(1, Ordering::SeqCst);
            }
            out.map_err(|f| self.failure(f))
        })
    }

    fn failure(&self, f: Failure) -> CoreError {
        match f {
            Failure::Pg(e) => self.err()(e),
            Failure::Moved(e) => e,
            Failure::Silent => self.silent(),
        }
    }
}
