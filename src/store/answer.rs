//! `compose answer` (and the web UI's Approve / Deny): the rows both
//! backends speak when they journal a run's interrupt answers outside any
//! attempt, so no process has to execute the run to record them.
//!
//! In one transaction, per answer: the journal row `__interrupt__:<key>` is
//! inserted first-write-wins (as `resume(answers=...)` does, FLOW-43) and
//! the interrupt's pending row deleted. The key is the interrupt id for a
//! flow or agent; a graph node's id repeats each time the node suspends, so
//! its key also names the checkpoint of the suspension it answers. When
//! that leaves a parked run with nothing pending and no lease, the run gets a
//! `waits` row due now, so `due_runs` lists it and a `compose worker`
//! continues it (on PostgreSQL the row's insert trigger also sends the
//! worker's wake-up hint). Taking the lease on the run deletes that row
//! again, like any other wait.

/// `(interrupt_id, stored, value_json)`: whether this answer was stored,
/// and the value the journal holds for the interrupt now.
pub type AnswerTuple = (String, bool, String);

/// The answers of one call and whether the run is now due for a worker.
pub type Answered = (Vec<AnswerTuple>, bool);

/// What a run looked like when it was answered.
pub struct AnsweredRun {
    pub rid: i64,
    pub kind: String,
    pub status: String,
    pub leased: bool,
}

impl AnsweredRun {
    /// Whether the answered run is due for a worker: a parked flow,
    /// standalone agent or graph that waits for nothing else (`left` pending
    /// interrupts) and that no attempt is executing.
    pub fn wakes(&self, left: i64) -> bool {
        matches!(self.kind.as_str(), "flow" | "agent" | "graph")
            && self.status == "paused"
            && !self.leased
            && left == 0
    }
}
