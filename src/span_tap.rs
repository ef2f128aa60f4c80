//! An optional observer of every finished span (OpenTelemetry export).
//!
//! Every span reaches the store through a run's `Attempt` (or, outside any
//! run, the store's span queue), so that is where the tap is called: once
//! per span, as it is handed over, before it is written. With no tap set the
//! cost is one relaxed atomic load per span.

use crate::store::SpanRow;
use parking_lot::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What the tap is given: the span's trace and run, and the span itself
/// (its output the step's journaled value when it has one).
pub struct Tapped<'a> {
    pub trace_id: &'a str,
    pub run_id: Option<&'a str>,
    pub span: &'a SpanRow,
}

pub type Tap = Arc<dyn Fn(&Tapped<'_>) + Send + Sync>;

static ON: AtomicBool = AtomicBool::new(false);
static TAP: RwLock<Option<Tap>> = parking_lot::const_rwlock(None);

/// Sets (or, with `None`, removes) the process's tap.
pub fn set(tap: Option<Tap>) {
    let mut slot = TAP.write();
    ON.store(tap.is_some(), Ordering::Release);
    // The old tap is dropped after the lock is released.
    let old = std::mem::replace(&mut *slot, tap);
    drop(slot);
    drop(old);
}

/// Whether a tap is set: the only cost of the tap on a span's path.
#[inline]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Hands `span` to the tap, if one is set. Called with no lock of the
/// engine held: the tap may block (it takes the interpreter's lock).
pub fn emit(trace_id: &str, run_id: Option<&str>, span: &SpanRow) {
    let tap = TAP.read().clone();
    if let Some(tap) = tap {
        tap(&Tapped {
            trace_id,
            run_id,
            span,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    #[test]
    fn a_set_tap_sees_each_span_and_a_removed_one_none() {
        // One test owns the process-wide tap (tests run in parallel).
        type Seen = Vec<(String, Option<String>, String)>;
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let sink = seen.clone();
        set(Some(Arc::new(move |t: &Tapped<'_>| {
            // Other tests' runs emit spans while the tap is set: only this
            // test's trace counts.
            if t.trace_id != "T-span-tap" {
                return;
            }
            sink.lock().push((
                t.trace_id.to_string(),
                t.run_id.map(str::to_string),
                t.span.span_id.clone(),
            ));
        })));
        assert!(on());
        let span = SpanRow {
            span_id: "S1".into(),
            ..Default::default()
        };
        emit("T-span-tap", Some("R"), &span);
        set(None);
        assert!(!on());
        emit("T-span-tap", None, &span);
        assert_eq!(
            *seen.lock(),
            vec![(
                "T-span-tap".to_string(),
                Some("R".to_string()),
                "S1".to_string()
            )]
        );
    }
}
