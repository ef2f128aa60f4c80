//! The schedules' storage (OPS-11): one row per schedule, and the flows
//! each live worker serves. The core decides the ticks; a store keeps the
//! rows and advances a schedule only from the next fire its caller read, so
//! racing workers advance it once.

use crate::error::CoreResult;

/// A `schedules` row. Times are engine time in seconds since the epoch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScheduleRow {
    pub name: String,
    pub flow: String,
    pub cron: String,
    pub timezone: String,
    pub catchup: String,
    pub queue: Option<String>,
    pub args_json: String,
    pub paused: bool,
    pub next_fire: Option<f64>,
    pub last_fire: Option<f64>,
    pub last_run_id: Option<String>,
    pub created_at: f64,
    pub updated_at: f64,
}

/// The schedules' operations on a store.
pub trait ScheduleStore {
    /// Creates or updates the schedule `row.name`: its definition is
    /// replaced; its next fire becomes `row.next_fire` when the schedule is
    /// new or its cron or time zone changed, and is kept otherwise (as are
    /// `paused` and the last fire). Returns the stored row.
    fn save_schedule(&self, row: &ScheduleRow) -> CoreResult<ScheduleRow>;
    /// Every schedule, by name, or only `name`'s.
    fn schedules(&self, name: Option<&str>) -> CoreResult<Vec<ScheduleRow>>;
    /// Pauses or resumes `name`; resuming sets its next fire. Whether it exists.
    fn set_schedule_paused(
        &self,
        name: &str,
        paused: bool,
        next_fire: Option<f64>,
    ) -> CoreResult<bool>;
    /// Deletes `name`; whether it existed.
    fn delete_schedule(&self, name: &str) -> CoreResult<bool>;
    /// Moves `name`'s next fire from `from` to `next_fire`, recording its
    /// last fired tick and run; refused (false) once another caller moved
    /// it from `from` first.
    fn advance_schedule(
        &self,
        name: &str,
        from: f64,
        next_fire: Option<f64>,
        fired: Option<(f64, &str)>,
    ) -> CoreResult<bool>;
    /// Records that worker `owner` serves `flows` at `at` (its others are
    /// forgotten); with no flows, forgets the worker.
    fn serve_flows(&self, owner: &str, flows: &[String], at: f64) -> CoreResult<()>;
    /// The flows some worker reported serving at or after `since`.
    fn served_flows(&self, since: f64) -> CoreResult<Vec<String>>;
}

pub const SCHEDULE_COLUMNS: &str = "name, flow, cron, timezone, catchup, queue, args_json, \
     paused, next_fire, last_fire, last_run_id, created_at, updated_at";

/// The upsert of `save_schedule`; `$1 … $13` in `SCHEDULE_COLUMNS` order.
pub const SAVE_SCHEDULE: &str = "INSERT INTO schedules(name, flow, cron, timezone, catchup, \
     queue, args_json, paused, next_fire, last_fire, last_run_id, created_at, updated_at) \
     VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) \
     ON CONFLICT(name) DO UPDATE SET flow = excluded.flow, cron = excluded.cron, \
     timezone = excluded.timezone, catchup = excluded.catchup, queue = excluded.queue, \
     args_json = excluded.args_json, updated_at = excluded.updated_at, \
     next_fire = CASE WHEN schedules.cron <> excluded.cron \
       OR schedules.timezone <> excluded.timezone THEN excluded.next_fire \
       ELSE schedules.next_fire END";

pub const ADVANCE_SCHEDULE: &str = "UPDATE schedules SET next_fire = $3, \
     last_fire = COALESCE($4, last_fire), last_run_id = COALESCE($5, last_run_id) \
     WHERE name = $1 AND next_fire = $2";

pub const PAUSE_SCHEDULE: &str = "UPDATE schedules SET paused = $2, \
     next_fire = CASE WHEN $2 THEN next_fire ELSE $3 END, updated_at = $4 WHERE name = $1";
