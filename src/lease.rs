//! Lease settings and the heartbeat (STORE-10, STORE-11).
//!
//! One thread per process renews the leases of every attempt it executes,
//! a third of the lease length before each would lapse, in one statement
//! per store. The renewal is itself fenced (it only extends leases this
//! process still holds): a run missing from what the store renewed was
//! taken over, and its attempt is marked lost so that it stops at its next
//! step boundary or blocked wait.

use crate::error::{CoreError, CoreResult};
use crate::store::{RowSlot, Store};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub const DEFAULT_LEASE_SECONDS: f64 = 30.0;
pub const DEFAULT_MAX_RECOVERY_ATTEMPTS: u32 = 5;

/// `COMPOSE_LEASE_SECONDS`, read at each use (tests and workers set it per
/// process); a positive number of seconds.
pub fn lease_seconds() -> CoreResult<f64> {
    parse_lease_seconds(std::env::var("COMPOSE_LEASE_SECONDS").ok().as_deref())
}

/// `COMPOSE_MAX_RECOVERY_ATTEMPTS`, read at each use; a whole number >= 0.
pub fn max_recovery_attempts() -> CoreResult<u32> {
    parse_max_recovery(
        std::env::var("COMPOSE_MAX_RECOVERY_ATTEMPTS")
            .ok()
            .as_deref(),
    )
}

fn parse_lease_seconds(value: Option<&str>) -> CoreResult<f64> {
    match value.map(str::trim) {
        None | Some("") => Ok(DEFAULT_LEASE_SECONDS),
        Some(v) => match v.parse::<f64>() {
            Ok(s) if s.is_finite() && s > 0.0 => Ok(s),
            _ => Err(CoreError::Config(format!(
                "COMPOSE_LEASE_SECONDS must be a positive number of seconds, got '{v}'"
            ))),
        },
    }
}

fn parse_max_recovery(value: Option<&str>) -> CoreResult<u32> {
    match value.map(str::trim) {
        None | Some("") => Ok(DEFAULT_MAX_RECOVERY_ATTEMPTS),
        Some(v) => v.parse::<u32>().map_err(|_| {
            CoreError::Config(format!(
                "COMPOSE_MAX_RECOVERY_ATTEMPTS must be a whole number of attempts (0 or more), \
                 got '{v}'"
            ))
        }),
    }
}

struct Entry {
    store: Arc<dyn Store>,
    /// The run's rid once its row is stored (a queued insert fills it).
    row: Arc<RowSlot>,
    seconds: f64,
    due: Instant,
    lost: Arc<AtomicBool>,
}

#[derive(Default)]
struct Beat {
    entries: HashMap<u64, Entry>,
    next_token: u64,
    started: bool,
    /// When the heartbeat thread wakes next (`Some(None)`: when woken),
    /// `None` while it is renewing (it looks at the entries again after).
    sleeping: Option<Option<Instant>>,
}

fn beat() -> &'static (Mutex<Beat>, Condvar) {
    static BEAT: OnceLock<(Mutex<Beat>, Condvar)> = OnceLock::new();
    BEAT.get_or_init(|| (Mutex::new(Beat::default()), Condvar::new()))
}

/// An attempt's registration with the heartbeat; dropping it stops the
/// renewals.
pub struct Lease {
    token: u64,
    lost: Arc<AtomicBool>,
}

impl Lease {
    /// Whether the store no longer lists this process as the holder.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        beat().0.lock().entries.remove(&self.token);
    }
}

/// Starts renewing the lease of the run whose row is `row` on `store` (taken
/// just now for `seconds`).
pub fn register(store: Arc<dyn Store>, row: Arc<RowSlot>, seconds: f64) -> Lease {
    let (lock, wake) = beat();
    let lost = Arc::new(AtomicBool::new(false));
    let mut b = lock.lock();
    let token = b.next_token;
    b.next_token += 1;
    let due = Instant::now() + Duration::from_secs_f64(seconds / 3.0);
    b.entries.insert(
        token,
        Entry {
            store,
            row,
            seconds,
            due,
            lost: lost.clone(),
        },
    );
    if !b.started {
        b.started = true;
        std::thread::Builder::new()
            .name("composeai-heartbeat".into())
            .spawn(run)
            .expect("composeai cannot start its heartbeat thread");
    }
    // Woken only when this lease is due before it would wake anyway (a
    // short-lived run costs no context switch).
    let wake_now = match b.sleeping {
        Some(None) => true,
        Some(Some(at)) => due < at,
        None => false,
    };
    drop(b);
    if wake_now {
        wake.notify_all();
    }
    Lease { token, lost }
}

