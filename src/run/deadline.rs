//! Flow deadlines (OPS-12): an attempt observes its run's deadline, and the
//! tighter one of a nested flow it executes in, where it observes cancel
//! requests (its durable boundaries and blocked waits).

use super::Attempt;
use crate::clock;
use crate::error::{CoreError, CoreResult};
use crate::journal::Fence;
use crate::store::durable::EPSILON;

/// What a caller is told once `flow`'s deadline `at` passed in run `run_id`.
pub fn deadline_message(flow: &str, run_id: &str, at: f64) -> String {
    format!(
        "flow '{flow}' of run '{run_id}' passed its deadline {} (@flow(timeout=...)) -- the run \
         is failed and cannot be resumed; start a new run, with a longer timeout if it needs one",
        clock::iso(at)
    )
}

/// The stored error of a run failed by its deadline.
pub fn deadline_error_json(flow: &str, run_id: &str, at: f64) -> String {
    serde_json::json!({
        "type": "FlowTimeoutError",
        "message": deadline_message(flow, run_id, at),
    })
    .to_string()
}

impl Attempt {
    /// Fails with `Deadline` once the run's deadline, or the nested flows'
    /// one `fence` carries, has passed. A replay-only attempt has none.
    pub(crate) fn check_deadline(&self, fence: Option<&Fence>) -> CoreResult<()> {
        let nested = fence.and_then(Fence::deadline);
        if (self.run.deadline.is_none() && nested.is_none()) || self.is_replay_only() {
            return Ok(());
        }
        let now = clock::now();
        if let Some(at) = self.run.deadline.filter(|at| now >= at - EPSILON) {
            return Err(CoreError::Deadline(deadline_message(
                &self.run.name,
                &self.run.run_id,
                at,
            )));
        }
        if let Some((at, flow)) = nested.filter(|(at, _)| now >= at - EPSILON) {
            return Err(CoreError::Deadline(deadline_message(
                flow,
                &self.run.run_id,
                *at,
            )));
        }
        Ok(())
    }

    /// The earliest deadline that applies to work under `fence`.
    pub(crate) fn deadline_under(&self, fence: Option<&Fence>) -> Option<f64> {
        let nested = fence.and_then(Fence::deadline).map(|d| d.0);
        match (self.run.deadline, nested) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}
