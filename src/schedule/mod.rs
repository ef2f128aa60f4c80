//! Schedules (OPS-11): which ticks of a cron pattern a worker fires, and
//! when a schedule fires next. Patterns are parsed and evaluated by the
//! `croner` crate in the schedule's IANA time zone (`chrono-tz`).
//!
//! Daylight saving time: a local time that does not exist (skipped by a
//! spring-forward) is not fired, and a local time that occurs twice (a
//! fall-back) fires once, at its first occurrence.

use crate::clock;
use crate::error::{CoreError, CoreResult};
use crate::store::schedule::ScheduleRow;
use crate::store::Store;
use chrono::{DateTime, LocalResult, TimeZone, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

/// The most missed ticks `catchup="all"` fires at once.
pub const MAX_CATCHUP: usize = 1000;

/// How late a worker may fire a tick for it still to count as on time
/// rather than missed (`catchup="none"` skips missed ticks).
pub const ON_TIME: f64 = 1.0;

/// What to fire after every worker was down.
pub const CATCHUPS: [&str; 3] = ["latest", "none", "all"];

const FIELDS: [&str; 5] = ["minute", "hour", "day-of-month", "month", "day-of-week"];

/// A parsed cron pattern in its time zone.
pub struct Spec {
    cron: Cron,
    tz: Tz,
}

fn parser() -> CronParser {
    CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build()
}

/// Parses `cron` (5 fields or an `@alias`) in IANA zone `timezone`; a bad
/// pattern is a `ConfigError` naming the field at fault, an unknown zone
/// one naming the zone.
pub fn parse(cron: &str, timezone: &str) -> CoreResult<Spec> {
    let tz: Tz = timezone.parse().map_err(|_| {
        CoreError::Config(format!(
            "unknown time zone {timezone:?} -- use an IANA zone name such as \"UTC\" or \
             \"Europe/Paris\""
        ))
    })?;
    let text = cron.trim();
    let fields: Vec<&str> = text.split_whitespace().collect();
    if !text.starts_with('@') && fields.len() != 5 {
        return Err(CoreError::Config(format!(
            "cron {cron:?} has {} fields -- a schedule takes the 5-field form \"minute hour \
             day-of-month month day-of-week\" (no seconds or year field), or @hourly, @daily, \
             @weekly, @monthly, @yearly",
            fields.len()
        )));
    }
    let parsed = parser()
        .parse(text)
        .map_err(|e| bad_pattern(cron, &fields, &e))?;
    let spec = Spec { cron: parsed, tz };
    // A pattern that can never match (`0 0 30 2 *`) has no next fire.
    if spec.next_after(clock::now()).is_none() {
        return Err(CoreError::Config(format!(
            "cron {cron:?} never fires -- its day-of-month and month fields name no existing \
             date (check the day-of-month against the month's length)"
        )));
    }
    Ok(spec)
}

/// The error of a pattern the parser refused, naming the first field that
/// the parser refuses on its own.
fn bad_pattern(cron: &str, fields: &[&str], e: &croner::errors::CronError) -> CoreError {
    if fields.len() == 5 {
        for (i, field) in fields.iter().enumerate() {
            let mut alone = ["*"; 5];
            alone[i] = field;
            if parser().parse(&alone.join(" ")).is_err() {
                return CoreError::Config(format!(
                    "cron {cron:?}: the {} field {field:?} is not valid ({e}) -- fields take \
                     numbers in range, *, lists (1,2), ranges (1-5), steps (*/15) and month or \
                     day names (JAN, MON)",
                    FIELDS[i]
                ));
            }
        }
    }
    CoreError::Config(format!("cron {cron:?} is not a valid pattern: {e}"))
}

fn epoch(t: f64) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(t.floor() as i64, 0)
}

impl Spec {
    /// Whether `at` is a tick: it matches the pattern on the local wall
    /// clock (a time moved out of a spring-forward gap does not), and is not
    /// the second occurrence of a repeated local time.
    fn fires_at(&self, at: &DateTime<Tz>) -> bool {
        if !self.cron.is_time_matching(at).unwrap_or(false) {
            return false;
        }
        match self.tz.from_local_datetime(&at.naive_local()) {
            LocalResult::Ambiguous(first, _) => first == *at,
            _ => true,
        }
    }

    /// The first tick strictly after `t` (engine seconds), if any.
    pub fn next_after(&self, t: f64) -> Option<f64> {
        let mut at = epoch(t)?.with_timezone(&self.tz);
        // Whole seconds: `t` itself is after `floor(t)` unless integral.
        let mut inclusive = false;
        for _ in 0..10_000 {
            let next = self.cron.find_next_occurrence(&at, inclusive).ok()?;
            inclusive = false;
            if self.fires_at(&next) && (next.timestamp() as f64) > t {
                return Some(next.timestamp() as f64);
            }
            at = next;
        }
        None
    }

