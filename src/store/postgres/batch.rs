//! Batch durability on PostgreSQL (`COMPOSE_DURABILITY=batch`): a step's
//! value is handed back at once and its journal row waits here; a
//! background group-commit on the core's runtime writes every waiting row,
//! in queue order, in one transaction within `BATCH_LATENCY`. Each row is
//! fenced on the owning attempt like a synchronous step (`step_sql`).
//! `flush` writes the waiting rows first, so every synchronous write of an
//! attempt (settlement, answers, waits, fenced steps) comes after its
//! earlier steps in the store.

use crate::error::{CoreError, CoreResult};
use crate::runtime::runtime;
use crate::store::postgres::inner::PgInner;
use crate::store::postgres::sql::{moved, owner, step_sql, SpanParams};
use crate::store::postgres::state::Waiting;
use crate::store::slot::Slot;
use crate::store::SpanRecord;
use futures_util::future::join_all;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio_postgres::types::ToSql;

/// How long a batched step may wait before the group-commit: half the
/// 10 ms promised, leaving the rest for the commit itself.
pub const BATCH_LATENCY: std::time::Duration = std::time::Duration::from_millis(5);

impl PgInner {
    /// Queues `value` under `key` for the group-commit (its span with the
    /// other queued spans); the attempt's `slot` keeps the first failure,
    /// after which its later rows are dropped rather than stored past a
    /// lost one.
    pub(super) fn queue_batched(
        self: &Arc<Self>,
        rid: i64,
        key: &str,
        value: &str,
        ident: Option<&str>,
        span: Option<SpanRecord>,
        slot: &Arc<Slot>,
    ) {
        self.batch.rows.lock().push(Waiting {
            rid,
            key: key.to_string(),
            value: value.to_string(),
            ident: ident.map(str::to_string),
            slot: slot.clone(),
        });
        if let Some(s) = span {
            self.spans.lock().push(s);
        }
        if self.batch.armed.swap(true, Ordering::SeqCst) {
            return;
        }
        let inner = Arc::clone(self);
        runtime().spawn(async move {
            tokio::time::sleep(BATCH_LATENCY).await;
            inner.batch.armed.store(false, Ordering::SeqCst);
            // Failures reach the attempts through their slots.
            let _ = inner.write_batch().await;
        });
    }

    /// Commits every waiting row, in order, in one transaction, with the
    /// queued spans; each slot gets its outcome.
    pub(super) async fn write_batch(&self) -> CoreResult<()> {
        let _writing = self.batch.writing.lock().await;
        let rows: Vec<Waiting> = std::mem::take(&mut *self.batch.rows.lock())
            .into_iter()
            .filter(|w| !w.slot.failed())
            .collect();
        if rows.is_empty() {
            return Ok(());
        }
        let spans = &self.take_spans();
        // Every row is first-write-wins: a retry after a lost commit reply
        // finds the rows stored and reads them as its own.
        let outcome = self
            .retry_with(|retry| self.write_rows(&rows, spans, retry))
            .await;
        match outcome {
            Ok(errors) => {
                for w in &rows {
                    let err = errors.iter().find(|(rid, _)| *rid == w.rid);
                    w.slot.fill(match err {
                        Some((_, e)) => Err(e.clone()),
                        None => Ok(None),
                    });
                }
                Ok(())
            }
            Err(e) => {
                for w in &rows {
                    w.slot.fill(Err(e.clone()));
                }
                Err(e)
            }
        }
    }

    /// One try of the group-commit of `rows` with `spans`: the outcome is
    /// the runs that moved, with their errors.
    async fn write_rows(
        &self,
        rows: &[Waiting],
        spans: &[SpanParams],
        retry: bool,
    ) -> CoreResult<Vec<(i64, CoreError)>> {
        let mut c = self.client().await?;
        let st = c
            .prepare_cached(step_sql(false))
            .await
            .map_err(self.err())?;
        let tx = c.transaction().await.map_err(self.err())?;
        let owner = owner();
        let inserts = rows.iter().map(|w| {
            let params: [&(dyn ToSql + Sync); 5] = [&w.rid, &owner, &w.key, &w.value, &w.ident];
            let (tx, st) = (&tx, &st);
            async move { tx.query_one(st, &params).await }
        });
        let spans = async {
            if retry {
                self.write_spans_once(&tx, spans).await
            } else {
                self.write_spans(&tx, spans).await
            }
        };
        let (results, spans) = futures_util::join!(join_all(inserts), spans);
        if let Err(e) = spans {
            crate::store::slot::record_span_write_error(e.to_string());
        }
        let mut outcomes = Vec::with_capacity(rows.len());
        for r in results {
            let row = r.map_err(self.err())?;
            let run_id: Option<String> = row.get(0);
            outcomes.push(run_id.is_some());
        }
        // A run that moved stored none of its rows (the fence failed
        // for every one of them); the others commit.
        let mut lost = Vec::new();
        for (w, ok) in rows.iter().zip(&outcomes) {
            if !ok && !lost.contains(&w.rid) {
                lost.push(w.rid);
            }
        }
        let mut errors = Vec::with_capacity(lost.len());
        for rid in lost {
            errors.push((rid, moved(&tx, rid).await));
        }
        tx.commit().await.map_err(self.err())?;
        Ok::<_, CoreError>(errors)
    }
}
