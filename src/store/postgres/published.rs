//! Events, streams, the run listing and retention on PostgreSQL (OPS-20 …
//! OPS-23): `PublishStore`. Every write of an attempt is fenced on it
//! owning the run (a `FOR SHARE` read of the run row first); the schema's
//! triggers send the wake-up hint readers wait on.

use crate::error::{CoreError, CoreResult};
use crate::runtime::block_on;
use crate::store::postgres::inner::{PgInner, PgStore};
use crate::store::postgres::sql::{exec, moved, owner, rows};
use crate::store::published::{
    fork_origin, ListedRun, PruneFilter, PublishStore, Published, StreamChunk, FORK_KEY,
};
use crate::store::query::RunFilter;
use crate::store::Store;
use crate::time::now;
use deadpool_postgres::GenericClient;

/// Locks run `rid` against a takeover for the rest of the transaction;
/// refuses when this process does not own it.
async fn fence<C: GenericClient>(store: &PgInner, c: &C, rid: i64) -> CoreResult<()> {
    let found = rows(
        c,
        "SELECT run_id FROM runs WHERE rid = $1 AND lease_owner = $2 FOR SHARE",
        &[&rid, &owner()],
    )
    .await
    .map_err(store.err())?;
    if found.is_empty() {
        return Err(moved(c, rid).await);
    }
    Ok(())
}

fn closed(key: &str) -> CoreError {
    CoreError::Config(format!(
        "stream '{key}' of this run is closed -- write every value before close_stream('{key}')"
    ))
}

async fn is_closed<C: GenericClient>(
    store: &PgInner,
    c: &C,
    rid: i64,
    key: &str,
) -> CoreResult<bool> {
    Ok(!rows(
        c,
        "SELECT 1 FROM run_stream_ends WHERE rid = $1 AND key = $2",
        &[&rid, &key],
    )
    .await
    .map_err(store.err())?
    .is_empty())
}

/// Appends `values` after the stream's last sequence number. The run row's
/// `FOR SHARE` lock does not order two appenders of one run; only the
/// run's owner appends, from one attempt.
async fn append<C: GenericClient>(
    store: &PgInner,
    c: &C,
    rid: i64,
    key: &str,
    values: &[&str],
) -> CoreResult<()> {
    exec(
        c,
        "INSERT INTO run_streams(rid, key, seq, value_json) \
         SELECT $1, $2, COALESCE((SELECT MAX(seq) FROM run_streams WHERE rid = $1 AND key = $2), 0) \
                + v.n, v.value \
         FROM unnest($3::TEXT[]) WITH ORDINALITY AS v(value, n)",
        &[&rid, &key, &values],
    )
    .await
    .map_err(store.err())?;
    Ok(())
}

/// The rids a prune deletes next (see the SQLite store's `PRUNE_SELECT`);
/// rows locked by another transaction are skipped, and the rows returned
/// stay locked until the deleting transaction ends.
const PRUNE_SELECT: &str = "\
    SELECT r.rid FROM runs r \
    WHERE r.created_at < $1 AND r.updated_at < $1 AND r.status = ANY($2) \
      AND r.kind <> 'graph' AND r.lease_owner IS NULL \
      AND ($3::TEXT IS NULL OR r.name = $3) AND ($4::TEXT IS NULL OR r.kind = $4) \
      AND r.run_id NOT IN (SELECT f.value_json::jsonb ->> 'run_id' FROM journal f \
          WHERE f.step_key = '__fork__' \
              AND f.value_json::jsonb ->> 'run_id' IS NOT NULL AND NOT EXISTS (SELECT 1 FROM journal a \
              WHERE a.rid = f.rid AND a.step_key = f.value_json::jsonb ->> 'at')) \
    ORDER BY r.created_at LIMIT $5";

