//! Store outages as this process sees them: the settings that bound them,
//! whether the store is reachable now (for the worker's log), and whether an
//! outage ended so recently that other processes' leases may still be
//! catching up (nobody could renew a lease while the server was away).
//!
//! The happy path costs one relaxed atomic load per store operation
//! (`reachable`): the state behind the lock is touched only while a store is
//! unreachable.

use crate::error::{CoreError, CoreResult};
use crate::time::now;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

pub const DEFAULT_OUTAGE_SECONDS: f64 = 300.0;
pub const DEFAULT_TIMEOUT_SECONDS: f64 = 10.0;

/// How long store operations keep retrying an unreachable server before
/// they raise (`COMPOSE_STORE_OUTAGE_SECONDS`, 0 or more; 0: at once).
pub fn outage_seconds() -> CoreResult<f64> {
    seconds("COMPOSE_STORE_OUTAGE_SECONDS", DEFAULT_OUTAGE_SECONDS, true)
}

/// The longest one try of a store operation (connect, login, statement) may
/// take before the server counts as unreachable (`COMPOSE_STORE_TIMEOUT`).
pub fn timeout() -> CoreResult<Duration> {
    seconds("COMPOSE_STORE_TIMEOUT", DEFAULT_TIMEOUT_SECONDS, false).map(Duration::from_secs_f64)
}

fn seconds(var: &str, default: f64, zero_ok: bool) -> CoreResult<f64> {
    parse_seconds(var, std::env::var(var).ok().as_deref(), default, zero_ok)
}

fn parse_seconds(var: &str, value: Option<&str>, default: f64, zero_ok: bool) -> CoreResult<f64> {
    match value.map(str::trim) {
        None | Some("") => Ok(default),
        Some(v) => match v.parse::<f64>() {
            Ok(s) if s.is_finite() && (s > 0.0 || (zero_ok && s == 0.0)) => Ok(s),
            _ => Err(CoreError::Config(format!(
                "{var} must be a {} number of seconds, got '{v}'",
                if zero_ok { "non-negative" } else { "positive" }
            ))),
        },
    }
}

/// The store is unreachable since `since` (wall time) because of `why`.
#[derive(Clone, Debug, PartialEq)]
pub struct Down {
    pub since: f64,
    pub store: String,
    pub why: String,
}

#[derive(Default)]
struct State {
    /// Bumped on every change, so a watcher sees each one once.
    generation: u64,
    down: Option<Down>,
    /// When the last outage ended (wall time) and how long it lasted.
    back: Option<(f64, f64)>,
}

static DOWN: AtomicBool = AtomicBool::new(false);

fn state() -> &'static (Mutex<State>, Condvar) {
    static STATE: OnceLock<(Mutex<State>, Condvar)> = OnceLock::new();
    STATE.get_or_init(|| (Mutex::new(State::default()), Condvar::new()))
}

/// A store operation found `store` unreachable and is about to wait and
/// try again; the first such report starts an outage.
pub fn unreachable(store: &str, why: &str) {
    let (lock, changed) = state();
    let mut s = lock.lock();
    if s.down.is_some() {
        return;
    }
    s.down = Some(Down {
        since: now(),
        store: store.to_string(),
        why: why.to_string(),
    });
    s.generation += 1;
    DOWN.store(true, Ordering::Release);
    changed.notify_all();
}

/// A store operation succeeded: an outage in progress is over.
pub fn reachable() {
    if !DOWN.load(Ordering::Relaxed) {
        return;
    }
    let (lock, changed) = state();
    let mut s = lock.lock();
    if let Some(d) = s.down.take() {
        let t = now();
        s.back = Some((t, t - d.since));
        s.generation += 1;
        DOWN.store(false, Ordering::Release);
        changed.notify_all();
    }
}

/// Whether a store of this process is unreachable now.
pub fn is_down() -> bool {
    DOWN.load(Ordering::Relaxed)
}

/// What a watcher learns: the state's generation, the outage in progress,
/// and when the last one ended and how long it lasted.
pub type Report = (u64, Option<Down>, Option<(f64, f64)>);

/// Waits (at most `wait`) for the state to move past generation `seen`;
/// returns it as it is then.
pub fn wait_change(seen: u64, wait: Duration) -> Report {
    let (lock, changed) = state();
    let mut s = lock.lock();
    if s.generation == seen {
        changed.wait_for(&mut s, wait);
    }
    (s.generation, s.down.clone(), s.back)
}

/// Whether the store is unreachable now, or came back less than `window`
/// seconds ago: a lease that lapsed meanwhile says nothing about whether its
/// holder is alive, since no process could renew it.
pub fn outage_recent(window: f64) -> bool {
    if DOWN.load(Ordering::Relaxed) {
        return true;
    }
    let s = state().0.lock();
    s.back.is_some_and(|(at, _)| now() < at + window)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_bad_values_name_the_variable() {
        let p = |v| parse_seconds("COMPOSE_STORE_OUTAGE_SECONDS", v, 300.0, true);
        assert_eq!(p(None).unwrap(), 300.0);
        assert_eq!(p(Some("0")).unwrap(), 0.0);
        assert_eq!(p(Some(" 2.5 ")).unwrap(), 2.5);
        for bad in ["x", "-1", "inf"] {
            let e = p(Some(bad)).unwrap_err().to_string();
            assert!(
                e.contains("COMPOSE_STORE_OUTAGE_SECONDS") && e.contains(bad),
                "{e}"
            );
        }
        let t = parse_seconds("COMPOSE_STORE_TIMEOUT", Some("0"), 10.0, false);
        assert!(t.unwrap_err().to_string().contains("positive"));
    }
}
