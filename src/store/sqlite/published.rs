//! Events, streams, the run listing and retention on SQLite (OPS-20 …
//! OPS-23): `PublishStore` (the tables: `published_schema`).

use crate::error::{AtPath, CoreError, CoreResult};
use crate::store::published::{ListedRun, PruneFilter, PublishStore, Published, StreamChunk};
use crate::store::query::RunFilter;
use crate::store::sqlite::query::{listed_runs, SearchError};
use crate::store::sqlite::rows::{journal_winner, moved_away, JOURNAL_STEP_INSERT};
use crate::store::sqlite::store::SqliteStore;
use crate::time::now;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

/// The error for a value written to a closed stream.
fn closed(key: &str) -> CoreError {
    CoreError::Config(format!(
        "stream '{key}' of this run is closed -- write every value before close_stream('{key}')"
    ))
}

fn is_closed(c: &Connection, rid: i64, key: &str) -> rusqlite::Result<bool> {
    c.prepare_cached("SELECT 1 FROM run_stream_ends WHERE rid = ?1 AND key = ?2")?
        .exists(params![rid, key])
}

/// Appends `values` after the stream's last sequence number.
fn append(c: &Connection, rid: i64, key: &str, values: &[&str]) -> rusqlite::Result<()> {
    let last: i64 = c
        .prepare_cached(
            "SELECT COALESCE(MAX(seq), 0) FROM run_streams WHERE rid = ?1 AND key = ?2",
        )?
        .query_row(params![rid, key], |r| r.get(0))?;
    let mut insert = c.prepare_cached(
        "INSERT INTO run_streams(rid, key, seq, value_json) VALUES(?1, ?2, ?3, ?4)",
    )?;
    for (i, v) in values.iter().enumerate() {
        insert.execute(params![rid, key, last + 1 + i as i64, v])?;
    }
    Ok(())
}

/// Writes `item` of run `rid`.
fn publish(c: &Connection, rid: i64, item: &Published<'_>, path: &str) -> CoreResult<()> {
    match item {
        Published::Event { key, value } => c
            .prepare_cached(
                "INSERT INTO run_events(rid, key, value_json, updated_at) VALUES(?1, ?2, ?3, ?4) \
                 ON CONFLICT(rid, key) DO UPDATE SET value_json = excluded.value_json, \
                 updated_at = excluded.updated_at",
            )
            .and_then(|mut st| st.execute(params![rid, key, value, now()]))
            .map(|_| ())
            .at(path),
        Published::Append { key, value } => {
            if is_closed(c, rid, key).at(path)? {
                return Err(closed(key));
            }
            append(c, rid, key, &[value]).at(path)
        }
        Published::Close { key } => c
            .prepare_cached("INSERT OR IGNORE INTO run_stream_ends(rid, key) VALUES(?1, ?2)")
            .and_then(|mut st| st.execute(params![rid, key]))
            .map(|_| ())
            .at(path),
    }
}

/// The rids of the runs a prune deletes next, at most `f.batch`: settled,
/// last updated before the cutoff (so created before it too, which the
/// index on `created_at` finds), not graph runs (they follow their
/// threads), and not borrowed from by a fork that has not reached its
/// `at` step.
pub(crate) const PRUNE_SELECT: &str = "\
    SELECT r.rid FROM runs r \
    WHERE r.created_at < ?1 AND r.updated_at < ?1 \
      AND r.status IN (SELECT value FROM json_each(?2)) \
      AND r.kind != 'graph' AND r.lease_owner IS NULL \
      AND (?3 IS NULL OR r.name = ?3) AND (?4 IS NULL OR r.kind = ?4) \
      AND r.run_id NOT IN (SELECT json_extract(f.value_json, '$.run_id') FROM journal f \
          WHERE f.step_key = '__fork__' \
              AND json_extract(f.value_json, '$.run_id') IS NOT NULL AND NOT EXISTS (SELECT 1 FROM journal a \
              WHERE a.rid = f.rid AND a.step_key = json_extract(f.value_json, '$.at'))) \
    ORDER BY r.created_at LIMIT ?5";