const PRUNE_DELETE: [&str; 16] = [
    "DELETE FROM spans WHERE trace_id IN (SELECT trace_id FROM runs WHERE rid = ANY($1))",
    "DELETE FROM journal WHERE rid = ANY($1)",
    "DELETE FROM pending_interrupts WHERE rid = ANY($1)",
    "DELETE FROM agent_state WHERE rid = ANY($1)",
    "DELETE FROM run_recoveries WHERE rid = ANY($1)",
    "DELETE FROM lease_takeovers WHERE rid = ANY($1)",
    "DELETE FROM timers WHERE rid = ANY($1)",
    "DELETE FROM signals WHERE rid = ANY($1)",
    "DELETE FROM cancel_requests WHERE rid = ANY($1)",
    "DELETE FROM waits WHERE rid = ANY($1)",
    "DELETE FROM queue_runs WHERE rid = ANY($1)",
    "DELETE FROM run_events WHERE rid = ANY($1)",
    "DELETE FROM run_streams WHERE rid = ANY($1)",
    "DELETE FROM run_stream_ends WHERE rid = ANY($1)",
    "DELETE FROM graph_checkpoints WHERE rid = ANY($1) AND thread_id IS NULL",
    "DELETE FROM runs WHERE rid = ANY($1)",
];

impl PublishStore for PgStore {
    fn commit_published(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        ident: Option<&str>,
        item: &Published<'_>,
    ) -> CoreResult<Option<String>> {
        self.flush()?;
        block_on(async {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(self.err())?;
            fence(self, &tx, rid).await?;
            let inserted = exec(
                &tx,
                "INSERT INTO journal(rid, step_key, value_json, ident) VALUES($1, $2, $3, $4) \
                 ON CONFLICT DO NOTHING",
                &[&rid, &key, &value, &ident],
            )
            .await
            .map_err(self.err())?;
            if inserted == 0 {
                let stored: String = tx
                    .query_one(
                        "SELECT value_json FROM journal WHERE rid = $1 AND step_key = $2",
                        &[&rid, &key],
                    )
                    .await
                    .map_err(self.err())?
                    .get(0);
                tx.commit().await.map_err(self.err())?;
                return Ok((stored != value).then_some(stored));
            }
            match item {
                Published::Event { key, value } => {
                    exec(
                        &tx,
                        "INSERT INTO run_events(rid, key, value_json, updated_at) \
                         VALUES($1, $2, $3, $4) ON CONFLICT(rid, key) DO UPDATE SET \
                         value_json = excluded.value_json, updated_at = excluded.updated_at",
                        &[&rid, key, value, &now()],
                    )
                    .await
                    .map_err(self.err())?;
                }
                Published::Append { key, value } => {
                    if is_closed(self, &tx, rid, key).await? {
                        return Err(closed(key));
                    }
                    append(self, &tx, rid, key, &[value]).await?;
                }
                Published::Close { key } => {
                    exec(
                        &tx,
                        "INSERT INTO run_stream_ends(rid, key) VALUES($1, $2) \
                         ON CONFLICT DO NOTHING",
                        &[&rid, key],
                    )
                    .await
                    .map_err(self.err())?;
                }
            }
            tx.commit().await.map_err(self.err())?;
            Ok(None)
        })
    }

    fn append_stream(&self, rid: i64, key: &str, values: &[String]) -> CoreResult<()> {
        block_on(async {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(self.err())?;
            fence(self, &tx, rid).await?;
            if is_closed(self, &tx, rid, key).await? {
                return Err(closed(key));
            }
            let values: Vec<&str> = values.iter().map(String::as_str).collect();
            append(self, &tx, rid, key, &values).await?;
            tx.commit().await.map_err(self.err())
        })
    }

    fn event(&self, rid: i64, key: &str) -> CoreResult<Option<String>> {
        block_on(async {
            let c = self.client().await?;
            Ok(rows(
                &c,
                "SELECT value_json FROM run_events WHERE rid = $1 AND key = $2",
                &[&rid, &key],
            )
            .await
            .map_err(self.err())?
            .first()
            .map(|r| r.get(0)))
        })
    }

