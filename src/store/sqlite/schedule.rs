//! The schedules on SQLite (OPS-11).

use crate::error::{AtPath, CoreResult};
use crate::store::schedule::{
    ScheduleRow, ScheduleStore, ADVANCE_SCHEDULE, PAUSE_SCHEDULE, SAVE_SCHEDULE, SCHEDULE_COLUMNS,
};
use crate::store::sqlite::SqliteStore;
use crate::store::Store;
use rusqlite::params;

/// A statement shared with PostgreSQL in SQLite's numbered form: SQLite
/// numbers `$N` parameters by first appearance, `?N` by `N`.
fn numbered(sql: &str) -> String {
    sql.replace('$', "?")
}

fn read_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ScheduleRow> {
    Ok(ScheduleRow {
        name: r.get(0)?,
        flow: r.get(1)?,
        cron: r.get(2)?,
        timezone: r.get(3)?,
        catchup: r.get(4)?,
        queue: r.get(5)?,
        args_json: r.get(6)?,
        paused: r.get(7)?,
        next_fire: r.get(8)?,
        last_fire: r.get(9)?,
        last_run_id: r.get(10)?,
        created_at: r.get(11)?,
        updated_at: r.get(12)?,
    })
}

impl ScheduleStore for SqliteStore {
    fn save_schedule(&self, s: &ScheduleRow) -> CoreResult<ScheduleRow> {
        let path = self.path().to_string();
        self.with_conn(|c| {
            let tx = c.transaction().at(&path)?;
            tx.execute(
                &numbered(SAVE_SCHEDULE),
                params![
                    s.name,
                    s.flow,
                    s.cron,
                    s.timezone,
                    s.catchup,
                    s.queue,
                    s.args_json,
                    s.paused,
                    s.next_fire,
                    s.last_fire,
                    s.last_run_id,
                    s.created_at,
                    s.updated_at
                ],
            )
            .at(&path)?;
            let row = tx
                .query_row(
                    &format!("SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE name = ?1"),
                    [&s.name],
                    read_row,
                )
                .at(&path)?;
            tx.commit().at(&path)?;
            Ok(row)
        })
    }

    fn schedules(&self, name: Option<&str>) -> CoreResult<Vec<ScheduleRow>> {
        let path = self.path().to_string();
        self.with_conn(|c| {
            let mut st = c
                .prepare_cached(&format!(
                    "SELECT {SCHEDULE_COLUMNS} FROM schedules \
                     WHERE ?1 IS NULL OR name = ?1 ORDER BY name"
                ))
                .at(&path)?;
            let rows = st.query_map([name], read_row).at(&path)?;
            rows.collect::<rusqlite::Result<_>>().at(&path)
        })
    }

    fn set_schedule_paused(
        &self,
        name: &str,
        paused: bool,
        next_fire: Option<f64>,
    ) -> CoreResult<bool> {
        let path = self.path().to_string();
        self.with_conn(|c| {
            c.execute(
                &numbered(PAUSE_SCHEDULE),
                params![name, paused, next_fire, crate::time::now()],
            )
            .at(&path)
            .map(|n| n == 1)
        })
    }

    fn delete_schedule(&self, name: &str) -> CoreResult<bool> {
        let path = self.path().to_string();
        self.with_conn(|c| {
            c.execute("DELETE FROM schedules WHERE name = ?1", [name])
                .at(&path)
                .map(|n| n == 1)
        })
    }

    fn advance_schedule(
        &self,
        name: &str,
        from: f64,
        next_fire: Option<f64>,
        fired: Option<(f64, &str)>,
    ) -> CoreResult<bool> {
        let path = self.path().to_string();
        self.with_conn(|c| {
            c.execute(
                &numbered(ADVANCE_SCHEDULE),
                params![
                    name,
                    from,
                    next_fire,
                    fired.map(|f| f.0),
                    fired.map(|f| f.1)
                ],
            )
            .at(&path)
            .map(|n| n == 1)
        })
    }

    fn serve_flows(&self, owner: &str, flows: &[String], at: f64) -> CoreResult<()> {
        let path = self.path().to_string();
        self.with_conn(|c| {
            let tx = c.transaction().at(&path)?;
            tx.execute("DELETE FROM worker_flows WHERE owner = ?1", [owner])
                .at(&path)?;
            for flow in flows {
                tx.execute(
                    "INSERT INTO worker_flows(owner, flow, seen_at) VALUES(?1, ?2, ?3)",
                    params![owner, flow, at],
                )
                .at(&path)?;
            }
            tx.commit().at(&path)
        })
    }

    fn served_flows(&self, since: f64) -> CoreResult<Vec<String>> {
        let path = self.path().to_string();
        self.with_conn(|c| {
            let mut st = c
                .prepare_cached(
                    "SELECT DISTINCT flow FROM worker_flows WHERE seen_at >= ?1 ORDER BY flow",
                )
                .at(&path)?;
            let rows = st.query_map([since], |r| r.get(0)).at(&path)?;
            rows.collect::<rusqlite::Result<_>>().at(&path)
        })
    }
}