/// Deletes runs `rids` and every row that belongs to them.
fn delete_runs(c: &Connection, rids: &[i64]) -> rusqlite::Result<()> {
    let list = rids
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let own_traces: String = rids
        .iter()
        .map(|r| (-r).to_string())
        .collect::<Vec<_>>()
        .join(",");
    // A run's own trace is stored under `-rid`; an older run's under the
    // tid of its `traces` row.
    c.execute_batch(&format!(
        "DELETE FROM spans WHERE tid IN ({own_traces}); \
         DELETE FROM spans WHERE tid IN (SELECT t.tid FROM traces t JOIN runs r \
             ON r.trace_id = t.trace_id WHERE r.rid IN ({list})); \
         DELETE FROM traces WHERE trace_id IN (SELECT trace_id FROM runs WHERE rid IN ({list})); \
         DELETE FROM journal WHERE rid IN ({list}); \
         DELETE FROM pending_interrupts WHERE rid IN ({list}); \
         DELETE FROM agent_state WHERE rid IN ({list}); \
         DELETE FROM run_recoveries WHERE rid IN ({list}); \
         DELETE FROM lease_takeovers WHERE rid IN ({list}); \
         DELETE FROM timers WHERE rid IN ({list}); \
         DELETE FROM signals WHERE rid IN ({list}); \
         DELETE FROM cancel_requests WHERE rid IN ({list}); \
         DELETE FROM waits WHERE rid IN ({list}); \
         DELETE FROM queue_runs WHERE rid IN ({list}); \
         DELETE FROM run_events WHERE rid IN ({list}); \
         DELETE FROM run_streams WHERE rid IN ({list}); \
         DELETE FROM run_stream_ends WHERE rid IN ({list}); \
         DELETE FROM graph_checkpoints WHERE rid IN ({list}) AND thread_id IS NULL; \
         DELETE FROM runs WHERE rid IN ({list});"
    ))
}

fn file_bytes(path: &str) -> u64 {
    ["", "-wal"]
        .iter()
        .filter_map(|s| std::fs::metadata(format!("{path}{s}")).ok())
        .map(|m| m.len())
        .sum()
}

impl PublishStore for SqliteStore {
    fn commit_published(
        &self,
        rid: i64,
        key: &str,
        value: &str,
        ident: Option<&str>,
        item: &Published<'_>,
    ) -> CoreResult<Option<String>> {
        let path = crate::store::Store::path(self).to_string();
        let winner = self.with_conn(|c| {
            let tx = c
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .at(&path)?;
            // Fenced (STORE-11): nothing is written once the run moved on.
            if let Some(run_id) = moved_away(&tx, rid).at(&path)? {
                return Err(crate::store::takeover::moved(&run_id));
            }
            let inserted = tx
                .prepare_cached(JOURNAL_STEP_INSERT)
                .and_then(|mut st| st.execute(params![rid, key, value, ident]))
                .at(&path)?;
            if inserted == 1 {
                publish(&tx, rid, item, &path)?;
            }
            let winner = journal_winner(&tx, inserted, rid, key, value).at(&path)?;
            tx.commit().at(&path)?;
            Ok(winner)
        })?;
        crate::store::published::announce();
        Ok(winner)
    }

    fn append_stream(&self, rid: i64, key: &str, values: &[String]) -> CoreResult<()> {
        let path = crate::store::Store::path(self).to_string();
        self.with_conn(|c| {
            let tx = c
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .at(&path)?;
            if let Some(run_id) = moved_away(&tx, rid).at(&path)? {
                return Err(crate::store::takeover::moved(&run_id));
            }
            if is_closed(&tx, rid, key).at(&path)? {
                return Err(closed(key));
            }
            let values: Vec<&str> = values.iter().map(String::as_str).collect();
            append(&tx, rid, key, &values).at(&path)?;
            tx.commit().at(&path)
        })?;
        crate::store::published::announce();
        Ok(())
    }

