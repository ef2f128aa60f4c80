//! The engine clock (EXT-12): wall time, or a fake one set by tests, and
//! the wake-up every blocked wait of this process sleeps on.

use parking_lot::{Condvar, Mutex};
use std::time::Duration;

struct Clock {
    /// The fake time in seconds since the epoch, when one is installed.
    fake: Option<f64>,
    /// Bumped on every change that may let a blocked wait proceed (the
    /// fake clock moved, this process sent a signal or a cancel request).
    epoch: u64,
}

static CLOCK: Mutex<Clock> = Mutex::new(Clock {
    fake: None,
    epoch: 0,
});
static TICK: Condvar = Condvar::new();

/// Engine time in seconds since the epoch (UTC).
pub fn now() -> f64 {
    CLOCK.lock().fake.unwrap_or_else(crate::time::now)
}

pub fn is_fake() -> bool {
    CLOCK.lock().fake.is_some()
}

/// Installs (`Some`) or removes (`None`) the fake clock.
pub fn set_fake(at: Option<f64>) {
    let mut c = CLOCK.lock();
    c.fake = at;
    c.epoch += 1;
    TICK.notify_all();
}

/// Moves the fake clock forward; refused without one.
pub fn advance(seconds: f64) -> bool {
    let mut c = CLOCK.lock();
    let Some(t) = c.fake else {
        return false;
    };
    c.fake = Some(t + seconds.max(0.0));
    c.epoch += 1;
    TICK.notify_all();
    true
}

/// Changes whenever a wait of this process may be able to proceed.
pub fn epoch() -> u64 {
    CLOCK.lock().epoch
}

/// Wakes every wait of this process to look again.
pub fn poke() {
    CLOCK.lock().epoch += 1;
    TICK.notify_all();
}

/// Sleeps until engine time `deadline`, a `poke`, or `slice` of real time,
/// whichever comes first (with a fake clock, an advance is a poke).
/// Returns whether a poke ended it.
pub fn nap(deadline: Option<f64>, slice: Duration) -> bool {
    let mut c = CLOCK.lock();
    let start = c.epoch;
    let mut limit = slice;
    if let (Some(d), None) = (deadline, c.fake) {
        let left = d - crate::time::now();
        if left <= 0.0 {
            return false;
        }
        limit = limit.min(Duration::from_secs_f64(left));
    }
    if c.fake.is_some_and(|t| deadline.is_some_and(|d| d <= t)) {
        return false;
    }
    let _ = TICK.wait_while_for(&mut c, |c| c.epoch == start, limit);
    c.epoch != start
}

/// Seconds since the epoch as ISO-8601 UTC with microseconds,
/// `2026-12-01T09:00:00.000000+00:00` (what Python's `isoformat` reads).
pub fn iso(t: f64) -> String {
    let micros = (t * 1e6).round() as i64;
    let secs = micros.div_euclid(1_000_000);
    let frac = micros.rem_euclid(1_000_000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{frac:06}+00:00",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Parses what `iso` writes (the fraction optional, `Z` or `+00:00`).
pub fn parse_iso(s: &str) -> Option<f64> {
    let s = s.trim_matches('"');
    let b = s.as_bytes();
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &s[19..];
    let mut micros = 0i64;
    if let Some(f) = rest.strip_prefix('.') {
        let digits: String = f.chars().take_while(|c| c.is_ascii_digit()).collect();
        rest = &f[digits.len()..];
        let padded = format!("{digits:0<6}");
        micros = padded.get(..6)?.parse().ok()?;
    }
    if !(rest.is_empty() || rest == "Z" || rest == "+00:00") {
        return None;
    }
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + sec;
    Some((secs * 1_000_000 + micros) as f64 / 1e6)
}

// Howard Hinnant's civil-calendar conversions.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_round_trips_and_matches_known_dates() {
        assert_eq!(iso(0.0), "1970-01-01T00:00:00.000000+00:00");
        assert_eq!(iso(1_796_115_600.5), "2026-12-01T09:00:00.500000+00:00");
        assert_eq!(iso(951_782_400.0), "2000-02-29T00:00:00.000000+00:00");
        for t in [0.0, 1_796_115_600.123456, 4_102_444_800.0, 1e9 + 0.25] {
            assert_eq!(parse_iso(&iso(t)), Some((t * 1e6).round() / 1e6));
        }
        assert_eq!(parse_iso("2026-12-01T09:00:00Z"), Some(1_796_115_600.0));
        assert_eq!(
            parse_iso("\"2026-12-01T09:00:00.5+00:00\""),
            Some(1_796_115_600.5)
        );
        assert_eq!(parse_iso("2026-12-01 09:00"), None);
        assert_eq!(parse_iso("2026-12-01T09:00:00+02:00"), None);
    }
}
