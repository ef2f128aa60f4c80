//! The schedules on PostgreSQL (OPS-11).

use crate::error::{CoreError, CoreResult};
use crate::store::postgres::inner::PgStore;
use crate::store::postgres::sql::{exec, rows};
use crate::store::schedule::{
    ScheduleRow, ScheduleStore, ADVANCE_SCHEDULE, PAUSE_SCHEDULE, SAVE_SCHEDULE, SCHEDULE_COLUMNS,
};

fn read_row(r: &tokio_postgres::Row) -> ScheduleRow {
    ScheduleRow {
        name: r.get(0),
        flow: r.get(1),
        cron: r.get(2),
        timezone: r.get(3),
        catchup: r.get(4),
        queue: r.get(5),
        args_json: r.get(6),
        paused: r.get(7),
        next_fire: r.get(8),
        last_fire: r.get(9),
        last_run_id: r.get(10),
        created_at: r.get(11),
        updated_at: r.get(12),
    }
}

impl ScheduleStore for PgStore {
    fn save_schedule(&self, s: &ScheduleRow) -> CoreResult<ScheduleRow> {
        self.retry(async |_| {
            let c = self.client().await?;
            let saved = rows(
                &c,
                &format!("{SAVE_SCHEDULE} RETURNING {SCHEDULE_COLUMNS}"),
                &[
                    &s.name,
                    &s.flow,
                    &s.cron,
                    &s.timezone,
                    &s.catchup,
                    &s.queue,
                    &s.args_json,
                    &s.paused,
                    &s.next_fire,
                    &s.last_fire,
                    &s.last_run_id,
                    &s.created_at,
                    &s.updated_at,
                ],
            )
            .await
            .map_err(self.err())?;
            saved
                .first()
                .map(read_row)
                .ok_or_else(|| CoreError::Store("the schedule was not saved".into()))
        })
    }

    fn schedules(&self, name: Option<&str>) -> CoreResult<Vec<ScheduleRow>> {
        self.retry(async |_| {
            let c = self.client().await?;
            let found = rows(
                &c,
                &format!(
                    "SELECT {SCHEDULE_COLUMNS} FROM schedules \
                     WHERE $1::TEXT IS NULL OR name = $1 ORDER BY name"
                ),
                &[&name],
            )
            .await
            .map_err(self.err())?;
            Ok(found.iter().map(read_row).collect())
        })
    }

    fn set_schedule_paused(
        &self,
        name: &str,
        paused: bool,
        next_fire: Option<f64>,
    ) -> CoreResult<bool> {
        self.retry(async |_| {
            let c = self.client().await?;
            let t = crate::time::now();
            exec(&c, PAUSE_SCHEDULE, &[&name, &paused, &next_fire, &t])
                .await
                .map_err(self.err())
                .map(|n| n == 1)
        })
    }

    fn delete_schedule(&self, name: &str) -> CoreResult<bool> {
        self.retry(async |_| {
            let c = self.client().await?;
            exec(&c, "DELETE FROM schedules WHERE name = $1", &[&name])
                .await
                .map_err(self.err())
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
        self.retry(async |_| {
            let c = self.client().await?;
            let (tick, run_id) = (fired.map(|f| f.0), fired.map(|f| f.1));
            exec(
                &c,
                ADVANCE_SCHEDULE,
                &[&name, &from, &next_fire, &tick, &run_id],
            )
            .await
            .map_err(self.err())
            .map(|n| n == 1)
        })
    }

    fn serve_flows(&self, owner: &str, flows: &[String], at: f64) -> CoreResult<()> {
        self.retry(async |_| {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(self.err())?;
            exec(&tx, "DELETE FROM worker_flows WHERE owner = $1", &[&owner])
                .await
                .map_err(self.err())?;
            for flow in flows {
                exec(
                    &tx,
                    "INSERT INTO worker_flows(owner, flow, seen_at) VALUES($1, $2, $3)",
                    &[&owner, flow, &at],
                )
                .await
                .map_err(self.err())?;
            }
            tx.commit().await.map_err(self.err())
        })
    }

    fn served_flows(&self, since: f64) -> CoreResult<Vec<String>> {
        self.retry(async |_| {
            let c = self.client().await?;
            let found = rows(
                &c,
                "SELECT DISTINCT flow FROM worker_flows WHERE seen_at >= $1 ORDER BY flow",
                &[&since],
            )
            .await
            .map_err(self.err())?;
            Ok(found.iter().map(|r| r.get(0)).collect())
        })
    }
}
