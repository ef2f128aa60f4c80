//! Queues and workers (STORE-20 … STORE-23).
//!
//! `Flow.start(queue=…)` creates a run with status `queued` (and its
//! `queue_runs` row) in one transaction; a worker claims queued runs in one
//! transaction that also enforces the queue's limits: on SQLite a single
//! `IMMEDIATE` transaction (one writer at a time), on PostgreSQL `FOR UPDATE
//! SKIP LOCKED` so that workers never wait on each other's rows, under a
//! per-queue advisory lock when a global concurrency or a rate limit must
//! be counted. A claimed run is `running` and leased to the claiming
//! process, which continues it through the ordinary resume path.

use crate::error::{CoreError, CoreResult};
pub use crate::store::queue::{
    allowance, Claimed, Claimer, LeaseHolder, Limits, Placement, QueueStats, QueueStore,
};
use crate::store::{NewRun, RunRow};

fn check_placement(p: &Placement) -> CoreResult<()> {
    if p.queue.is_empty() {
        return Err(CoreError::Config(
            "queue name must be a non-empty string".into(),
        ));
    }
    if p.dedup_id.as_deref() == Some("") {
        return Err(CoreError::Config(
            "dedup_id must be a non-empty string".into(),
        ));
    }
    Ok(())
}

/// The store a queue operation runs on.
pub type Backend<'a> = &'a dyn QueueStore;

/// STORE-20: creates the run `queued` in `p.queue`, refusing a `dedup_id`
/// held by a queued or running run of that queue; one transaction.
pub fn enqueue(b: Backend<'_>, new: &NewRun, p: &Placement) -> CoreResult<RunRow> {
    check_placement(p)?;
    b.enqueue(new, p)
}

/// STORE-21: claims up to `room` queued runs of `queue` for `by`, within
/// the queue's limits; the claimed runs are `running`, leased to it.
pub fn claim(
    b: Backend<'_>,
    queue: &str,
    limits: &Limits,
    room: i64,
    by: &Claimer<'_>,
) -> CoreResult<Vec<Claimed>> {
    if room <= 0 || by.flows.is_empty() {
        return Ok(Vec::new());
    }
    b.claim(queue, limits, room, by)
}

/// STORE-23: per queue, by name.
pub fn stats(b: Backend<'_>, now: f64) -> CoreResult<Vec<QueueStats>> {
    b.stats(now)
}

/// Every process holding a lease on a run, latest expiry first.
pub fn lease_holders(b: Backend<'_>) -> CoreResult<Vec<LeaseHolder>> {
    b.lease_holders()
}

/// When a rate-limited queue next has room: the oldest start in the
/// current window plus the window (`None` when not rate limited or when
/// the window is not full).
pub fn next_slot(
    b: Backend<'_>,
    queue: &str,
    limits: &Limits,
    now: f64,
) -> CoreResult<Option<f64>> {
    let Some((per, seconds)) = limits.rate_limit else {
        return Ok(None);
    };
    let starts = b.recent_starts(queue, now - seconds, per)?;
    Ok((starts.len() as i64 >= per).then(|| starts[0] + seconds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::queue::window;

    #[test]
    fn allowance_is_bounded_by_room_global_slots_and_the_rate_window() {
        let free = Limits::default();
        assert_eq!(allowance(&free, 5, 100, 100), 5);
        let capped = Limits {
            concurrency: Some(3),
            ..Limits::default()
        };
        assert_eq!(allowance(&capped, 5, 1, 0), 2);
        assert_eq!(allowance(&capped, 5, 4, 0), 0);
        let rated = Limits {
            rate_limit: Some((2, 1.0)),
            ..Limits::default()
        };
        assert_eq!(allowance(&rated, 5, 0, 1), 1);
        assert_eq!(allowance(&rated, 5, 0, 7), 0);
        assert_eq!(allowance(&rated, -1, 0, 0), 0);
        assert!(rated.counted() && capped.counted() && !free.counted());
        assert_eq!(window(&rated), 1.0);
    }
}

/// The queue operations on a SQLite store.
#[cfg(test)]
mod on_sqlite {
    use super::*;
    use crate::queue;
    use crate::store::sqlite::SqliteStore;
    use crate::store::Store;
    use crate::time::now;

    fn new_run(name: &str) -> NewRun {
        NewRun {
            run_id: crate::ids::new_ulid(),
            trace_id: crate::ids::new_ulid(),
            kind: "flow".into(),
            name: name.into(),
            ..NewRun::default()
        }
    }

    fn placed(queue: &str, priority: i64, dedup: Option<&str>) -> Placement {
        Placement {
            queue: queue.into(),
            priority,
            dedup_id: dedup.map(Into::into),
        }
    }

    #[test]
    fn the_queued_row_returned_is_the_row_stored() {
        let dir = std::env::temp_dir().join(format!("composeai-queue-{}", crate::ids::new_ulid()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = SqliteStore::open(dir.join("runs.db").to_str().unwrap()).unwrap();
        let new = NewRun {
            fingerprint: Some("fp".into()),
            args_json: Some("{\"args\":[1]}".into()),
            budget_json: Some("{\"max_usd\":1.0}".into()),
            module: Some("app.flows".into()),
            ..new_run("f")
        };
        let row = queue::enqueue(&store, &new, &placed("q", 0, None)).unwrap();
        let stored = store.get_run(&new.run_id).unwrap().unwrap();
        // Every field, as `get_run` reads it back.
        assert_eq!(format!("{row:?}"), format!("{stored:?}"));
        assert_eq!(row.status, "queued");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn claims_follow_priority_then_fifo_and_respect_concurrency_and_dedup() {
        let dir = std::env::temp_dir().join(format!("composeai-queue-{}", crate::ids::new_ulid()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = SqliteStore::open(dir.join("runs.db").to_str().unwrap()).unwrap();
        let b: Backend = &store;
        let ids: Vec<String> = [3, 1, 1, 0]
            .iter()
            .map(|p| {
                queue::enqueue(b, &new_run("f"), &placed("q", *p, None))
                    .unwrap()
                    .run_id
            })
            .collect();
        let held = queue::enqueue(b, &new_run("f"), &placed("q", 9, Some("d"))).unwrap();
        let err = queue::enqueue(b, &new_run("f"), &placed("q", 0, Some("d"))).unwrap_err();
        assert!(err.to_string().contains(&held.run_id), "{err}");
        let capped = Limits {
            concurrency: Some(2),
            priority: true,
            ..Limits::default()
        };
        let flows = ["f".to_string()];
        let by = queue::Claimer {
            owner: "me",
            lease_until: now() + 60.0,
            flows: &flows,
        };
        let elsewhere = queue::Claimer {
            flows: &["g".to_string()],
            ..by
        };
        assert!(queue::claim(b, "q", &capped, 10, &elsewhere)
            .unwrap()
            .is_empty());
        let first = queue::claim(b, "q", &capped, 10, &by).unwrap();
        let got: Vec<&str> = first.iter().map(|c| c.run_id.as_str()).collect();
        assert_eq!(got, [ids[3].as_str(), ids[1].as_str()]);
        assert!(queue::claim(b, "q", &capped, 10, &by).unwrap().is_empty());
        let stats = queue::stats(b, now()).unwrap();
        assert_eq!((stats[0].queued, stats[0].running), (3, 2));
        let fifo = Limits::default();
        let rest = queue::claim(b, "q", &fifo, 10, &by).unwrap();
        let got: Vec<&str> = rest.iter().map(|c| c.run_id.as_str()).collect();
        assert_eq!(
            got,
            [ids[0].as_str(), ids[2].as_str(), held.run_id.as_str()]
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