    /// The latest tick at or before `t`, if any.
    pub fn latest_at(&self, t: f64) -> Option<f64> {
        let mut at = epoch(t)?.with_timezone(&self.tz);
        let mut inclusive = true;
        for _ in 0..10_000 {
            let prev = self.cron.find_previous_occurrence(&at, inclusive).ok()?;
            inclusive = false;
            if self.fires_at(&prev) {
                return Some(prev.timestamp() as f64);
            }
            at = prev;
        }
        None
    }
}

/// The run id of a schedule's tick: `sched:<name>:<tick, UTC ISO 8601 seconds>`.
pub fn tick_run_id(name: &str, tick: f64) -> String {
    let at = epoch(tick).unwrap_or_default();
    format!("sched:{name}:{}", at.format("%Y-%m-%dT%H:%M:%SZ"))
}

/// The tick a schedule's run was started for, read from its id: the
/// `<tick>` of `sched:<name>:<tick>`, or the time of the ULID of a manual
/// trigger's `sched:<name>:manual:<ULID>`; `None` for other ids.
pub fn scheduled_time_of(run_id: &str) -> Option<f64> {
    let rest = run_id.strip_prefix("sched:")?;
    if let Some((_, id)) = rest.rsplit_once(":manual:") {
        let ulid = ulid::Ulid::from_string(id).ok()?;
        return Some(ulid.timestamp_ms() as f64 / 1000.0);
    }
    let tick = rest.get(rest.len().checked_sub(20)?..)?;
    DateTime::parse_from_rfc3339(tick)
        .ok()
        .map(|t| t.timestamp() as f64)
}

/// Checks a schedule's name: it becomes part of its runs' ids.
pub fn check_name(name: &str) -> CoreResult<()> {
    let ok = !name.is_empty()
        && name.chars().count() <= 100
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.@/".contains(c));
    if ok {
        Ok(())
    } else {
        Err(CoreError::Config(format!(
            "schedule name {name:?} must be 1 to 100 letters, digits and - _ . @ / -- it is part \
             of the id of every run the schedule starts; pass name=..."
        )))
    }
}

/// What a worker fires for a due schedule: the ticks (oldest first) and
/// the next fire after them.
#[derive(Debug, Clone, PartialEq)]
pub struct Firing {
    pub row: ScheduleRow,
    pub ticks: Vec<f64>,
    pub next_fire: Option<f64>,
}

/// The ticks of `row` to fire at `now` by its catchup, or `None` when it
/// is not due. The next fire is computed from the latest tick passed, so a
/// clock that jumps back never fires a tick twice.
pub fn firing(row: &ScheduleRow, now: f64) -> CoreResult<Option<Firing>> {
    let Some(due) = row.next_fire.filter(|t| *t <= now + 1e-6) else {
        return Ok(None);
    };
    if row.paused {
        return Ok(None);
    }
    let spec = parse(&row.cron, &row.timezone)?;
    let latest = spec.latest_at(now).filter(|t| *t >= due).unwrap_or(due);
    let on_time = now - latest <= ON_TIME;
    let ticks = match row.catchup.as_str() {
        "all" => {
            let mut ticks = vec![due];
            while ticks.len() < MAX_CATCHUP {
                match spec.next_after(ticks[ticks.len() - 1]) {
                    Some(t) if t <= latest => ticks.push(t),
                    _ => break,
                }
            }
            ticks
        }
        "none" if !on_time => Vec::new(),
        _ => vec![latest],
    };
    Ok(Some(Firing {
        row: row.clone(),
        ticks,
        next_fire: spec.next_after(latest),
    }))
}

/// Creates or updates a schedule (`row`'s definition); a new schedule, or
/// one whose pattern or zone changed, fires next at its first tick after
/// now. Returns the stored row.
pub fn declare(store: &dyn Store, row: &ScheduleRow) -> CoreResult<ScheduleRow> {
    check_name(&row.name)?;
    if !CATCHUPS.contains(&row.catchup.as_str()) {
        return Err(CoreError::Config(format!(
            "catchup must be \"latest\", \"none\" or \"all\", got {:?}",
            row.catchup
        )));
    }
    let spec = parse(&row.cron, &row.timezone)?;
    let now = clock::now();
    let mut row = row.clone();
    row.next_fire = spec.next_after(now);
    row.created_at = crate::time::now();
    row.updated_at = row.created_at;
    store.save_schedule(&row)
}