    fn events(&self, rid: i64) -> CoreResult<Vec<(String, String)>> {
        block_on(async {
            let c = self.client().await?;
            Ok(rows(
                &c,
                "SELECT key, value_json FROM run_events WHERE rid = $1 ORDER BY key",
                &[&rid],
            )
            .await
            .map_err(self.err())?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect())
        })
    }

    fn stream_after(&self, rid: i64, key: &str, after: i64, limit: i64) -> CoreResult<StreamChunk> {
        block_on(async {
            let c = self.client().await?;
            // The end is read first: every value appended before the close
            // is then among the values read.
            let closed = is_closed(self, &c, rid, key).await?;
            let values = rows(
                &c,
                "SELECT seq, value_json FROM run_streams WHERE rid = $1 AND key = $2 \
                 AND seq > $3 ORDER BY seq LIMIT $4",
                &[&rid, &key, &after, &limit],
            )
            .await
            .map_err(self.err())?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
            Ok(StreamChunk { values, closed })
        })
    }

    fn list_runs(&self, f: &RunFilter, matching: Option<&str>) -> CoreResult<Vec<ListedRun>> {
        let runs = match matching {
            None => self.cli_list_runs(f, None)?,
            Some(q) => self
                .cli_search_runs(f, q)?
                .map_err(|m| CoreError::Config(format!("invalid query syntax {q:?}: {m}")))?,
        };
        runs.into_iter()
            .map(|summary| {
                let rid = summary.run.rid;
                let pending = if summary.run.status == "paused" {
                    self.cli_pending(rid)?
                        .into_iter()
                        .map(|p| p.interrupt_id)
                        .collect()
                } else {
                    Vec::new()
                };
                let (queue, origin) = block_on(async {
                    let c = self.client().await?;
                    let r = rows(
                        &c,
                        "SELECT (SELECT queue FROM queue_runs WHERE rid = $1), \
                                (SELECT value_json FROM journal WHERE rid = $1 AND step_key = $2)",
                        &[&rid, &FORK_KEY],
                    )
                    .await
                    .map_err(self.err())?;
                    Ok::<_, CoreError>((
                        r[0].get::<_, Option<String>>(0),
                        r[0].get::<_, Option<String>>(1),
                    ))
                })?;
                Ok(ListedRun {
                    summary,
                    pending,
                    queue,
                    parent_id: origin.as_deref().and_then(fork_origin),
                })
            })
            .collect()
    }

    fn prune_runs(&self, f: &PruneFilter, dry_run: bool) -> CoreResult<u64> {
        let batch = f.batch.max(1) as i64;
        block_on(async {
            let mut c = self.client().await?;
            if dry_run {
                let found = rows(
                    &c,
                    PRUNE_SELECT,
                    &[&f.older_than, &f.statuses, &f.name, &f.kind, &i64::MAX],
                )
                .await
                .map_err(self.err())?;
                return Ok(found.len() as u64);
            }
            let select = format!("{PRUNE_SELECT} FOR UPDATE OF r SKIP LOCKED");
            let mut deleted = 0u64;
            loop {
                let tx = c.transaction().await.map_err(self.err())?;
                let rids: Vec<i64> = rows(
                    &tx,
                    &select,
                    &[&f.older_than, &f.statuses, &f.name, &f.kind, &batch],
                )
                .await
                .map_err(self.err())?
                .iter()
                .map(|r| r.get(0))
                .collect();
                for sql in PRUNE_DELETE {
                    exec(&tx, sql, &[&rids]).await.map_err(self.err())?;
                }
                tx.commit().await.map_err(self.err())?;
                deleted += rids.len() as u64;
                if (rids.len() as i64) < batch {
                    return Ok(deleted);
                }
            }
        })
    }

    fn compact(&self) -> CoreResult<Option<(u64, u64)>> {
        // PostgreSQL's autovacuum reclaims the deleted rows' space.
        Ok(None)
    }
}
