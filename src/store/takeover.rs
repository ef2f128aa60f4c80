//! What a store decides when an attempt takes a run over from another
//! holder (STORE-11, STORE-12), and the errors it answers with.

use crate::error::CoreError;

/// The reason a run is failed with once it was recovered too often.
pub const RECOVERY_EXHAUSTED: &str = "recovery attempts exhausted";

/// What `acquire` does about earlier attempts whose holder died.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Takeover {
    /// By hand: the run's recovery count starts again.
    Manual,
    /// By a worker: a takeover from a dead holder counts as a recovery, and
    /// once `max` were counted the run is failed instead.
    Recover { max: u32 },
}

/// The error_json of a run failed by the recovery limit.
pub fn exhausted_error_json() -> String {
    serde_json::json!({"type": "RecoveryError", "message": RECOVERY_EXHAUSTED}).to_string()
}

/// What the caller of an exhausted takeover is told.
pub fn exhausted(run_id: &str, max: u32) -> CoreError {
    CoreError::Config(format!(
        "run '{run_id}' failed: {RECOVERY_EXHAUSTED} (recovered {max} times without settling; \
         COMPOSE_MAX_RECOVERY_ATTEMPTS={max}) -- resume it by hand to try again"
    ))
}

/// The error an attempt stops with once its run moved to another owner.
pub fn moved(run_id: &str) -> CoreError {
    CoreError::Config(format!(
        "run '{run_id}' moved to another owner: this attempt's lease was taken over, so nothing \
         it does from now on is stored -- the new owner continues the run"
    ))
}

/// Decides whether a lease held by `owner` until `until` is still live.
pub type LeaseCheck<'a> = &'a dyn Fn(&str, f64) -> bool;