/// Resumes or pauses `name`; a resumed schedule fires next at its first
/// tick after now (ticks passed while paused are not fired).
pub fn set_paused(store: &dyn Store, name: &str, paused: bool) -> CoreResult<()> {
    let row = store
        .schedules(Some(name))?
        .pop()
        .ok_or_else(|| unknown(name))?;
    let next = if paused {
        row.next_fire
    } else {
        parse(&row.cron, &row.timezone)?.next_after(clock::now())
    };
    store.set_schedule_paused(name, paused, next)?;
    Ok(())
}

/// The error for a schedule name the store does not hold.
pub fn unknown(name: &str) -> CoreError {
    CoreError::Config(format!(
        "no schedule named '{name}' -- `compose schedules` lists them; a schedule is created by \
         compose.schedule(...)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> f64 {
        DateTime::parse_from_rfc3339(s).unwrap().timestamp() as f64
    }

    #[test]
    fn bad_patterns_name_the_field() {
        let err = |c: &str| parse(c, "UTC").err().unwrap().to_string();
        assert!(err("0 0 * * * *").contains("6 fields"));
        assert!(err("61 * * * *").contains("minute field"));
        assert!(err("* 24 * * *").contains("hour field"));
        assert!(err("0 0 30 FEB *").contains("never fires"));
        assert!(err("* * * FOO *").contains("month field"));
        assert!(parse("0 9 * * MON-FRI", "Europe/Paris").is_ok());
        assert!(parse("@daily", "UTC").is_ok());
        assert!(parse("*/15 * * * *", "Mars/Olympus").is_err());
    }

    #[test]
    fn ticks_in_a_zone_skip_a_missing_local_time_and_fire_a_repeated_one_once() {
        // 2026-03-29: Paris jumps from 02:00 to 03:00.
        let spec = parse("30 2 * * *", "Europe/Paris").unwrap();
        let next = spec.next_after(ts("2026-03-28T12:00:00Z")).unwrap();
        assert_eq!(next, ts("2026-03-30T00:30:00Z"));
        // 2026-10-25: Paris goes back from 03:00 to 02:00; 02:30 occurs twice.
        let first = spec.next_after(ts("2026-10-24T12:00:00Z")).unwrap();
        assert_eq!(first, ts("2026-10-25T00:30:00Z"));
        assert_eq!(spec.next_after(first).unwrap(), ts("2026-10-26T01:30:00Z"));
        let every = parse("*/30 * * * *", "Europe/Paris").unwrap();
        let mut t = ts("2026-10-24T23:45:00Z");
        let mut seen = Vec::new();
        for _ in 0..6 {
            t = every.next_after(t).unwrap();
            seen.push(t);
        }
        // 00:00Z 02:00 local, 00:30Z 02:30, 01:00Z 02:00 again (skipped), ...
        assert_eq!(seen[0], ts("2026-10-25T00:00:00Z"));
        assert_eq!(seen[1], ts("2026-10-25T00:30:00Z"));
        assert_eq!(seen[2], ts("2026-10-25T02:00:00Z"));
    }

    fn row(catchup: &str, next: f64) -> ScheduleRow {
        ScheduleRow {
            name: "s".into(),
            cron: "* * * * *".into(),
            timezone: "UTC".into(),
            catchup: catchup.into(),
            next_fire: Some(next),
            ..Default::default()
        }
    }

    #[test]
    fn catchup_after_three_missed_ticks() {
        let due = ts("2026-01-01T00:01:00Z");
        let now = ts("2026-01-01T00:03:30Z");
        let all = firing(&row("all", due), now).unwrap().unwrap();
        assert_eq!(all.ticks, vec![due, due + 60.0, due + 120.0]);
        assert_eq!(all.next_fire, Some(due + 180.0));
        let latest = firing(&row("latest", due), now).unwrap().unwrap();
        assert_eq!(latest.ticks, vec![due + 120.0]);
        let none = firing(&row("none", due), now).unwrap().unwrap();
        assert!(none.ticks.is_empty());
        assert_eq!(none.next_fire, Some(due + 180.0));
        let on_time = firing(&row("none", due), due + 0.2).unwrap().unwrap();
        assert_eq!(on_time.ticks, vec![due]);
        assert!(firing(&row("latest", due), due - 1.0).unwrap().is_none());
        assert_eq!(tick_run_id("s", due), "sched:s:2026-01-01T00:01:00Z");
        assert_eq!(scheduled_time_of("sched:s:2026-01-01T00:01:00Z"), Some(due));
        assert_eq!(scheduled_time_of("order-7"), None);
    }
}