    fn event(&self, rid: i64, key: &str) -> CoreResult<Option<String>> {
        let path = crate::store::Store::path(self).to_string();
        self.with_conn(|c| {
            c.prepare_cached("SELECT value_json FROM run_events WHERE rid = ?1 AND key = ?2")
                .and_then(|mut st| st.query_row(params![rid, key], |r| r.get(0)).optional())
                .at(&path)
        })
    }

    fn events(&self, rid: i64) -> CoreResult<Vec<(String, String)>> {
        let path = crate::store::Store::path(self).to_string();
        self.with_conn(|c| {
            c.prepare_cached("SELECT key, value_json FROM run_events WHERE rid = ?1 ORDER BY key")
                .and_then(|mut st| {
                    st.query_map([rid], |r| Ok((r.get(0)?, r.get(1)?)))?
                        .collect()
                })
                .at(&path)
        })
    }

    fn stream_after(&self, rid: i64, key: &str, after: i64, limit: i64) -> CoreResult<StreamChunk> {
        let path = crate::store::Store::path(self).to_string();
        self.with_conn(|c| {
            let tx = c.transaction().at(&path)?;
            // The end is read first: every value appended before the close
            // is then among the values read.
            let closed = is_closed(&tx, rid, key).at(&path)?;
            let values = tx
                .prepare_cached(
                    "SELECT seq, value_json FROM run_streams WHERE rid = ?1 AND key = ?2 \
                     AND seq > ?3 ORDER BY seq LIMIT ?4",
                )
                .and_then(|mut st| {
                    st.query_map(params![rid, key, after, limit], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })?
                    .collect()
                })
                .at(&path)?;
            Ok(StreamChunk { values, closed })
        })
    }

    fn list_runs(&self, f: &RunFilter, matching: Option<&str>) -> CoreResult<Vec<ListedRun>> {
        let path = crate::store::Store::path(self).to_string();
        self.with_conn(|c| match listed_runs(c, f, matching) {
            Ok(rows) => Ok(rows),
            Err(SearchError::Unavailable) => Err(CoreError::Config(
                "full-text search is unavailable: FTS5 is not compiled into this SQLite -- \
                 list without query=..."
                    .into(),
            )),
            Err(SearchError::Syntax(m)) => Err(CoreError::Config(format!(
                "invalid query syntax {:?}: {m}",
                matching.unwrap_or_default()
            ))),
            Err(SearchError::Sql(e)) => Err(e).at(&path),
        })
    }

    fn prune_runs(&self, f: &PruneFilter, dry_run: bool) -> CoreResult<u64> {
        let path = crate::store::Store::path(self).to_string();
        let statuses = serde_json::Value::from(f.statuses.clone()).to_string();
        let select = |c: &Connection, limit: i64| -> rusqlite::Result<Vec<i64>> {
            c.prepare_cached(PRUNE_SELECT)?
                .query_map(
                    params![f.older_than, statuses, f.name, f.kind, limit],
                    |r| r.get(0),
                )?
                .collect()
        };
        if dry_run {
            return self.with_conn(|c| Ok(select(c, i64::MAX).at(&path)?.len() as u64));
        }
        let mut deleted = 0u64;
        loop {
            let mut w = self.lock_writer();
            let ops = self.take_queue();
            let mut batch = 0usize;
            self.inner.apply(&mut w, ops, |tx| {
                let rids = select(tx, f.batch.max(1) as i64).at(&path)?;
                batch = rids.len();
                if !rids.is_empty() {
                    delete_runs(tx, &rids).at(&path)?;
                }
                Ok(())
            })?;
            if batch > 0 {
                // Trace ids cached by the writer may name a deleted trace.
                w.traces.clear();
            }
            drop(w);
            deleted += batch as u64;
            if batch < f.batch.max(1) {
                return Ok(deleted);
            }
        }
    }

    fn compact(&self) -> CoreResult<Option<(u64, u64)>> {
        let path = crate::store::Store::path(self).to_string();
        let before = file_bytes(&path);
        self.with_conn(|c| {
            c.execute_batch("VACUUM; PRAGMA wal_checkpoint(TRUNCATE);")
                .at(&path)
        })?;
        Ok(Some((before, file_bytes(&path))))
    }
}