/// Leases renewed together: one store, one length, `(token, rid)` each.
type Group = (Arc<dyn Store>, f64, Vec<(u64, i64)>);

/// A failed renewal (the store unreachable) is tried again after this.
const RETRY: Duration = Duration::from_secs(1);

fn run() {
    let (lock, wake) = beat();
    loop {
        let due = {
            let mut b = lock.lock();
            loop {
                let now = Instant::now();
                let next = b.entries.values().map(|e| e.due).min();
                b.sleeping = Some(next);
                match next {
                    None => wake.wait(&mut b),
                    Some(at) if at <= now => break,
                    Some(at) => {
                        wake.wait_until(&mut b, at);
                    }
                }
            }
            b.sleeping = None;
            let now = Instant::now();
            let mut groups: Vec<Group> = Vec::new();
            for (token, e) in b.entries.iter_mut().filter(|(_, e)| e.due <= now) {
                let rid = match e.row.committed() {
                    Some(Ok(rid)) => rid,
                    // A lost insert fails the attempt where it settles.
                    Some(Err(_)) => {
                        e.due = now + Duration::from_secs_f64(e.seconds / 3.0);
                        continue;
                    }
                    // The row's insert is still queued: the store's writer
                    // commits it long before the lease could lapse.
                    None => {
                        e.due = now + RETRY;
                        continue;
                    }
                };
                // Pushed back now so that a slow store is not asked again
                // before it answered.
                e.due = now + Duration::from_secs_f64(e.seconds / 3.0);
                match groups
                    .iter_mut()
                    .find(|g| Arc::ptr_eq(&g.0, &e.store) && g.1 == e.seconds)
                {
                    Some(g) => g.2.push((*token, rid)),
                    None => groups.push((e.store.clone(), e.seconds, vec![(*token, rid)])),
                }
            }
            groups
        };
        for (store, seconds, members) in due {
            let rids: Vec<i64> = members.iter().map(|m| m.1).collect();
            let until = crate::time::now() + seconds;
            let outcome = store.renew_leases(crate::owner::owner_id(), until, &rids);
            let mut b = lock.lock();
            match outcome {
                Ok(renewed) => {
                    let mut any_lost = false;
                    for (token, rid) in members {
                        if !renewed.contains(&rid) {
                            if let Some(e) = b.entries.remove(&token) {
                                e.lost.store(true, Ordering::Release);
                                any_lost = true;
                            }
                        }
                    }
                    if any_lost {
                        drop(b);
                        // Blocked waits of the lost attempts look again.
                        crate::clock::poke();
                    }
                }
                Err(_) => {
                    for (token, _) in members {
                        if let Some(e) = b.entries.get_mut(&token) {
                            e.due = e.due.min(Instant::now() + RETRY);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_bad_values_name_the_variable() {
        assert_eq!(parse_lease_seconds(Some("0.5")).unwrap(), 0.5);
        assert_eq!(parse_lease_seconds(None).unwrap(), DEFAULT_LEASE_SECONDS);
        assert_eq!(
            parse_lease_seconds(Some(" ")).unwrap(),
            DEFAULT_LEASE_SECONDS
        );
        for bad in ["abc", "0", "-1", "inf"] {
            let e = parse_lease_seconds(Some(bad)).unwrap_err().to_string();
            assert!(
                e.contains("COMPOSE_LEASE_SECONDS") && e.contains(bad),
                "{e}"
            );
        }
        assert_eq!(parse_max_recovery(Some("2")).unwrap(), 2);
        assert_eq!(parse_max_recovery(None).unwrap(), 5);
        let e = parse_max_recovery(Some("x")).unwrap_err().to_string();
        assert!(
            e.contains("COMPOSE_MAX_RECOVERY_ATTEMPTS") && e.contains("'x'"),
            "{e}"
        );
    }
}
